//! Reading a stored value (the layout in [`crate::schema`]) back into a [`Record`],
//! through [`RawRecord::decode`]. Anything unexpected is [`Error::Corrupt`], never a panic.

use dedup_core::backend::{RawRecord, RawState};
use dedup_core::{Error, Key, LeaseToken, Record, Result};

use crate::schema::{COMPLETED, IN_FLIGHT, LAYOUT, NO_TIME};

/// A cursor over a value's bytes; every read checks the length.
struct Bytes<'a> {
    rest: &'a [u8],
}

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.rest.len() < n {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn byte(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    /// A flag, then (when set) a u16 length and that many bytes.
    fn short_field(&mut self) -> Option<Option<&'a [u8]>> {
        match self.byte()? {
            0 => Some(None),
            1 => {
                let len = u16::from_le_bytes(self.array()?);
                self.take(usize::from(len)).map(Some)
            }
            _ => None,
        }
    }
}

/// The record `value` holds for `key`.
pub(crate) fn record(key: &Key, value: &[u8]) -> Result<Record> {
    let corrupt = || Error::corrupt(key, "the stored value is not a dedup record");
    let mut b = Bytes { rest: value };
    if b.byte() != Some(LAYOUT) {
        return Err(corrupt());
    }
    let state = match b.byte() {
        Some(IN_FLIGHT) => RawState::InFlight,
        Some(COMPLETED) => RawState::Completed,
        _ => return Err(corrupt()),
    };
    let fence = u64::from_le_bytes(b.array().ok_or_else(corrupt)?);
    let attempt = u32::from_le_bytes(b.array().ok_or_else(corrupt)?);
    let time = i64::from_le_bytes(b.array().ok_or_else(corrupt)?);
    let first = i64::from_le_bytes(b.array().ok_or_else(corrupt)?);
    let has_token = b.byte().ok_or_else(corrupt)?;
    let token_bytes: [u8; 16] = b.array().ok_or_else(corrupt)?;
    let token = match has_token {
        0 => None,
        1 => Some(LeaseToken::from_uuid(uuid::Uuid::from_bytes(token_bytes)).to_string()),
        _ => return Err(corrupt()),
    };
    let fingerprint = b.short_field().ok_or_else(corrupt)?;
    let fingerprint = fingerprint
        .map(std::str::from_utf8)
        .transpose()
        .map_err(|_| corrupt())?;
    let failure = b.short_field().ok_or_else(corrupt)?;
    let outcome = match b.byte() {
        Some(0) if b.rest.is_empty() => None,
        Some(1) => Some(b.rest.to_vec()),
        _ => return Err(corrupt()),
    };
    RawRecord {
        state,
        token: token.as_deref(),
        fence: i64::try_from(fence).unwrap_or(-1),
        attempt: i64::from(attempt),
        expires_at: (state == RawState::InFlight).then_some(time),
        processed_at: (state == RawState::Completed).then_some(time),
        outcome,
        fingerprint,
        first_claimed_at: (first != NO_TIME).then_some(first),
        last_failure: failure,
    }
    .decode(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::encode;
    use dedup_core::{Fingerprint, RecordState, Timestamp};

    fn key() -> Key {
        Key::new("c", "m").unwrap()
    }

    #[test]
    fn records_round_trip() {
        let in_flight = Record {
            key: key(),
            fence: 3,
            attempt: 2,
            fingerprint: Some(Fingerprint::new("fp").unwrap()),
            first_claimed_at: Some(Timestamp::from_millis(5)),
            last_failure: None,
            state: RecordState::InFlight {
                token: LeaseToken::random(),
                expires_at: Timestamp::from_millis(99),
            },
        };
        assert_eq!(record(&key(), &encode(&in_flight)).unwrap(), in_flight);
        let completed = Record {
            first_claimed_at: None,
            fingerprint: None,
            state: RecordState::Completed {
                token: None,
                processed_at: Timestamp::from_millis(7),
                outcome: Some(b"ok".to_vec()),
            },
            ..in_flight
        };
        assert_eq!(record(&key(), &encode(&completed)).unwrap(), completed);
    }

    #[test]
    fn foreign_values_are_corrupt_not_panics() {
        let good = encode(&Record {
            key: key(),
            fence: 1,
            attempt: 1,
            fingerprint: None,
            first_claimed_at: None,
            last_failure: None,
            state: RecordState::InFlight {
                token: LeaseToken::random(),
                expires_at: Timestamp::from_millis(1),
            },
        });
        let mut cases: Vec<Vec<u8>> = vec![vec![], b"hello".to_vec(), vec![2, b'I']];
        cases.extend((0..good.len()).map(|n| good[..n].to_vec()));
        let mut zero_fence = good.clone();
        zero_fence[2] = 0;
        cases.push(zero_fence);
        let mut trailing = good.clone();
        trailing.push(9);
        cases.push(trailing);
        for value in cases {
            let err = record(&key(), &value).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{value:?}: {err:?}");
        }
    }
}
