//! Helpers the clauses share: keys, claims that must acquire, assertions on errors and
//! records. Every helper panics with a message naming what the store got wrong.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dedup_core::{
    Claim, ClaimOptions, DedupStore, Error, Fingerprint, Key, Lease, LeaseToken, Record,
    RecordState, Result, Timestamp,
};

use crate::{StoreFactory, TestContext};

/// The lease most clauses claim with.
pub const LEASE: Duration = Duration::from_secs(10);

/// A key of the `billing` consumer.
pub(crate) fn key(id: &str) -> Key {
    key_for("billing", id)
}

/// A key of any consumer.
pub(crate) fn key_for(consumer: &str, id: &str) -> Key {
    Key::new(consumer, id).expect("valid key")
}

/// Claim options with [`LEASE`] and no fingerprint.
pub(crate) fn opts() -> ClaimOptions {
    ClaimOptions::lease(LEASE)
}

/// Claim options with [`LEASE`] and fingerprint `fp`.
pub(crate) fn opts_fp(fp: &str) -> ClaimOptions {
    opts().with_fingerprint(fingerprint(fp))
}

/// A caller-chosen fingerprint.
pub(crate) fn fingerprint(fp: &str) -> Fingerprint {
    Fingerprint::new(fp).expect("valid fingerprint")
}

/// A fresh context for `clause` and a store opened on it.
pub(crate) async fn setup<F: StoreFactory>(factory: &F, clause: &str) -> (TestContext, F::Store) {
    let ctx = TestContext::new(clause);
    let store = factory.open(&ctx).await;
    (ctx, store)
}

/// `n` handles on the same records (separate connections), shared for spawned tasks.
pub(crate) async fn handles<F: StoreFactory>(
    factory: &F,
    ctx: &TestContext,
    n: usize,
) -> Vec<Arc<F::Store>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(Arc::new(factory.open(ctx).await));
    }
    out
}

/// A claim that must not fail.
pub(crate) async fn claim<S: DedupStore + ?Sized>(
    store: &S,
    key: &Key,
    options: &ClaimOptions,
) -> Claim {
    store
        .claim(key, options)
        .await
        .unwrap_or_else(|e| panic!("claim of {key} failed: {e:?}"))
}

/// The lease of a claim that must acquire.
pub(crate) fn expect_acquired(claim: Claim, what: &str) -> Lease {
    match claim {
        Claim::Acquired(lease) => lease,
        other => panic!("{what}: expected Acquired, got {other:?}"),
    }
}

/// Claim `key` with [`opts`]; it must acquire.
pub(crate) async fn acquire<S: DedupStore + ?Sized>(store: &S, key: &Key) -> Lease {
    acquire_with(store, key, &opts()).await
}

/// Claim `key` with `options`; it must acquire.
pub(crate) async fn acquire_with<S: DedupStore + ?Sized>(
    store: &S,
    key: &Key,
    options: &ClaimOptions,
) -> Lease {
    expect_acquired(claim(store, key, options).await, &format!("claim of {key}"))
}

/// Acquire `key` and commit `outcome`; returns the committed lease.
pub(crate) async fn complete<S: DedupStore + ?Sized>(
    store: &S,
    key: &Key,
    outcome: Option<&[u8]>,
) -> Lease {
    let lease = acquire(store, key).await;
    commit_ok(store, &lease, outcome).await;
    lease
}

/// A commit that must succeed.
pub(crate) async fn commit_ok<S: DedupStore + ?Sized>(
    store: &S,
    lease: &Lease,
    outcome: Option<&[u8]>,
) {
    store
        .commit(lease, outcome)
        .await
        .unwrap_or_else(|e| panic!("commit of {} must succeed, got {e:?}", lease.key));
}

/// A release that must succeed.
pub(crate) async fn release_ok<S: DedupStore + ?Sized>(store: &S, lease: &Lease) {
    store
        .release(lease)
        .await
        .unwrap_or_else(|e| panic!("release of {} must succeed, got {e:?}", lease.key));
}

/// Acquire `key`, let the lease expire, and take it over; returns (stale, current).
pub(crate) async fn taken_over<S: DedupStore + ?Sized>(
    store: &S,
    ctx: &TestContext,
    key: &Key,
) -> (Lease, Lease) {
    let stale = acquire(store, key).await;
    ctx.clock.advance(LEASE);
    let current = acquire(store, key).await;
    assert_eq!(
        (current.fence, current.attempt),
        (stale.fence + 1, stale.attempt + 1),
        "a takeover must raise fence and attempt by one"
    );
    (stale, current)
}

/// A lease for `key` that the store never handed out.
pub(crate) fn forged_lease(key: &Key, now: Timestamp) -> Lease {
    Lease {
        key: key.clone(),
        token: LeaseToken::random(),
        fence: 1,
        attempt: 1,
        expires_at: now.saturating_add(LEASE),
    }
}

/// The stored record of `key` (`get` must not fail).
pub(crate) async fn record<S: DedupStore + ?Sized>(store: &S, key: &Key) -> Option<Record> {
    store
        .get(key)
        .await
        .unwrap_or_else(|e| panic!("get of {key} failed: {e:?}"))
}

/// The in-flight record `key` must have: (token, expires_at, fence, attempt).
pub(crate) async fn in_flight<S: DedupStore + ?Sized>(
    store: &S,
    key: &Key,
) -> (LeaseToken, Timestamp, u64, u32) {
    match record(store, key).await {
        Some(Record {
            fence,
            attempt,
            state: RecordState::InFlight { token, expires_at },
            ..
        }) => (token, expires_at, fence, attempt),
        other => panic!("{key} must be in flight, got {other:?}"),
    }
}

/// The in-flight record a store must hold for `lease` (same token, fence, attempt, expiry).
pub(crate) async fn assert_holds<S: DedupStore + ?Sized>(store: &S, lease: &Lease, what: &str) {
    assert_eq!(
        in_flight(store, &lease.key).await,
        (lease.token, lease.expires_at, lease.fence, lease.attempt),
        "{what}: the record must be in flight under this lease"
    );
}

/// Run `op` and check that it changed nothing stored under `key`.
pub(crate) async fn unchanged<S, T, Fut>(store: &S, key: &Key, what: &str, op: Fut) -> T
where
    S: DedupStore + ?Sized,
    Fut: Future<Output = T>,
{
    let before = record(store, key).await;
    let out = op.await;
    assert_eq!(
        record(store, key).await,
        before,
        "{what} must leave the record unchanged"
    );
    out
}

/// The `Completed` claim result a completed record gives.
pub(crate) fn completed(processed_at: Timestamp, outcome: Option<&[u8]>) -> Claim {
    Claim::Completed {
        processed_at,
        outcome: outcome.map(<[u8]>::to_vec),
    }
}

/// The completed record `key` must have after `lease` committed `outcome` at `processed_at`.
pub(crate) async fn assert_completed_by<S: DedupStore + ?Sized>(
    store: &S,
    lease: &Lease,
    processed_at: Timestamp,
    outcome: Option<&[u8]>,
) {
    let rec = record(store, &lease.key)
        .await
        .unwrap_or_else(|| panic!("{} must have a completed record", lease.key));
    assert_eq!(
        (rec.fence, rec.attempt, rec.state),
        (
            lease.fence,
            lease.attempt,
            RecordState::Completed {
                token: Some(lease.token),
                processed_at,
                outcome: outcome.map(<[u8]>::to_vec),
            }
        ),
        "{}: the record must be completed by this lease",
        lease.key
    );
}

/// `result` must be `Err(LeaseLost)` for `key`.
pub(crate) fn assert_lease_lost<T: Debug>(result: Result<T>, key: &Key, what: &str) {
    match result {
        Err(Error::LeaseLost { key: k }) if &k == key => {}
        other => panic!("{what}: expected Err(LeaseLost) for {key}, got {other:?}"),
    }
}

/// `result` must be `Err(FingerprintMismatch)` for `key`.
pub(crate) fn assert_fingerprint_mismatch<T: Debug>(result: Result<T>, key: &Key, what: &str) {
    match result {
        Err(Error::FingerprintMismatch { key: k }) if &k == key => {}
        other => panic!("{what}: expected Err(FingerprintMismatch) for {key}, got {other:?}"),
    }
}

/// `result` must be `Err(InvalidInput)`.
pub(crate) fn assert_invalid_input<T: Debug>(result: Result<T>, what: &str) {
    match result {
        Err(Error::InvalidInput { .. }) => {}
        other => panic!("{what}: expected Err(InvalidInput), got {other:?}"),
    }
}

/// Await every spawned task; a panic or cancellation in one is a clause failure.
pub(crate) async fn join_all<T>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(task.await.expect("a spawned task of the clause failed"));
    }
    out
}

/// A store's answer with the random parts (tokens) left out, so answers of two stores or
/// of a store and an expectation can be compared with `==`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// `Ok(())`.
    Done,
    /// `Acquired` (claim) or a renewed lease (renew).
    Lease {
        key: Key,
        fence: u64,
        attempt: u32,
        expires_at: Timestamp,
    },
    /// `InFlight`.
    InFlight { expires_at: Timestamp, attempt: u32 },
    /// `Completed`.
    Completed {
        processed_at: Timestamp,
        outcome: Option<Vec<u8>>,
    },
    /// A purge report.
    Purged {
        /// Completed records removed.
        completed: u64,
        /// Expired records removed.
        expired: u64,
        /// Batches run.
        batches: u32,
    },
    /// `Err(LeaseLost)` for this key.
    LeaseLost(Key),
    /// `Err(FingerprintMismatch)` for this key.
    Mismatch(Key),
    /// `Err(InvalidInput)`.
    Invalid,
    /// Any other error (never expected by a clause).
    Failed(String),
}

impl Seen {
    /// A lease as seen: key, fence, attempt, expiry.
    pub(crate) fn lease(lease: &Lease) -> Self {
        Seen::Lease {
            key: lease.key.clone(),
            fence: lease.fence,
            attempt: lease.attempt,
            expires_at: lease.expires_at,
        }
    }

    /// A claim result as seen.
    pub(crate) fn claim(result: &Result<Claim>) -> Self {
        Self::of(result, |claim| match claim {
            Claim::Acquired(lease) => Seen::lease(lease),
            Claim::InFlight {
                expires_at,
                attempt,
            } => Seen::InFlight {
                expires_at: *expires_at,
                attempt: *attempt,
            },
            Claim::Completed {
                processed_at,
                outcome,
            } => Seen::Completed {
                processed_at: *processed_at,
                outcome: outcome.clone(),
            },
        })
    }

    /// An `Ok(())`-or-error result as seen.
    pub(crate) fn unit(result: &Result<()>) -> Self {
        Self::of(result, |()| Seen::Done)
    }

    /// A result as seen, `ok` mapping the success value.
    pub(crate) fn of<T>(result: &Result<T>, ok: impl FnOnce(&T) -> Seen) -> Self {
        match result {
            Ok(value) => ok(value),
            Err(Error::LeaseLost { key }) => Seen::LeaseLost(key.clone()),
            Err(Error::FingerprintMismatch { key }) => Seen::Mismatch(key.clone()),
            Err(Error::InvalidInput { .. }) => Seen::Invalid,
            Err(other) => Seen::Failed(format!("{other:?}")),
        }
    }
}
