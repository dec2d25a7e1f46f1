//! Turning a backend's stored columns or fields into a [`Record`], with the contract's
//! checks applied once for every backend.

use crate::{Error, Fingerprint, Key, LeaseToken, Record, RecordState, Result, Timestamp};

/// Which state the stored record says it is in (each backend maps its own tag or column
/// pattern onto this, and reports an unknown tag with [`Error::corrupt`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawState {
    /// Claimed, not committed.
    InFlight,
    /// Committed.
    Completed,
}

/// A record as the storage holds it, before any check: integers as the storage's signed
/// types, the token and fingerprint as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawRecord<'a> {
    /// The state.
    pub state: RawState,
    /// The lease token (in flight) or the committing token (completed; may be absent).
    pub token: Option<&'a str>,
    /// The fence: must be at least 1.
    pub fence: i64,
    /// The attempt: must be between 1 and `u32::MAX`.
    pub attempt: i64,
    /// Milliseconds since the Unix epoch when the lease expires (needed in flight).
    pub expires_at: Option<i64>,
    /// Milliseconds since the Unix epoch when it was committed (needed when completed).
    pub processed_at: Option<i64>,
    /// The stored outcome (completed records).
    pub outcome: Option<Vec<u8>>,
    /// The stored fingerprint.
    pub fingerprint: Option<&'a str>,
    /// When the key was first claimed (ms), if the backend keeps it.
    pub first_claimed_at: Option<i64>,
    /// The encoded [`Failure`](crate::Failure) of the latest released failure, if the
    /// backend keeps it.
    pub last_failure: Option<&'a [u8]>,
}

impl RawRecord<'_> {
    /// The record of `key`, or [`Error::Corrupt`] naming what is wrong. Never panics.
    pub fn decode(self, key: &Key) -> Result<Record> {
        let corrupt = |detail: String| Error::corrupt(key, detail);
        let fence = fence_from(key, self.fence)?;
        let attempt = attempt_from(key, self.attempt)?;
        let token = self
            .token
            .map(|t| LeaseToken::parse(t).ok_or_else(|| corrupt(format!("token {t:?}"))))
            .transpose()?;
        let fingerprint = self
            .fingerprint
            .map(|f| Fingerprint::new(f).map_err(|e| corrupt(format!("fingerprint: {e}"))))
            .transpose()?;
        let state = match self.state {
            RawState::InFlight => RecordState::InFlight {
                token: token.ok_or_else(|| corrupt("in flight without a token".into()))?,
                expires_at: Timestamp::from_millis(
                    self.expires_at
                        .ok_or_else(|| corrupt("in flight without an expiry".into()))?,
                ),
            },
            RawState::Completed => RecordState::Completed {
                token,
                processed_at: Timestamp::from_millis(
                    self.processed_at
                        .ok_or_else(|| corrupt("completed without a processing time".into()))?,
                ),
                outcome: self.outcome,
            },
        };
        let last_failure = self
            .last_failure
            .map(|bytes| {
                crate::Failure::decode(bytes)
                    .ok_or_else(|| corrupt("the stored failure cannot be read".into()))
            })
            .transpose()?;
        Ok(Record {
            key: key.clone(),
            fence,
            attempt,
            fingerprint,
            first_claimed_at: self.first_claimed_at.map(Timestamp::from_millis),
            last_failure,
            state,
        })
    }
}

/// A stored fence, checked: fences start at 1.
pub fn fence_from(key: &Key, fence: i64) -> Result<u64> {
    u64::try_from(fence)
        .ok()
        .filter(|f| *f >= 1)
        .ok_or_else(|| Error::corrupt(key, format!("fence {fence} is not a positive integer")))
}

/// A stored attempt number, checked: attempts start at 1 and fit a `u32`.
pub fn attempt_from(key: &Key, attempt: i64) -> Result<u32> {
    u32::try_from(attempt)
        .ok()
        .filter(|a| *a >= 1)
        .ok_or_else(|| Error::corrupt(key, format!("attempt {attempt} is out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "67e55044-10b1-426f-9247-bb680e5fe0c8";

    fn raw(state: RawState) -> RawRecord<'static> {
        RawRecord {
            state,
            token: Some(TOKEN),
            fence: 1,
            attempt: 1,
            expires_at: Some(5),
            processed_at: Some(5),
            outcome: None,
            fingerprint: None,
            first_claimed_at: Some(4),
            last_failure: None,
        }
    }

    #[test]
    fn malformed_records_are_corrupt_not_panics() {
        let key = Key::new("c", "m").unwrap();
        let cases = [
            RawRecord {
                token: None,
                ..raw(RawState::InFlight)
            },
            RawRecord {
                token: Some("not a uuid"),
                ..raw(RawState::InFlight)
            },
            RawRecord {
                fence: 0,
                ..raw(RawState::InFlight)
            },
            RawRecord {
                fence: -1,
                ..raw(RawState::Completed)
            },
            RawRecord {
                attempt: 0,
                ..raw(RawState::InFlight)
            },
            RawRecord {
                attempt: i64::from(u32::MAX) + 1,
                ..raw(RawState::InFlight)
            },
            RawRecord {
                expires_at: None,
                ..raw(RawState::InFlight)
            },
            RawRecord {
                processed_at: None,
                ..raw(RawState::Completed)
            },
            RawRecord {
                fingerprint: Some(""),
                ..raw(RawState::Completed)
            },
        ];
        for case in cases {
            let err = case.clone().decode(&key).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{case:?}: {err:?}");
        }
    }

    #[test]
    fn stored_fences_and_attempts_decode_as_stored_up_to_their_limits() {
        let key = Key::new("c", "m").unwrap();
        assert_eq!(fence_from(&key, 1).unwrap(), 1);
        assert_eq!(fence_from(&key, i64::MAX).unwrap(), i64::MAX as u64);
        assert_eq!(attempt_from(&key, 1).unwrap(), 1);
        assert_eq!(attempt_from(&key, u32::MAX.into()).unwrap(), u32::MAX);
        let record = RawRecord {
            fence: 7,
            attempt: 3,
            ..raw(RawState::InFlight)
        }
        .decode(&key)
        .unwrap();
        assert_eq!((record.fence, record.attempt), (7, 3));
    }

    #[test]
    fn well_formed_records_decode() {
        let key = Key::new("c", "m").unwrap();
        let in_flight = raw(RawState::InFlight).decode(&key).unwrap();
        assert_eq!(
            in_flight.state,
            RecordState::InFlight {
                token: LeaseToken::parse(TOKEN).unwrap(),
                expires_at: Timestamp::from_millis(5)
            }
        );
        let completed = RawRecord {
            token: None,
            outcome: Some(b"ok".to_vec()),
            ..raw(RawState::Completed)
        }
        .decode(&key)
        .unwrap();
        assert_eq!(
            completed.state,
            RecordState::Completed {
                token: None,
                processed_at: Timestamp::from_millis(5),
                outcome: Some(b"ok".to_vec())
            }
        );
    }
}
