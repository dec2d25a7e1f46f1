//! The layout of the store's data in a bucket: which subject holds which dedup record (and
//! back), and the bytes of a record value.
//!
//! **Keys.** The record of `(consumer, message_id)` is the bucket key
//! `<prefix>.<consumer>.<message_id>`, the subject `$KV.<bucket>.<prefix>.<consumer>.<message_id>`.
//! Each part keeps ASCII letters, digits, `_` and `-`, and writes every other byte as `=`
//! and two upper-case hex digits (`.` is `=2E`, `=` is `=3D`). The encoding is injective
//! and never yields an empty token, a `.`, `*` or `>`. The last purge run is the key
//! `<prefix>.purge-run`: one token after the prefix, so no record's.
//!
//! **Record value** (layout 1), little-endian:
//!
//! ```text
//! 1 u8 layout | state u8 ('I' in flight, 'C' completed) | fence u64 | attempt u32
//! | time i64 (expiry in flight, processing time completed; ms since the epoch)
//! | first claim i64 (i64::MIN: unknown) | token: u8 flag, 16 bytes
//! | fingerprint: u8 flag, u16 length, bytes | failure: u8 flag, u16 length, bytes
//! | outcome: u8 flag, the rest
//! ```

use dedup_core::{Key, Record, RecordState};

/// The layout byte this version writes and reads.
pub(crate) const LAYOUT: u8 = 1;
/// State byte of an in-flight record.
pub(crate) const IN_FLIGHT: u8 = b'I';
/// State byte of a completed record.
pub(crate) const COMPLETED: u8 = b'C';
/// "Unknown" in the first-claim field.
pub(crate) const NO_TIME: i64 = i64::MIN;

/// The subjects of one store: its bucket's stream and its prefix.
#[derive(Clone, Debug)]
pub(crate) struct Subjects {
    /// `$KV.<bucket>.<prefix>.`
    head: String,
}

impl Subjects {
    /// The subjects of `prefix` in `bucket` (both already validated tokens).
    pub(crate) fn new(bucket: &str, prefix: &str) -> Self {
        Subjects {
            head: format!("$KV.{bucket}.{prefix}."),
        }
    }

    /// The subject of `key`'s record.
    pub(crate) fn record(&self, key: &Key) -> String {
        let mut out = String::with_capacity(self.head.len() + 2 * key.message_id().len() + 16);
        out.push_str(&self.head);
        encode_into(&mut out, key.consumer());
        out.push('.');
        encode_into(&mut out, key.message_id());
        out
    }

    /// The filter matching every record of the store.
    pub(crate) fn all_records(&self) -> String {
        format!("{}*.*", self.head)
    }

    /// The filter matching every record of `consumer`.
    pub(crate) fn consumer_records(&self, consumer: &str) -> String {
        let mut out = self.head.clone();
        encode_into(&mut out, consumer);
        out.push_str(".*");
        out
    }

    /// The subject of the store's last purge run.
    pub(crate) fn purge_run(&self) -> String {
        format!("{}purge-run", self.head)
    }

    /// The key a record subject of this store holds; `None` for any other subject.
    pub(crate) fn key_of(&self, subject: &str) -> Option<Key> {
        let rest = subject.strip_prefix(&self.head)?;
        let (consumer, message_id) = rest.split_once('.')?;
        Key::new(decode_part(consumer)?, decode_part(message_id)?).ok()
    }
}

/// Append `part` to `out`, encoded as the key layout says.
fn encode_into(out: &mut String, part: &str) {
    for b in part.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push('=');
            out.push_str(&format!("{b:02X}"));
        }
    }
}

/// Undo [`encode_into`]; `None` when `part` is no encoded part.
fn decode_part(part: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(part.len());
    let mut rest = part.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'=' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// The value `record` is stored as.
pub(crate) fn encode(record: &Record) -> Vec<u8> {
    let (state, time, token) = match &record.state {
        RecordState::InFlight { token, expires_at } => {
            (IN_FLIGHT, expires_at.as_millis(), Some(*token))
        }
        RecordState::Completed {
            token,
            processed_at,
            ..
        } => (COMPLETED, processed_at.as_millis(), *token),
    };
    let mut out = Vec::with_capacity(64);
    out.extend([LAYOUT, state]);
    out.extend(record.fence.to_le_bytes());
    out.extend(record.attempt.to_le_bytes());
    out.extend(time.to_le_bytes());
    let first = record.first_claimed_at.map_or(NO_TIME, |t| t.as_millis());
    out.extend(first.to_le_bytes());
    out.push(u8::from(token.is_some()));
    out.extend(token.map_or([0; 16], |t| t.as_uuid().into_bytes()));
    let fingerprint = record.fingerprint.as_ref().map(|f| f.as_str().as_bytes());
    short_field(&mut out, fingerprint);
    let failure = record.last_failure.as_ref().map(|f| f.encode());
    short_field(&mut out, failure.as_deref());
    match &record.state {
        RecordState::Completed {
            outcome: Some(o), ..
        } => {
            out.push(1);
            out.extend(o);
        }
        _ => out.push(0),
    }
    out
}

/// A flag, then a u16 length and the bytes when present (inputs are bounded far below
/// 64 KiB by the front door's checks).
fn short_field(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        Some(b) => {
            out.push(1);
            let len = u16::try_from(b.len()).expect("fingerprints and failures are short");
            out.extend(len.to_le_bytes());
            out.extend(b);
        }
        None => out.push(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_subjects() {
        let subjects = Subjects::new("b", "p");
        for (c, m) in [
            ("billing", "order-1"),
            ("a.b", "x=y"),
            ("*", ">"),
            ("é", " "),
            ("=2E", "."),
        ] {
            let key = Key::new(c, m).unwrap();
            let subject = subjects.record(&key);
            assert_eq!(subject.matches('.').count(), 4, "{subject}");
            assert!(!subject.contains(['*', '>', ' ']), "{subject}");
            assert_eq!(subjects.key_of(&subject), Some(key));
        }
        assert_eq!(
            subjects.record(&Key::new("a.b", "x=y").unwrap()),
            "$KV.b.p.a=2Eb.x=3Dy"
        );
        assert_eq!(subjects.key_of(&subjects.purge_run()), None);
        assert_eq!(subjects.key_of("$KV.b.q.a.b"), None);
        assert_eq!(subjects.key_of("$KV.b.p.a=Z1.b"), None);
    }
}
