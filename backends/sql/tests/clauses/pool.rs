//! The pool's acquire timeout against the real server, the same on every sqlx backend:
//! with every connection held, a store call fails within `acquire_timeout` (not sqlx's
//! 30 s) with a retryable error that says the pool timed out, and works again once a
//! connection is free. Each backend's `tests/pool.rs` includes this file as a module
//! (`#[path]`) beside its `common` helpers, its `DESCRIPTOR`, the aliases `Store` and
//! `Target`, `one_at_a_time` (its config with one statement per call) and `URL_PARAMS`
//! (the URL parameters saying the same). Not a test target of its own.

use std::time::Duration;

use dedup_sql::SqlConfig;

use super::{DESCRIPTOR, Store, Target, URL_PARAMS, common, one_at_a_time};

#[tokio::test]
async fn a_full_pool_fails_within_the_acquire_timeout_with_a_retryable_error() {
    let url = crate::url_or_skip!();
    let config = common::config(&common::unique_table("pool_timeout"));
    assert_eq!(
        config.acquire_timeout,
        Duration::from_secs(5),
        "the documented default"
    );
    let timeout = Duration::from_millis(400);
    let config = one_at_a_time(config)
        .with_max_connections(1)
        .with_acquire_timeout(timeout);
    let store = Store::connect_with(&url, config).await.unwrap();
    let held = store.pool().acquire().await.unwrap();
    dedup_conformance::pool::a_full_pool_fails_within_the_acquire_timeout(
        &store,
        held,
        timeout,
        |source| matches!(source.downcast_ref(), Some(sqlx::Error::PoolTimedOut)),
    )
    .await;
}

/// `acquire_timeout=` in a store URL reaches the pool.
#[tokio::test]
async fn the_url_parameter_sets_the_acquire_timeout() {
    let url = crate::url_or_skip!();
    let table = common::unique_table("pool_url");
    let sep = if url.contains('?') { '&' } else { '?' };
    let target: Target = dedup_sql::target::parse_target(
        &DESCRIPTOR,
        &format!("{url}{sep}{URL_PARAMS}table={table}&pool_size=1&acquire_timeout=300ms"),
    )
    .unwrap();
    assert_eq!(target.config.acquire_timeout, Duration::from_millis(300));
    let store = Store::connect_with(&target.url, target.config)
        .await
        .unwrap();
    let held = store.pool().acquire().await.unwrap();
    dedup_conformance::pool::a_held_pool_fails_within_the_slack(&store, held).await;
}
