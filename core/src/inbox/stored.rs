//! How the [`Inbox`](super::Inbox) writes its own verdicts (a stored failure, a dead letter)
//! into a key's outcome bytes, beside the handlers' outcomes.
//!
//! A handler's outcome is stored as it is, byte for byte (so records written by a store
//! user directly and by the Inbox read the same). The Inbox's verdicts start with a reserved
//! prefix, `\0dedup:`, which a handler's outcome may not start with:
//! - `\0dedup:failed\0` + the failure's message (UTF-8);
//! - `\0dedup:dead-letter\0` + the number of attempts used (decimal).

const RESERVED: &[u8] = b"\0dedup:";
const FAILED: &[u8] = b"\0dedup:failed\0";
const DEAD_LETTER: &[u8] = b"\0dedup:dead-letter\0";

/// What a completed key's outcome bytes hold.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// A handler's outcome.
    Outcome(Option<Vec<u8>>),
    /// A handler failure stored as the key's final result.
    Failed(String),
    /// The key used up its attempts after this many.
    DeadLetter(u32),
}

impl Stored {
    /// Read the outcome bytes of a completed key.
    pub(crate) fn decode(outcome: Option<Vec<u8>>) -> Stored {
        match outcome {
            Some(bytes) if bytes.starts_with(FAILED) => {
                Stored::Failed(String::from_utf8_lossy(&bytes[FAILED.len()..]).into_owned())
            }
            Some(bytes) if bytes.starts_with(DEAD_LETTER) => Stored::DeadLetter(
                std::str::from_utf8(&bytes[DEAD_LETTER.len()..])
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0),
            ),
            other => Stored::Outcome(other),
        }
    }

    /// The bytes a failure is stored as, cut to fit [`MAX_OUTCOME_LEN`](crate::MAX_OUTCOME_LEN)
    /// on a character boundary.
    pub(crate) fn failed(message: &str) -> Vec<u8> {
        let room = crate::MAX_OUTCOME_LEN - FAILED.len();
        let mut end = message.len().min(room);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        [FAILED, &message.as_bytes()[..end]].concat()
    }

    /// The bytes a dead letter after `attempts` attempts is stored as.
    pub(crate) fn dead_letter(attempts: u32) -> Vec<u8> {
        [DEAD_LETTER, attempts.to_string().as_bytes()].concat()
    }

    /// Whether a handler's outcome starts with the reserved prefix (and would be misread).
    pub(crate) fn is_reserved(outcome: Option<&[u8]>) -> bool {
        outcome.is_some_and(|o| o.starts_with(RESERVED))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_round_trip_and_outcomes_stay_byte_for_byte() {
        assert_eq!(
            Stored::decode(Some(Stored::failed("card declined"))),
            Stored::Failed("card declined".into())
        );
        assert_eq!(
            Stored::decode(Some(Stored::dead_letter(5))),
            Stored::DeadLetter(5)
        );
        assert_eq!(
            Stored::decode(Some(b"invoice-7".to_vec())),
            Stored::Outcome(Some(b"invoice-7".to_vec()))
        );
        assert_eq!(Stored::decode(None), Stored::Outcome(None));
        assert!(Stored::is_reserved(Some(b"\0dedup:x")));
        assert!(!Stored::is_reserved(Some(b"dedup:x")));
    }

    #[test]
    fn a_long_failure_is_cut_to_fit_on_a_char_boundary() {
        let long = "é".repeat(crate::MAX_OUTCOME_LEN);
        let bytes = Stored::failed(&long);
        assert!(bytes.len() <= crate::MAX_OUTCOME_LEN);
        assert!(
            matches!(Stored::decode(Some(bytes)), Stored::Failed(m) if m.chars().all(|c| c == 'é'))
        );
    }
}
