//! [`Failure`]: why one attempt at a key failed, as it is kept on the key's record.
//!
//! One encoding, written and read only here, so every backend stores the same bytes
//! (a nullable column on the SQL backends, a field of the packed value on Redis, and inside
//! the reserved outcome of a failed or dead-lettered key, see [`Verdict`](crate::Verdict)):
//!
//! `1` then length-prefixed fields, each `<decimal byte length>:<bytes>`, in this order:
//! when (milliseconds since the Unix epoch, decimal), the attempt (decimal), the kind, the
//! worker's name (empty: none), then each link of the error chain, outermost first.
//! The encoding of a failure is at most [`MAX_FAILURE_LEN`] bytes: [`Failure::of_error`]
//! cuts the chain to fit, and stores refuse a larger one with
//! [`Error::InvalidInput`](crate::Error::InvalidInput).

use std::fmt;

use crate::{Error, Result, Timestamp};

/// Largest encoded [`Failure`] a store keeps, in bytes (4 KiB).
pub const MAX_FAILURE_LEN: usize = 4 * 1024;

/// Most links of an error chain [`Failure::of_error`] keeps: the first ones and the root
/// cause.
pub const MAX_FAILURE_LINKS: usize = 8;

/// Longest kind and worker name, in bytes.
const MAX_LABEL_LEN: usize = 128;

/// The encoding's version tag (the first byte).
const VERSION: u8 = b'1';

/// Why one attempt at a key failed: the error's kind, the message of each link of its
/// source chain, when, which attempt, and the worker's name if it was set.
///
/// The [`Inbox`](crate::Inbox) and the SQL backends' transactional inboxes store one on the
/// key's record for every failed attempt (see [`DedupStore::release_failed`] and
/// [`Verdict`](crate::Verdict)); an operator reads it with
/// [`Record::failure`](crate::Record::failure) or `dedup inspect`.
///
/// [`DedupStore::release_failed`]: crate::DedupStore::release_failed
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// What failed, one of a few fixed words (bounded, so it is also a metrics label):
    /// `handler` (the handler returned an error), `transient` (an error it marked
    /// [`Transient`](crate::Transient), its in-process retries used up), `panic`, `outcome`
    /// (its outcome could not be stored), `store` (the store failed during the attempt),
    /// `conflict` (a transactional inbox's transaction was refused over a conflict with a
    /// concurrent one, a deadlock or a serialization failure, on every run of the attempt:
    /// see [`InboxError::Conflict`](crate::InboxError::Conflict)), `attempts` (no attempt
    /// left: a dead letter after attempts that crashed or timed out without an error).
    pub kind: String,
    /// The error's message, then the message of each of its sources, outermost first.
    pub chain: Vec<String>,
    /// When the attempt failed, by the worker's clock.
    pub at: Timestamp,
    /// The attempt number that failed.
    pub attempt: u32,
    /// The name of the worker that ran it, if one was set
    /// ([`Inbox::with_worker`](crate::Inbox::with_worker)).
    pub worker: Option<String>,
}

impl Failure {
    /// The failure `error` caused at `attempt`, at `at`: its chain read from
    /// [`source`](std::error::Error::source), at most [`MAX_FAILURE_LINKS`] links (the
    /// first ones and the root cause), cut so the encoding fits [`MAX_FAILURE_LEN`].
    pub fn of_error(
        kind: &str,
        error: &(dyn std::error::Error + 'static),
        attempt: u32,
        at: Timestamp,
        worker: Option<&str>,
    ) -> Self {
        let mut chain = links(error);
        if chain.len() > MAX_FAILURE_LINKS {
            let root = chain.pop().unwrap_or_default();
            chain.truncate(MAX_FAILURE_LINKS - 1);
            chain.push(root);
        }
        Failure::new(kind, chain, attempt, at, worker).fit()
    }

    /// A failure from its parts, as given (check it with [`validate`](Self::validate)).
    pub fn new(
        kind: &str,
        chain: Vec<String>,
        attempt: u32,
        at: Timestamp,
        worker: Option<&str>,
    ) -> Self {
        Failure {
            kind: kind.to_owned(),
            chain,
            at,
            attempt,
            worker: worker.map(str::to_owned),
        }
    }

    /// The same failure naming `worker` (or none).
    pub fn with_worker(mut self, worker: Option<&str>) -> Self {
        self.worker = worker.map(str::to_owned);
        self
    }

    /// The same failure, cut to fit: the kind and worker to 128 bytes, then the longest
    /// link halved until the encoding fits [`MAX_FAILURE_LEN`] (on character boundaries).
    pub fn fit(mut self) -> Self {
        cut(&mut self.kind, MAX_LABEL_LEN);
        if let Some(w) = &mut self.worker {
            cut(w, MAX_LABEL_LEN);
        }
        while self.encoded_len() > MAX_FAILURE_LEN {
            match self.chain.iter_mut().max_by_key(|l| l.len()) {
                Some(longest) if !longest.is_empty() => {
                    let half = longest.len() / 2;
                    cut(longest, half);
                }
                _ => {
                    self.chain.pop();
                }
            }
        }
        self
    }

    /// The chain as one line: `outer: inner: root`.
    pub fn message(&self) -> String {
        self.chain.join(": ")
    }

    /// Check the failure: its encoding at most [`MAX_FAILURE_LEN`] bytes, a kind of 1 to
    /// 128 bytes, and a worker name, if any, of 1 to 128 bytes.
    pub fn validate(&self) -> Result<()> {
        if self.kind.is_empty() || self.kind.len() > MAX_LABEL_LEN {
            return Err(Error::invalid(
                "failure",
                format!("its kind must be 1 to {MAX_LABEL_LEN} bytes"),
            ));
        }
        if self
            .worker
            .as_ref()
            .is_some_and(|w| w.is_empty() || w.len() > MAX_LABEL_LEN)
        {
            return Err(Error::invalid(
                "failure",
                format!("its worker name must be 1 to {MAX_LABEL_LEN} bytes"),
            ));
        }
        let len = self.encoded_len();
        if len > MAX_FAILURE_LEN {
            return Err(Error::invalid(
                "failure",
                format!("encodes to {len} bytes, at most {MAX_FAILURE_LEN} allowed"),
            ));
        }
        Ok(())
    }

    /// The stored bytes (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.push(VERSION);
        for field in self.fields() {
            out.extend_from_slice(field.len().to_string().as_bytes());
            out.push(b':');
            out.extend_from_slice(field.as_bytes());
        }
        out
    }

    /// Read stored bytes back; `None` when they are not an encoded failure.
    pub fn decode(bytes: &[u8]) -> Option<Failure> {
        let (&version, mut rest) = bytes.split_first()?;
        if version != VERSION {
            return None;
        }
        let mut fields = Vec::new();
        while !rest.is_empty() {
            let colon = rest.iter().position(|b| *b == b':')?;
            let len: usize = std::str::from_utf8(&rest[..colon]).ok()?.parse().ok()?;
            let body = rest.get(colon + 1..colon + 1 + len)?;
            fields.push(String::from_utf8_lossy(body).into_owned());
            rest = &rest[colon + 1 + len..];
        }
        let mut fields = fields.into_iter();
        let at = Timestamp::from_millis(fields.next()?.parse().ok()?);
        let attempt = fields.next()?.parse().ok()?;
        let kind = fields.next()?;
        let worker = Some(fields.next()?).filter(|w| !w.is_empty());
        Some(Failure {
            kind,
            chain: fields.collect(),
            at,
            attempt,
            worker,
        })
    }

    /// The fields in stored order.
    fn fields(&self) -> impl Iterator<Item = std::borrow::Cow<'_, str>> {
        [
            self.at.as_millis().to_string().into(),
            self.attempt.to_string().into(),
            self.kind.as_str().into(),
            self.worker.as_deref().unwrap_or("").into(),
        ]
        .into_iter()
        .chain(self.chain.iter().map(|l| l.as_str().into()))
    }

    /// The length of [`encode`](Self::encode)'s bytes.
    pub fn encoded_len(&self) -> usize {
        1 + self
            .fields()
            .map(|f| f.len().to_string().len() + 1 + f.len())
            .sum::<usize>()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} error at attempt {}", self.kind, self.attempt)?;
        if let Some(worker) = &self.worker {
            write!(f, " on {worker}")?;
        }
        write!(f, " ({}): {}", self.at, self.message())
    }
}

/// Cut `text` to at most `max` bytes on a character boundary.
fn cut(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// An error's message followed by its sources' (`outer: inner: root`), for log lines; a
/// source whose message its outer error already ends with is said once (see [`Failure`]'s
/// chain).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    links(e).join(": ")
}

/// The message of `e` and of each of its sources, outermost first, without the sources an
/// outer message already ends with: many errors print their source in their own message
/// (`error returned from database: {0}`, `error communicating with database: {0}`) and
/// also return it from `source()`, which would say the same words twice.
fn links(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut chain = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !chain.last().is_some_and(|outer| outer.ends_with(&text)) {
            chain.push(text);
        }
        source = s.source();
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Link(String, #[source] Option<Box<Link>>);

    fn chain(n: usize, len: usize) -> Link {
        (0..n).fold(Link("root".to_owned(), None), |inner, i| {
            Link(format!("{i}").repeat(len), Some(Box::new(inner)))
        })
    }

    #[test]
    fn failures_round_trip() {
        let f = Failure::of_error(
            "handler",
            &chain(2, 3),
            5,
            Timestamp::from_millis(1_700_000_000_000),
            Some("billing-7"),
        );
        assert_eq!(f.chain, vec!["111", "000", "root"]);
        assert_eq!(Failure::decode(&f.encode()), Some(f.clone()));
        assert_eq!(f.encode().len(), f.encoded_len());
        let anonymous = Failure::new("panic", vec![], 1, Timestamp::EPOCH, None);
        assert_eq!(Failure::decode(&anonymous.encode()), Some(anonymous));
        assert_eq!(Failure::decode(b"2junk"), None);
        assert_eq!(Failure::decode(b"13:abc"), None);
        assert_eq!(Failure::decode(b""), None);
    }

    /// An error that prints its source in its own message, as sqlx's do.
    #[derive(Debug, thiserror::Error)]
    #[error("error returned from database: {0}")]
    struct Wraps(#[source] Link);

    #[test]
    fn a_source_its_outer_message_already_says_is_kept_once() {
        let e = Wraps(Link("a CHECK violation".to_owned(), None));
        let f = Failure::of_error("handler", &e, 1, Timestamp::EPOCH, None);
        assert_eq!(
            f.chain,
            vec!["error returned from database: a CHECK violation"]
        );
        assert_eq!(
            error_chain(&e),
            "error returned from database: a CHECK violation"
        );
        let outer = Link(
            "consume failed".to_owned(),
            Some(Box::new(Link("0".repeat(3), None))),
        );
        assert_eq!(error_chain(&outer), "consume failed: 000");
    }

    #[test]
    fn long_chains_are_cut_to_fit_keeping_the_root() {
        let f = Failure::of_error("handler", &chain(20, 2000), 1, Timestamp::EPOCH, None);
        assert!(f.encoded_len() <= MAX_FAILURE_LEN);
        assert!(f.validate().is_ok());
        assert_eq!(f.chain.len(), MAX_FAILURE_LINKS);
        assert!(f.chain.last().unwrap().starts_with("root"));
        let big = Failure::new("handler", vec!["x".repeat(5000)], 1, Timestamp::EPOCH, None);
        assert!(big.validate().unwrap_err().is_invalid_input());
        assert!(big.fit().validate().is_ok());
    }
}
