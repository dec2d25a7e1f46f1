//! The contract as pure functions: given a key's record (or none) and "now", what an
//! operation returns and what the record becomes.
//!
//! [`MemoryStore`](crate::MemoryStore) is these functions over a map. Backends that can read
//! and write a record under one lock (SQLite inside an immediate transaction) may use them
//! directly instead of restating the contract; backends that must express it in SQL or Lua
//! are checked against them by the conformance suite's model-based test.

use std::time::Duration;

use crate::{
    Claim, ClaimOptions, Error, Fingerprint, Key, Lease, LeaseToken, Record, RecordState, Result,
    Timestamp, TxClaim,
};

/// What an operation does to the stored record.
#[derive(Clone, Debug, PartialEq, Eq)]
// A `Write` lives for one operation and is matched at once: boxing the record would add an
// allocation to every write for no gain.
#[allow(clippy::large_enum_variant)]
pub enum Write {
    /// Leave the record as it is.
    Unchanged,
    /// Store this record (insert or replace).
    Put(Record),
}

/// Why a record may be purged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purgeable {
    /// Completed longer ago than the retention.
    Completed,
    /// In flight, with a lease that expired longer ago than the retention.
    Expired,
}

/// What a claim of a key finds, before anything is written: the one decision
/// [`claim`] and [`tx_claim`] share, so neither can disagree with the other about when a key
/// may be taken.
enum Found {
    /// Free to take (absent, or in flight with an expired or released lease): the new
    /// holder's fence, attempt and fingerprint.
    Free {
        fence: u64,
        attempt: u32,
        fingerprint: Option<Fingerprint>,
    },
    /// In flight with a live lease.
    Held { expires_at: Timestamp, attempt: u32 },
    /// Completed.
    Completed {
        processed_at: Timestamp,
        outcome: Option<Vec<u8>>,
    },
}

/// Look at `record` for a claim carrying `fingerprint` at `now`.
fn find(
    record: Option<&Record>,
    key: &Key,
    fingerprint: Option<&Fingerprint>,
    now: Timestamp,
) -> Result<Found> {
    if let (Some(rec), Some(fp)) = (record, fingerprint)
        && rec.fingerprint.as_ref().is_some_and(|stored| stored != fp)
    {
        return Err(Error::FingerprintMismatch { key: key.clone() });
    }
    Ok(match record {
        None => Found::Free {
            fence: 1,
            attempt: 1,
            fingerprint: fingerprint.cloned(),
        },
        Some(rec) => match &rec.state {
            RecordState::Completed {
                processed_at,
                outcome,
                ..
            } => Found::Completed {
                processed_at: *processed_at,
                outcome: outcome.clone(),
            },
            RecordState::InFlight { expires_at, .. } if now < *expires_at => Found::Held {
                expires_at: *expires_at,
                attempt: rec.attempt,
            },
            RecordState::InFlight { .. } => Found::Free {
                fence: rec.fence + 1,
                attempt: rec.attempt.saturating_add(1),
                fingerprint: fingerprint.cloned().or_else(|| rec.fingerprint.clone()),
            },
        },
    })
}

/// `claim(key, options)` at `now`; `token` is the token a new lease gets.
pub fn claim(
    record: Option<&Record>,
    key: &Key,
    options: &ClaimOptions,
    now: Timestamp,
    token: LeaseToken,
) -> Result<(Claim, Write)> {
    let (fence, attempt, fingerprint) = match find(record, key, options.fingerprint.as_ref(), now)?
    {
        Found::Held {
            expires_at,
            attempt,
        } => {
            let claim = Claim::InFlight {
                expires_at,
                attempt,
            };
            return Ok((claim, Write::Unchanged));
        }
        Found::Completed {
            processed_at,
            outcome,
        } => {
            let claim = Claim::Completed {
                processed_at,
                outcome,
            };
            return Ok((claim, Write::Unchanged));
        }
        Found::Free {
            fence,
            attempt,
            fingerprint,
        } => (fence, attempt, fingerprint),
    };
    let expires_at = now.saturating_add(options.lease);
    let first_claimed_at = first_claim(record, now);
    let lease = Lease {
        key: key.clone(),
        token,
        fence,
        attempt,
        expires_at,
    };
    let record = Record {
        key: key.clone(),
        fence,
        attempt,
        fingerprint,
        first_claimed_at,
        last_failure: record.and_then(|r| r.last_failure.clone()),
        state: RecordState::InFlight { token, expires_at },
    };
    Ok((Claim::Acquired(lease), Write::Put(record)))
}

fn held_by<'r>(record: Option<&'r Record>, lease: &Lease) -> Option<(&'r Record, Timestamp)> {
    match record {
        Some(rec) => match &rec.state {
            RecordState::InFlight { token, expires_at } if *token == lease.token => {
                Some((rec, *expires_at))
            }
            _ => None,
        },
        None => None,
    }
}

/// The first-claim time a claim at `now` writes: `now` for a new record, the stored one
/// (possibly unknown) for a record taken over.
fn first_claim(record: Option<&Record>, now: Timestamp) -> Option<Timestamp> {
    record.map_or(Some(now), |r| r.first_claimed_at)
}

fn lost(lease: &Lease) -> Error {
    Error::lease_lost(&lease.key)
}

/// A claim inside the caller's SQL transaction (the SQL backends' transactional
/// extension) at `now`: like [`claim`], but what it writes is a *completed* record (the
/// transaction itself is the lease), with no token and no outcome.
///
/// Absent: `Claimed` at fence 1. In flight with an expired or released lease: taken over,
/// `Claimed` at fence+1, attempt+1. In flight with a live lease: `InFlight`. Completed:
/// `Completed`. A stored fingerprint other than `fingerprint`: `FingerprintMismatch`.
/// Nothing is written in the last three cases.
pub fn tx_claim(
    record: Option<&Record>,
    key: &Key,
    fingerprint: Option<&Fingerprint>,
    now: Timestamp,
) -> Result<(TxClaim, Write)> {
    Ok(match find(record, key, fingerprint, now)? {
        Found::Free {
            fence,
            attempt,
            fingerprint,
        } => (
            TxClaim::Claimed { fence },
            Write::Put(Record {
                key: key.clone(),
                fence,
                attempt,
                fingerprint,
                first_claimed_at: first_claim(record, now),
                last_failure: record.and_then(|r| r.last_failure.clone()),
                state: RecordState::Completed {
                    token: None,
                    processed_at: now,
                    outcome: None,
                },
            }),
        ),
        Found::Held {
            expires_at,
            attempt,
        } => (
            TxClaim::InFlight {
                expires_at,
                attempt,
            },
            Write::Unchanged,
        ),
        Found::Completed {
            processed_at,
            outcome,
        } => (
            TxClaim::Completed {
                processed_at,
                outcome,
            },
            Write::Unchanged,
        ),
    })
}

/// `commit(lease, outcome)` at `now`.
pub fn commit(
    record: Option<&Record>,
    lease: &Lease,
    outcome: Option<&[u8]>,
    now: Timestamp,
) -> Result<Write> {
    if let Some((rec, _)) = held_by(record, lease) {
        return Ok(Write::Put(Record {
            state: RecordState::Completed {
                token: Some(lease.token),
                processed_at: now,
                outcome: outcome.map(<[u8]>::to_vec),
            },
            ..rec.clone()
        }));
    }
    match record.map(|r| &r.state) {
        Some(RecordState::Completed { token, .. }) if *token == Some(lease.token) => {
            Ok(Write::Unchanged)
        }
        _ => Err(lost(lease)),
    }
}

/// `renew(lease, extend_by)` at `now`.
pub fn renew(
    record: Option<&Record>,
    lease: &Lease,
    extend_by: Duration,
    now: Timestamp,
) -> Result<(Lease, Write)> {
    let (rec, _) = held_by(record, lease).ok_or_else(|| lost(lease))?;
    let expires_at = now.saturating_add(extend_by);
    let renewed = Lease {
        key: rec.key.clone(),
        token: lease.token,
        fence: rec.fence,
        attempt: rec.attempt,
        expires_at,
    };
    let record = Record {
        state: RecordState::InFlight {
            token: lease.token,
            expires_at,
        },
        ..rec.clone()
    };
    Ok((renewed, Write::Put(record)))
}

/// `release(lease)` at `now`.
pub fn release(record: Option<&Record>, lease: &Lease, now: Timestamp) -> Result<Write> {
    let (rec, expires_at) = held_by(record, lease).ok_or_else(|| lost(lease))?;
    Ok(Write::Put(Record {
        state: RecordState::InFlight {
            token: lease.token,
            expires_at: expires_at.min(now),
        },
        ..rec.clone()
    }))
}

/// `release_failed(lease, failure)` at `now`: [`release`], and the record keeps `failure` as
/// its [`last_failure`](Record::last_failure) (replacing the one it had).
pub fn release_failed(
    record: Option<&Record>,
    lease: &Lease,
    failure: &crate::Failure,
    now: Timestamp,
) -> Result<Write> {
    Ok(match release(record, lease, now)? {
        Write::Put(rec) => Write::Put(Record {
            last_failure: Some(failure.clone()),
            ..rec
        }),
        Write::Unchanged => Write::Unchanged,
    })
}

/// Whether `purge(retention)` at `now` removes `record`.
pub fn purgeable(record: &Record, now: Timestamp, retention: Duration) -> Option<Purgeable> {
    let cutoff = now.saturating_sub(retention);
    match &record.state {
        RecordState::Completed { processed_at, .. } if *processed_at < cutoff => {
            Some(Purgeable::Completed)
        }
        // A live lease has expires_at > now >= cutoff, so it is never purgeable.
        RecordState::InFlight { expires_at, .. } if *expires_at < cutoff && *expires_at <= now => {
            Some(Purgeable::Expired)
        }
        _ => None,
    }
}

/// An operator's `forget(key, force)` at `now` ([`Admin::forget`](crate::Admin::forget)):
/// the answer. The record is removed exactly when the answer is
/// [`Forgot::Forgot`](crate::Forgot::Forgot): any record without a live lease, and one
/// with a live lease only with `force`.
pub fn forget(record: Option<&Record>, force: bool, now: Timestamp) -> crate::Forgot {
    let Some(rec) = record else {
        return crate::Forgot::NotFound;
    };
    let status = crate::Status::of(rec, now);
    match &rec.state {
        RecordState::InFlight { expires_at, .. } if status == crate::Status::InFlight && !force => {
            crate::Forgot::LiveLease {
                expires_at: *expires_at,
                attempt: rec.attempt,
            }
        }
        _ => crate::Forgot::Forgot {
            status,
            fence: rec.fence,
            attempt: rec.attempt,
        },
    }
}

/// An operator's revoking release at `now` of the lease holding `token`
/// ([`Admin::release_key`](crate::Admin::release_key)): when `record` is in flight holding
/// `token`, and its lease is not live or `force` is given, the record it becomes (the
/// lease expired, `expires_at = min(expires_at, now)`, and its token replaced by
/// `new_token`, so the old holder's commit, renew and release are `LeaseLost`; fence and
/// attempt kept, so the next claim is a takeover with fence + 1). `None` otherwise:
/// nothing is written.
pub fn revoke(
    record: Option<&Record>,
    token: LeaseToken,
    force: bool,
    new_token: LeaseToken,
    now: Timestamp,
) -> Option<Record> {
    let rec = record?;
    match &rec.state {
        RecordState::InFlight {
            token: held,
            expires_at,
        } if *held == token && (force || *expires_at <= now) => Some(Record {
            state: RecordState::InFlight {
                token: new_token,
                expires_at: (*expires_at).min(now),
            },
            ..rec.clone()
        }),
        _ => None,
    }
}
