//! The message view: a dead-lettered copy's headers and body, read back from the broker's
//! dead letters, bounded, escaped and redacted.
//!
//! Viewing settles nothing: the copies read are given back at once
//! ([`DeadLetters::give_back`]). The console stores nothing per message.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use dedup_brokers::replay::{DeadLetter, DeadLetters, REPLAY_BATCH};
use dedup_core::{Record, Status, Timestamp};
use serde::Serialize;

use crate::html::esc;
use crate::model::KeyDetail;
use crate::state::Inner;

/// Bytes of a body the view shows; the rest is counted, not shown.
pub const BODY_LIMIT: usize = 4096;

/// Bytes of one header value the view shows.
pub const HEADER_LIMIT: usize = 1024;

/// How long one page waits for a broker (to connect, read, give back) before it says the
/// broker is unreachable.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// The redaction hook: it gets a copy's headers and whole payload before they are shown,
/// and masks what an operator must not see.
pub type Redact = Arc<dyn Fn(&mut Vec<(String, String)>, &mut Vec<u8>) + Send + Sync>;

/// Where each consumer's dead letters are, and the redaction hook.
#[derive(Clone, Default)]
pub(crate) struct DeadLetterConfig {
    /// Consumer to dead-letter URL (`dedup_brokers::replay::open`).
    pub(crate) urls: BTreeMap<String, String>,
    pub(crate) redact: Option<Redact>,
}

/// The dead-lettered copy of a key, as `/api/key` returns it (`message`).
#[derive(Clone, Debug, Serialize)]
pub struct Message {
    /// `shown` (the copy was read), `not-dead-lettered` (the key's status has no copy),
    /// `no-broker` (no dead letters configured for the consumer), `unreachable` (they could
    /// not be read), or `not-found` (no copy among the dead letters read).
    pub state: &'static str,
    /// Why no copy is shown (every state but `shown`).
    pub reason: Option<String>,
    /// The dead letters read (`Redis stream "orders:dead"`), when they were.
    pub source: Option<String>,
    /// Where a replay would publish the copy.
    pub origin: Option<String>,
    /// Its headers, failure headers included, each value at most [`HEADER_LIMIT`] bytes.
    pub headers: Vec<(String, String)>,
    /// Its payload, at most [`BODY_LIMIT`] bytes of it.
    pub body: Option<Body>,
    /// Whether the console's redaction hook ran over the copy.
    pub redacted: bool,
}

/// The shown part of a payload.
#[derive(Clone, Debug, Serialize)]
pub struct Body {
    /// The payload's whole size, in bytes.
    pub size: usize,
    /// `utf-8` when the whole payload is valid UTF-8, else `hex`.
    pub encoding: &'static str,
    /// The first bytes: text, or hex lines of 16 bytes with their offsets.
    pub text: String,
    /// Bytes not shown.
    pub more: usize,
}

impl Message {
    fn missing(state: &'static str, reason: String, source: Option<String>) -> Message {
        Message {
            state,
            reason: Some(reason),
            source,
            origin: None,
            headers: Vec::new(),
            body: None,
            redacted: false,
        }
    }

    /// The message of a key whose status (`status`) leaves no copy with the broker.
    pub(crate) fn not_dead_lettered(status: &str) -> Message {
        let why = format!(
            "the key is {status}: only a dead-lettered key has a copy among the dead letters"
        );
        Message::missing("not-dead-lettered", why, None)
    }

    /// `letter` as shown: redacted by `redact`, then bounded.
    fn shown(letter: DeadLetter, source: &str, redact: Option<&Redact>) -> Message {
        let mut headers = letter.headers;
        let mut payload = letter.payload.to_vec();
        if let Some(r) = redact {
            r(&mut headers, &mut payload);
        }
        Message {
            state: "shown",
            reason: None,
            source: Some(source.to_owned()),
            origin: Some(letter.origin),
            headers: headers
                .into_iter()
                .map(|(n, v)| (n, bounded(&v, HEADER_LIMIT)))
                .collect(),
            body: Some(body(&payload)),
            redacted: redact.is_some(),
        }
    }
}

/// `text` cut at `limit` bytes (on a character boundary), saying how much was cut.
fn bounded(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} … ({} more bytes)", &text[..end], text.len() - end)
}

/// The first [`BODY_LIMIT`] bytes of `payload`: as text when it is UTF-8, else as hex.
pub(crate) fn body(payload: &[u8]) -> Body {
    let (text, shown, encoding) = match std::str::from_utf8(payload) {
        Ok(s) => {
            let mut end = s.len().min(BODY_LIMIT);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            (s[..end].to_owned(), end, "utf-8")
        }
        Err(_) => {
            let head = &payload[..payload.len().min(BODY_LIMIT)];
            (hex(head), head.len(), "hex")
        }
    };
    Body {
        size: payload.len(),
        encoding,
        text,
        more: payload.len() - shown,
    }
}

/// `bytes` as lines of 16, each with its offset: `00000010  7b 22 69 64 ...`.
fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 3 + bytes.len() / 16 * 11);
    for (i, line) in bytes.chunks(16).enumerate() {
        let _ = write!(out, "{:08x} ", i * 16);
        for b in line {
            let _ = write!(out, " {b:02x}");
        }
        out.push('\n');
    }
    out
}

/// What reading a consumer's dead letters found: where they are, and the copies of the
/// ids asked for.
pub(crate) struct Found {
    pub(crate) source: String,
    pub(crate) copies: BTreeMap<String, DeadLetter>,
}

/// Why a consumer's dead letters could not be read: `(state, reason)`.
pub(crate) type Unread = (&'static str, String);

/// Opens `consumer`'s dead letters, or says why it cannot.
pub(crate) async fn open(inner: &Inner, consumer: &str) -> Result<Box<dyn DeadLetters>, Unread> {
    let Some(url) = inner.dead.urls.get(consumer) else {
        return Err((
            "no-broker",
            format!(
                "this console knows no dead letters for the consumer {consumer} \
                 (Console::with_dead_letters, or dedup console --dead-letters {consumer}=URL)"
            ),
        ));
    };
    let shown = dedup_core::backend::url::redact(url);
    match tokio::time::timeout(BROKER_TIMEOUT, dedup_brokers::replay::open(url)).await {
        Ok(Ok(dead)) => Ok(dead),
        Ok(Err(e)) => Err((
            "unreachable",
            format!(
                "cannot open the dead letters at {shown}: {}",
                dedup_core::error_chain(&e)
            ),
        )),
        Err(_) => Err((
            "unreachable",
            format!("the dead letters at {shown} did not answer within {BROKER_TIMEOUT:?}"),
        )),
    }
}

/// Reads `consumer`'s dead letters until the copies of `ids` are found, at most
/// `max_read` copies, then gives every copy back (nothing is settled).
pub(crate) async fn read(
    inner: &Inner,
    consumer: &str,
    ids: &BTreeSet<String>,
) -> Result<Found, Unread> {
    let mut dead = open(inner, consumer).await?;
    let source = dead.describe();
    let max_read = inner.config.scan_limit;
    let reading = async {
        let mut copies = BTreeMap::new();
        let mut read = 0;
        while read < max_read && copies.len() < ids.len() {
            let batch = dead.take(REPLAY_BATCH.min(max_read - read)).await?;
            if batch.is_empty() {
                break;
            }
            read += batch.len();
            for letter in batch {
                if letter.consumer() != Some(consumer) {
                    continue;
                }
                if let Some(id) = letter.message_id.clone().filter(|id| ids.contains(id)) {
                    copies.entry(id).or_insert(letter);
                }
            }
        }
        let given_back = dead.give_back().await;
        given_back.map(|()| copies)
    };
    match tokio::time::timeout(BROKER_TIMEOUT, reading).await {
        Ok(Ok(copies)) => Ok(Found { source, copies }),
        Ok(Err(e)) => Err((
            "unreachable",
            format!("reading {source}: {}", dedup_core::error_chain(&e)),
        )),
        Err(_) => Err((
            "unreachable",
            format!("{source} did not answer within {BROKER_TIMEOUT:?}"),
        )),
    }
}

/// The messages of `ids` (one consumer's) found, each shown or missing with why.
fn messages(inner: &Inner, ids: &BTreeSet<String>, mut found: Found) -> Vec<(String, Message)> {
    let redact = inner.dead.redact.as_ref();
    ids.iter()
        .map(|id| {
            let m = match found.copies.remove(id) {
                Some(letter) => Message::shown(letter, &found.source, redact),
                None => Message::missing(
                    "not-found",
                    format!(
                        "no copy of {id} among the dead letters read from {} (at most {})",
                        found.source, inner.config.scan_limit
                    ),
                    Some(found.source.clone()),
                ),
            };
            (id.clone(), m)
        })
        .collect()
}

/// The message of the key `d`: read for a dead-lettered key, else why not.
pub(crate) async fn of_key(inner: &Inner, d: &KeyDetail) -> Message {
    if d.status != Status::DeadLettered.as_str() {
        return Message::not_dead_lettered(d.status);
    }
    let ids = BTreeSet::from([d.message_id.clone()]);
    match read(inner, &d.consumer, &ids).await {
        Ok(found) => messages(inner, &ids, found).remove(0).1,
        Err((state, reason)) => Message::missing(state, reason, None),
    }
}

/// The failure group page's messages: those of the dead-lettered keys of `shown` (the
/// page's keys), read per consumer.
pub(crate) async fn group_section(inner: &Inner, shown: &[&Record], now: Timestamp) -> String {
    let mut by_consumer: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for r in shown {
        if Status::of(r, now) == Status::DeadLettered {
            let ids = by_consumer.entry(r.key.consumer()).or_default();
            ids.insert(r.key.message_id().to_owned());
        }
    }
    if by_consumer.is_empty() {
        return String::new();
    }
    let mut b = "<section id=messages><h2>Dead-lettered messages</h2>".to_owned();
    for (consumer, ids) in by_consumer {
        match read(inner, consumer, &ids).await {
            Ok(found) => {
                for (id, m) in messages(inner, &ids, found) {
                    let _ = write!(
                        b,
                        "<details class=message data-id=\"{}\"{}><summary>{} · {}</summary>{}</details>",
                        esc(&id),
                        if b.contains("<details") { "" } else { " open" },
                        esc(consumer),
                        esc(&id),
                        html(&m)
                    );
                }
            }
            Err((state, reason)) => {
                let _ = write!(
                    b,
                    "<p class=warn data-state=\"{state}\">No message of {} shown: {}</p>",
                    esc(consumer),
                    esc(&reason)
                );
            }
        }
    }
    b.push_str("</section>");
    b
}

/// The message's HTML: its source and origin, its headers, its body (escaped).
pub(crate) fn html(m: &Message) -> String {
    let Some(body) = &m.body else {
        return format!(
            "<p class=warn id=message-missing data-state=\"{}\">No message shown: {}</p>",
            m.state,
            esc(m.reason.as_deref().unwrap_or(""))
        );
    };
    let mut b = format!(
        "<p class=note id=message-source>Read from {} (given back: viewing settles nothing); \
         a replay publishes it to {}{}.</p><table class=message-headers><tr><th>header</th>\
         <th>value</th></tr>",
        esc(m.source.as_deref().unwrap_or("")),
        esc(m.origin.as_deref().unwrap_or("")),
        if m.redacted { "; redacted" } else { "" }
    );
    for (n, v) in &m.headers {
        let _ = write!(b, "<tr><th>{}</th><td>{}</td></tr>", esc(n), esc(v));
    }
    if m.headers.is_empty() {
        b.push_str("<tr><td colspan=2>no header</td></tr>");
    }
    let more = match body.more {
        0 => String::new(),
        n => format!(", the first {} shown, {n} more not shown", body.size - n),
    };
    let _ = write!(
        b,
        "</table><p class=note>Body: {} bytes, {}{more}.</p><pre class=message-body>{}</pre>",
        body.size,
        body.encoding,
        esc(&body.text)
    );
    b
}

/// The key page's message section.
pub(crate) fn key_section(m: &Message) -> String {
    format!(
        "<section id=message><h2>Dead-lettered message</h2>{}</section>",
        html(m)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_bodies_as_text_or_hex() {
        let b = body("héllo".as_bytes());
        assert_eq!((b.encoding, b.text.as_str(), b.more), ("utf-8", "héllo", 0));
        // The limit falls inside an `é`: the cut is before it.
        let long = format!("a{}", "é".repeat(BODY_LIMIT));
        let b = body(long.as_bytes());
        assert_eq!(b.text.len(), BODY_LIMIT - 1, "cut on a character boundary");
        assert_eq!(b.more, long.len() - (BODY_LIMIT - 1));
        let b = body(&[0xff, 0x00, 0x41]);
        assert_eq!(
            (b.encoding, b.text.as_str()),
            ("hex", "00000000  ff 00 41\n")
        );
        let b = body(&[0xff; BODY_LIMIT + 5]);
        assert_eq!((b.size, b.more), (BODY_LIMIT + 5, 5));
        assert_eq!(b.text.lines().count(), BODY_LIMIT / 16);
        assert_eq!(bounded("abcdef", 4), "abcd … (2 more bytes)");
    }
}
