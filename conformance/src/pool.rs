//! The pool checks the sqlx backends share (PostgreSQL, MySQL / MariaDB): with every
//! connection of the store's pool held, a store call fails within the pool's acquire
//! timeout with a retryable error that says what timed out, and the store works again once
//! a connection is free. Each backend's `tests/pool.rs` builds the store and holds its
//! connection; these functions run the calls and the assertions.

use std::error::Error as StdError;
use std::time::{Duration, Instant};

use dedup_core::{ClaimOptions, DedupStore, Key};

/// How much later than its acquire timeout a call may fail (scheduling, the statement's
/// own start).
const SLACK: Duration = Duration::from_secs(2);

/// `store` has a pool of one connection and the acquire timeout `timeout`, and `held` is
/// that connection: a claim waits `timeout` (not much longer), then fails with a retryable
/// error whose source `pool_timed_out` recognises as the driver's pool timeout, whose
/// source's text says "pool timed out" and whose hint names `acquire_timeout`. Once
/// `held` is dropped, the same claim acquires.
pub async fn a_full_pool_fails_within_the_acquire_timeout<S, H>(
    store: &S,
    held: H,
    timeout: Duration,
    pool_timed_out: impl Fn(&(dyn StdError + 'static)) -> bool,
) where
    S: DedupStore + ?Sized,
{
    let key = Key::new("pool", "m-1").expect("a valid key");
    let opts = ClaimOptions::lease(Duration::from_secs(30));
    let started = Instant::now();
    let err = store
        .claim(&key, &opts)
        .await
        .expect_err("a claim with every connection held fails");
    let waited = started.elapsed();
    assert!(
        waited >= timeout && waited < timeout + SLACK,
        "failed after {waited:?}, acquire_timeout {timeout:?}"
    );
    assert!(err.is_retryable(), "{err}");
    let source = StdError::source(&err)
        .unwrap_or_else(|| panic!("the driver's error is the source: {err:?}"));
    assert!(pool_timed_out(source), "the pool's timeout: {source:?}");
    assert!(
        source.to_string().contains("pool timed out"),
        "names what timed out: {source}"
    );
    let hint = err.hint().expect("a hint");
    assert!(hint.contains("acquire_timeout"), "{hint}");

    drop(held);
    let claim = store
        .claim(&key, &opts)
        .await
        .expect("works again once a connection is free");
    assert!(claim.into_lease().is_some(), "the key is acquired: {key}");
}

/// `store`'s only connection is `held` and its acquire timeout well under 2 s (set from a
/// URL parameter): a claim fails with a retryable error within 2 s.
pub async fn a_held_pool_fails_within_the_slack<S, H>(store: &S, held: H)
where
    S: DedupStore + ?Sized,
{
    let started = Instant::now();
    let err = store
        .claim(
            &Key::new("pool", "m-2").expect("a valid key"),
            &ClaimOptions::lease(Duration::from_secs(30)),
        )
        .await
        .expect_err("a claim with every connection held fails");
    assert!(err.is_retryable(), "{err}");
    assert!(
        started.elapsed() < SLACK,
        "failed after {:?}",
        started.elapsed()
    );
    drop(held);
}
