//! The contract's pure functions (`backend::transition`) at the edges the store tests do not
//! reach: the instant a lease expires, the purge cutoff, stale tokens, and the operator's
//! forget and revoke. Each test pins a rule a mutant of `transition.rs` broke while every
//! other test still passed (see `MUTANTS.md`).

use std::time::Duration;

use dedup_core::backend::transition::{self, Purgeable, Write};
use dedup_core::{
    Claim, ClaimOptions, Error, Failure, Fingerprint, Forgot, Key, Lease, LeaseToken, Record,
    RecordState, Status, Timestamp, TxClaim,
};

const LEASE: Duration = Duration::from_secs(10);
const NOW: Timestamp = Timestamp::from_millis(1_000_000);

fn key() -> Key {
    Key::new("billing", "m-1").unwrap()
}

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

/// A record in flight at fence 5, attempt 3, first claimed at 10, holding `token` until
/// `expires_at`.
fn in_flight(token: LeaseToken, expires_at: Timestamp) -> Record {
    Record {
        key: key(),
        fence: 5,
        attempt: 3,
        fingerprint: None,
        first_claimed_at: Some(at(10)),
        last_failure: None,
        state: RecordState::InFlight { token, expires_at },
    }
}

/// A record completed at `processed_at` by the lease holding `token`.
fn completed(token: Option<LeaseToken>, processed_at: Timestamp) -> Record {
    Record {
        state: RecordState::Completed {
            token,
            processed_at,
            outcome: Some(b"ok".to_vec()),
        },
        ..in_flight(LeaseToken::random(), at(0))
    }
}

/// The lease a worker holds on `record` (in flight).
fn lease_of(record: &Record) -> Lease {
    let RecordState::InFlight { token, expires_at } = record.state else {
        panic!("not in flight: {record:?}");
    };
    Lease {
        key: record.key.clone(),
        token,
        fence: record.fence,
        attempt: record.attempt,
        expires_at,
    }
}

fn put(write: Write) -> Record {
    match write {
        Write::Put(record) => record,
        Write::Unchanged => panic!("expected a write"),
    }
}

fn claim(record: Option<&Record>, options: &ClaimOptions, now: Timestamp) -> (Claim, Write) {
    transition::claim(record, &key(), options, now, LeaseToken::random()).unwrap()
}

#[test]
fn a_lease_is_no_longer_live_at_its_expiry_instant() {
    let held = in_flight(LeaseToken::random(), NOW);
    let (claim_at_expiry, write) = claim(Some(&held), &ClaimOptions::lease(LEASE), NOW);
    let lease = claim_at_expiry
        .into_lease()
        .expect("taken over at the expiry instant");
    assert_eq!((lease.fence, lease.attempt), (6, 4));
    assert_eq!(put(write).fence, 6);

    let one_ms_before = at(NOW.as_millis() - 1);
    let (claim_before, write) = claim(Some(&held), &ClaimOptions::lease(LEASE), one_ms_before);
    assert_eq!(
        claim_before,
        Claim::InFlight {
            expires_at: NOW,
            attempt: 3
        }
    );
    assert_eq!(write, Write::Unchanged);

    let (tx, _) = transition::tx_claim(Some(&held), &key(), None, NOW).unwrap();
    assert_eq!(tx, TxClaim::Claimed { fence: 6 });
}

#[test]
fn a_new_record_is_first_claimed_now_and_a_takeover_keeps_the_first_claim_time() {
    let (_, write) = claim(None, &ClaimOptions::lease(LEASE), NOW);
    assert_eq!(put(write).first_claimed_at, Some(NOW));

    let expired = in_flight(LeaseToken::random(), at(500));
    let (_, write) = claim(Some(&expired), &ClaimOptions::lease(LEASE), NOW);
    assert_eq!(put(write).first_claimed_at, Some(at(10)));

    let (_, write) = transition::tx_claim(None, &key(), None, NOW).unwrap();
    assert_eq!(put(write).first_claimed_at, Some(NOW));
}

#[test]
fn a_takeover_without_a_fingerprint_keeps_the_stored_one() {
    let fingerprint = Fingerprint::new("sha256:abc").unwrap();
    let expired = Record {
        fingerprint: Some(fingerprint.clone()),
        ..in_flight(LeaseToken::random(), at(500))
    };
    let (_, write) = claim(Some(&expired), &ClaimOptions::lease(LEASE), NOW);
    assert_eq!(put(write).fingerprint, Some(fingerprint.clone()));

    let other = Fingerprint::new("sha256:def").unwrap();
    let err = transition::claim(
        Some(&expired),
        &key(),
        &ClaimOptions::lease(LEASE).with_fingerprint(other),
        NOW,
        LeaseToken::random(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::FingerprintMismatch { .. }), "{err:?}");
}

#[test]
fn only_the_token_holding_the_lease_may_commit_renew_or_release() {
    let held = in_flight(LeaseToken::random(), at(NOW.as_millis() + 5_000));
    let stale = Lease {
        token: LeaseToken::random(),
        ..lease_of(&held)
    };
    let lost = |r: dedup_core::Result<Write>| matches!(r, Err(Error::LeaseLost { .. }));
    assert!(lost(transition::commit(Some(&held), &stale, None, NOW)));
    assert!(lost(transition::release(Some(&held), &stale, NOW)));
    assert!(matches!(
        transition::renew(Some(&held), &stale, LEASE, NOW),
        Err(Error::LeaseLost { .. })
    ));
    assert!(lost(transition::commit(None, &stale, None, NOW)));
}

#[test]
fn a_commit_completes_the_record_with_its_token_and_outcome() {
    let held = in_flight(LeaseToken::random(), at(NOW.as_millis() + 5_000));
    let lease = lease_of(&held);
    let done = put(transition::commit(Some(&held), &lease, Some(b"42"), NOW).unwrap());
    assert_eq!(
        done.state,
        RecordState::Completed {
            token: Some(lease.token),
            processed_at: NOW,
            outcome: Some(b"42".to_vec())
        }
    );
    assert_eq!((done.fence, done.attempt), (5, 3));
}

#[test]
fn a_repeated_commit_by_the_committing_token_succeeds_and_writes_nothing() {
    let token = LeaseToken::random();
    let done = completed(Some(token), at(900));
    let lease = Lease {
        token,
        ..lease_of(&in_flight(token, NOW))
    };
    assert_eq!(
        transition::commit(Some(&done), &lease, None, NOW).unwrap(),
        Write::Unchanged
    );
    let other = Lease {
        token: LeaseToken::random(),
        ..lease.clone()
    };
    assert!(matches!(
        transition::commit(Some(&done), &other, None, NOW),
        Err(Error::LeaseLost { .. })
    ));
    let committed_in_a_transaction = completed(None, at(900));
    assert!(matches!(
        transition::commit(Some(&committed_in_a_transaction), &lease, None, NOW),
        Err(Error::LeaseLost { .. })
    ));
}

#[test]
fn a_renewal_moves_the_stored_expiry_to_now_plus_the_extension() {
    let held = in_flight(LeaseToken::random(), at(NOW.as_millis() + 1_000));
    let lease = lease_of(&held);
    let (renewed, write) = transition::renew(Some(&held), &lease, LEASE, NOW).unwrap();
    let expires_at = NOW.saturating_add(LEASE);
    assert_eq!(renewed.expires_at, expires_at);
    assert_eq!((renewed.fence, renewed.attempt), (5, 3));
    assert_eq!(
        put(write).state,
        RecordState::InFlight {
            token: lease.token,
            expires_at
        }
    );
}

#[test]
fn a_release_expires_the_stored_lease_now_and_keeps_the_token() {
    let held = in_flight(LeaseToken::random(), at(NOW.as_millis() + 5_000));
    let lease = lease_of(&held);
    let released = put(transition::release(Some(&held), &lease, NOW).unwrap());
    assert_eq!(
        released.state,
        RecordState::InFlight {
            token: lease.token,
            expires_at: NOW
        }
    );
}

#[test]
fn a_failed_release_keeps_the_failure_as_the_last_failure() {
    let held = in_flight(LeaseToken::random(), at(NOW.as_millis() + 5_000));
    let failure = Failure::new("handler", vec!["boom".into()], 3, NOW, None);
    let write = transition::release_failed(Some(&held), &lease_of(&held), &failure, NOW);
    let released = put(write.unwrap());
    assert_eq!(released.last_failure, Some(failure));
    assert!(matches!(
        released.state,
        RecordState::InFlight { expires_at, .. } if expires_at == NOW
    ));
}

#[test]
fn a_completed_record_is_purged_only_once_strictly_older_than_the_retention() {
    let retention = Duration::from_secs(60);
    let cutoff = NOW.saturating_sub(retention);
    let purgeable =
        |processed_at| transition::purgeable(&completed(None, processed_at), NOW, retention);
    assert_eq!(purgeable(cutoff), None);
    assert_eq!(purgeable(NOW), None);
    assert_eq!(
        purgeable(at(cutoff.as_millis() - 1)),
        Some(Purgeable::Completed)
    );
}

#[test]
fn an_in_flight_record_is_purged_only_once_its_lease_expired_longer_ago_than_the_retention() {
    let retention = Duration::from_secs(60);
    let cutoff = NOW.saturating_sub(retention);
    let purgeable = |expires_at| {
        transition::purgeable(&in_flight(LeaseToken::random(), expires_at), NOW, retention)
    };
    assert_eq!(
        purgeable(at(cutoff.as_millis() - 1)),
        Some(Purgeable::Expired)
    );
    assert_eq!(purgeable(cutoff), None);
    // Expired, but more recently than the retention.
    assert_eq!(purgeable(at(NOW.as_millis() - 1)), None);
    // Live, even with no retention at all.
    let live = in_flight(LeaseToken::random(), at(NOW.as_millis() + 1));
    assert_eq!(transition::purgeable(&live, NOW, Duration::ZERO), None);
}

#[test]
fn forget_refuses_a_live_lease_without_force_and_removes_anything_else() {
    let live = in_flight(LeaseToken::random(), at(NOW.as_millis() + 1));
    let expired = in_flight(LeaseToken::random(), NOW);
    let done = completed(None, at(900));
    assert_eq!(transition::forget(None, false, NOW), Forgot::NotFound);
    assert_eq!(
        transition::forget(Some(&live), false, NOW),
        Forgot::LiveLease {
            expires_at: at(NOW.as_millis() + 1),
            attempt: 3
        }
    );
    let forgot = |status| Forgot::Forgot {
        status,
        fence: 5,
        attempt: 3,
    };
    assert_eq!(
        transition::forget(Some(&live), true, NOW),
        forgot(Status::InFlight)
    );
    assert_eq!(
        transition::forget(Some(&expired), false, NOW),
        forgot(Status::Expired)
    );
    assert_eq!(
        transition::forget(Some(&done), false, NOW),
        forgot(Status::Completed)
    );
}

#[test]
fn revoke_replaces_the_token_of_a_lease_not_live_or_forced_and_only_of_the_token_read() {
    let token = LeaseToken::random();
    let new_token = LeaseToken::random();
    let live_until = at(NOW.as_millis() + 5_000);
    let revoked_at = |expires_at| RecordState::InFlight {
        token: new_token,
        expires_at,
    };
    let revoke = |record: &Record, token, force| {
        transition::revoke(Some(record), token, force, new_token, NOW).map(|r| r.state)
    };

    // Expired at this very instant: revoked without force, expiry kept.
    let expiring = in_flight(token, NOW);
    assert_eq!(revoke(&expiring, token, false), Some(revoked_at(NOW)));
    // Live: only with force, and then it expires now.
    let live = in_flight(token, live_until);
    assert_eq!(revoke(&live, token, false), None);
    assert_eq!(revoke(&live, token, true), Some(revoked_at(NOW)));
    // Another token (the key changed hands since it was read): never.
    assert_eq!(revoke(&expiring, LeaseToken::random(), false), None);
    assert_eq!(revoke(&live, LeaseToken::random(), true), None);
    // Completed or absent: nothing to revoke.
    assert_eq!(revoke(&completed(Some(token), NOW), token, true), None);
    assert_eq!(transition::revoke(None, token, true, new_token, NOW), None);

    let kept = transition::revoke(Some(&live), token, true, new_token, NOW).unwrap();
    assert_eq!((kept.fence, kept.attempt), (5, 3));
}
