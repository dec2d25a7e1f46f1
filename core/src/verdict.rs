//! [`Verdict`]: how the [`Inbox`](crate::Inbox) writes its own verdicts (a stored failure, a
//! dead letter) into a completed key's outcome bytes, beside the handlers' outcomes, and how
//! anyone reads them back.
//!
//! A handler's outcome is stored as it is, byte for byte (so records written by a store
//! user directly and by the Inbox read the same). The Inbox's verdicts start with a reserved
//! prefix, `\0dedup:`, which a handler's outcome may not start with:
//! - `\0dedup:failed:1\0` + the encoded [`Failure`] (written now);
//! - `\0dedup:dead-letter:1\0` + the number of attempts used (decimal) + `\0` + the encoded
//!   [`Failure`] of the last failed attempt, or nothing when none was kept (written now);
//! - `\0dedup:failed\0` + the failure's message (UTF-8), and `\0dedup:dead-letter\0` + the
//!   number of attempts: the older forms, still read.
//!
//! A backend tells the three states of a completed record apart by the prefixes
//! [`FAILED_PREFIX`] and [`DEAD_LETTER_PREFIX`] alone (a byte-prefix comparison in SQL).

use crate::Failure;

/// The prefix every verdict starts with, and no handler's outcome may.
pub const RESERVED_PREFIX: &[u8] = b"\0dedup:";
/// The prefix of every stored failure's outcome, old and new forms.
pub const FAILED_PREFIX: &[u8] = b"\0dedup:failed";
/// The prefix of every dead letter's outcome, old and new forms.
pub const DEAD_LETTER_PREFIX: &[u8] = b"\0dedup:dead-letter";

/// [`FAILED_PREFIX`] in hex, for a SQL backend's byte-string literal.
pub const FAILED_PREFIX_HEX: &str = "0064656475703a6661696c6564";
/// [`DEAD_LETTER_PREFIX`] in hex, for a SQL backend's byte-string literal.
pub const DEAD_LETTER_PREFIX_HEX: &str = "0064656475703a646561642d6c6574746572";

const FAILED_V0: &[u8] = b"\0dedup:failed\0";
const FAILED_V1: &[u8] = b"\0dedup:failed:1\0";
const DEAD_LETTER_V0: &[u8] = b"\0dedup:dead-letter\0";
const DEAD_LETTER_V1: &[u8] = b"\0dedup:dead-letter:1\0";

/// What a completed key's outcome bytes hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A handler's outcome: the key was processed.
    Processed(Option<Vec<u8>>),
    /// A handler failure stored as the key's final result
    /// ([`FailurePolicy::Store`](crate::FailurePolicy::Store)).
    Failed {
        /// The failure's message and source chain (`outer: inner: root`).
        message: String,
        /// The failure in full (`None` for records written before causes were kept).
        cause: Option<Failure>,
    },
    /// The key used up its attempts ([`InboxConfig::max_attempts`](crate::InboxConfig)).
    DeadLetter {
        /// The attempts it used.
        attempts: u32,
        /// The last failed attempt's cause, when one was kept.
        cause: Option<Failure>,
    },
}

impl Verdict {
    /// Read the outcome bytes of a completed key.
    pub fn decode(outcome: Option<Vec<u8>>) -> Verdict {
        match outcome {
            Some(bytes) if bytes.starts_with(FAILED_V1) => {
                match Failure::decode(&bytes[FAILED_V1.len()..]) {
                    Some(cause) => Verdict::Failed {
                        message: cause.message(),
                        cause: Some(cause),
                    },
                    None => Verdict::Failed {
                        message: String::from_utf8_lossy(&bytes[FAILED_V1.len()..]).into_owned(),
                        cause: None,
                    },
                }
            }
            Some(bytes) if bytes.starts_with(FAILED_V0) => Verdict::Failed {
                message: String::from_utf8_lossy(&bytes[FAILED_V0.len()..]).into_owned(),
                cause: None,
            },
            Some(bytes) if bytes.starts_with(DEAD_LETTER_V1) => {
                let rest = &bytes[DEAD_LETTER_V1.len()..];
                let (count, cause) = match rest.iter().position(|b| *b == 0) {
                    Some(nul) => (&rest[..nul], Failure::decode(&rest[nul + 1..])),
                    None => (rest, None),
                };
                Verdict::DeadLetter {
                    attempts: parse_count(count),
                    cause,
                }
            }
            Some(bytes) if bytes.starts_with(DEAD_LETTER_V0) => Verdict::DeadLetter {
                attempts: parse_count(&bytes[DEAD_LETTER_V0.len()..]),
                cause: None,
            },
            other => Verdict::Processed(other),
        }
    }

    /// The bytes a failure stored as the key's result is kept as.
    pub fn failed(cause: &Failure) -> Vec<u8> {
        [FAILED_V1, &cause.encode()].concat()
    }

    /// The bytes a dead letter after `attempts` attempts is kept as, with the last failed
    /// attempt's cause if one was kept.
    pub fn dead_letter(attempts: u32, cause: Option<&Failure>) -> Vec<u8> {
        let mut out = [DEAD_LETTER_V1, attempts.to_string().as_bytes()].concat();
        if let Some(cause) = cause {
            out.push(0);
            out.extend_from_slice(&cause.encode());
        }
        out
    }

    /// Whether a handler's outcome starts with the reserved prefix (and would be misread).
    pub fn is_reserved(outcome: Option<&[u8]>) -> bool {
        outcome.is_some_and(|o| o.starts_with(RESERVED_PREFIX))
    }

    /// The cause this verdict keeps, if any.
    pub fn cause(&self) -> Option<&Failure> {
        match self {
            Verdict::Processed(_) => None,
            Verdict::Failed { cause, .. } | Verdict::DeadLetter { cause, .. } => cause.as_ref(),
        }
    }
}

fn parse_count(bytes: &[u8]) -> u32 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MAX_OUTCOME_LEN, Timestamp};

    fn cause() -> Failure {
        Failure::new(
            "handler",
            vec!["card declined".into(), "code 51".into()],
            3,
            Timestamp::from_millis(7),
            Some("w1"),
        )
    }

    #[test]
    fn verdicts_round_trip_and_outcomes_stay_byte_for_byte() {
        assert_eq!(
            Verdict::decode(Some(Verdict::failed(&cause()))),
            Verdict::Failed {
                message: "card declined: code 51".into(),
                cause: Some(cause())
            }
        );
        assert_eq!(
            Verdict::decode(Some(Verdict::dead_letter(5, Some(&cause())))),
            Verdict::DeadLetter {
                attempts: 5,
                cause: Some(cause())
            }
        );
        assert_eq!(
            Verdict::decode(Some(Verdict::dead_letter(5, None))),
            Verdict::DeadLetter {
                attempts: 5,
                cause: None
            }
        );
        assert_eq!(
            Verdict::decode(Some(b"invoice-7".to_vec())),
            Verdict::Processed(Some(b"invoice-7".to_vec()))
        );
        assert_eq!(Verdict::decode(None), Verdict::Processed(None));
        assert!(Verdict::is_reserved(Some(b"\0dedup:x")));
        assert!(!Verdict::is_reserved(Some(b"dedup:x")));
        for bytes in [
            Verdict::failed(&cause()),
            Verdict::dead_letter(1, Some(&cause())),
        ] {
            assert!(bytes.starts_with(FAILED_PREFIX) || bytes.starts_with(DEAD_LETTER_PREFIX));
        }
    }

    #[test]
    fn the_hex_prefixes_are_the_prefixes() {
        assert_eq!(crate::types::hex(FAILED_PREFIX), FAILED_PREFIX_HEX);
        assert_eq!(
            crate::types::hex(DEAD_LETTER_PREFIX),
            DEAD_LETTER_PREFIX_HEX
        );
    }

    #[test]
    fn old_verdicts_still_decode() {
        assert_eq!(
            Verdict::decode(Some(b"\0dedup:failed\0card declined".to_vec())),
            Verdict::Failed {
                message: "card declined".into(),
                cause: None
            }
        );
        assert_eq!(
            Verdict::decode(Some(b"\0dedup:dead-letter\x005".to_vec())),
            Verdict::DeadLetter {
                attempts: 5,
                cause: None
            }
        );
    }

    #[test]
    fn the_largest_cause_fits_an_outcome() {
        let big = Failure::new(
            "handler",
            vec!["é".repeat(10_000)],
            1,
            Timestamp::EPOCH,
            None,
        )
        .fit();
        assert!(Verdict::dead_letter(u32::MAX, Some(&big)).len() <= MAX_OUTCOME_LEN);
        assert!(Verdict::failed(&big).len() <= MAX_OUTCOME_LEN);
    }
}
