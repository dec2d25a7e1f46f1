//! The pool's acquire timeout against the real server: with every connection held, a
//! store call fails within `acquire_timeout` (not sqlx's 30 s) with a retryable error
//! that says the pool timed out, and works again once a connection is free.

mod common;

use std::time::{Duration, Instant};

use dedup_core::{ClaimOptions, DedupStore, Key};
use dedup_mysql::{MySqlConfig, MySqlStore, sqlx};

#[tokio::test]
async fn a_full_pool_fails_within_the_acquire_timeout_with_a_retryable_error() {
    let url = url_or_skip!();
    assert_eq!(
        MySqlConfig::default().acquire_timeout,
        Duration::from_secs(5),
        "the documented default"
    );
    let timeout = Duration::from_millis(400);
    let config = MySqlConfig {
        table: common::unique_table("pool_timeout"),
        ..MySqlConfig::default()
    }
    .with_max_connections(1)
    .with_acquire_timeout(timeout);
    let store = MySqlStore::connect_with(&url, config).await.unwrap();
    let key = Key::new("pool", "m-1").unwrap();
    let opts = ClaimOptions::lease(Duration::from_secs(30));

    let held = store.pool().acquire().await.unwrap();
    let started = Instant::now();
    let err = store.claim(&key, &opts).await.unwrap_err();
    let waited = started.elapsed();
    assert!(
        waited >= timeout && waited < timeout + Duration::from_secs(2),
        "failed after {waited:?}, acquire_timeout {timeout:?}"
    );
    assert!(err.is_retryable(), "{err}");
    let source = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .unwrap_or_else(|| panic!("the driver's error is the source: {err:?}"));
    assert!(matches!(source, sqlx::Error::PoolTimedOut), "{source:?}");
    assert!(
        source.to_string().contains("pool timed out"),
        "names what timed out: {source}"
    );
    let hint = err.hint().expect("a hint");
    assert!(hint.contains("acquire_timeout"), "{hint}");

    drop(held);
    let claim = store.claim(&key, &opts).await.unwrap();
    assert!(
        claim.into_lease().is_some(),
        "works again once a connection is free"
    );
}

/// `acquire_timeout=` in a store URL reaches the pool.
#[tokio::test]
async fn the_url_parameter_sets_the_acquire_timeout() {
    let url = url_or_skip!();
    let table = common::unique_table("pool_url");
    let sep = if url.contains('?') { '&' } else { '?' };
    let target = dedup_core::backend::url::UrlParts::split(&format!(
        "{url}{sep}table={table}&pool_size=1&acquire_timeout=300ms"
    ))
    .map(|parts| (dedup_mysql::DESCRIPTOR.parse)(&parts))
    .unwrap()
    .unwrap()
    .downcast::<dedup_mysql::MySqlTarget>()
    .unwrap();
    assert_eq!(target.config.acquire_timeout, Duration::from_millis(300));
    let store = MySqlStore::connect_with(&target.url, target.config)
        .await
        .unwrap();
    let _held = store.pool().acquire().await.unwrap();
    let started = Instant::now();
    let err = store
        .claim(
            &Key::new("pool", "m-2").unwrap(),
            &ClaimOptions::lease(Duration::from_secs(30)),
        )
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
