//! The pool's acquire timeout against the real server: with every connection held, a
//! store call fails within `acquire_timeout` (not sqlx's 30 s) with a retryable error
//! that says the pool timed out, and works again once a connection is free.

mod common;

use std::time::Duration;

use dedup_postgres::{PostgresConfig, PostgresStore, sqlx};

#[tokio::test]
async fn a_full_pool_fails_within_the_acquire_timeout_with_a_retryable_error() {
    let url = url_or_skip!();
    assert_eq!(
        PostgresConfig::default().acquire_timeout,
        Duration::from_secs(5),
        "the documented default"
    );
    let timeout = Duration::from_millis(400);
    let config = PostgresConfig {
        schema: common::SCHEMA.into(),
        table: common::unique_table("pool_timeout"),
        group_commit: None,
        ..PostgresConfig::default()
    }
    .with_max_connections(1)
    .with_acquire_timeout(timeout);
    let store = PostgresStore::connect_with(&url, config).await.unwrap();
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
    let url = url_or_skip!();
    let table = common::unique_table("pool_url");
    let sep = if url.contains('?') { '&' } else { '?' };
    let target = dedup_core::backend::url::UrlParts::split(&format!(
        "{url}{sep}schema={}&table={table}&pool_size=1&acquire_timeout=300ms&group_commit=off",
        common::SCHEMA
    ))
    .map(|parts| (dedup_postgres::DESCRIPTOR.parse)(&parts))
    .unwrap()
    .unwrap()
    .downcast::<dedup_postgres::PostgresTarget>()
    .unwrap();
    assert_eq!(target.config.acquire_timeout, Duration::from_millis(300));
    let store = PostgresStore::connect_with(&target.url, target.config)
        .await
        .unwrap();
    let held = store.pool().acquire().await.unwrap();
    dedup_conformance::pool::a_held_pool_fails_within_the_slack(&store, held).await;
}
