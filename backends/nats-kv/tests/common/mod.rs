//! What the NATS KV tests share: the cluster's servers (through
//! `dedup_conformance::server_url`, so a missing cluster skips with a message, or fails
//! under `DEDUP_TEST_STRICT=1`), and stores on the shared R3 test bucket under a fresh key
//! prefix.

#![allow(dead_code)] // each test binary uses its own subset

use std::sync::Arc;
use std::time::Duration;

use dedup_core::Clock;
use dedup_nats_kv::{NatsKvConfig, NatsKvStore};

/// The bucket every test shares (R3 on the 3-node cluster); each test has its own prefix.
pub const BUCKET: &str = "dedup_tests";

/// Retention for test stores: far longer than any clock advance in the tests.
pub const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// The cluster's servers (`DEDUP_NATS_CLUSTER_URLS`); `None` when not set.
pub fn cluster() -> Option<Vec<String>> {
    let urls = dedup_conformance::server_url("DEDUP_NATS_CLUSTER_URLS")?;
    Some(servers(&urls))
}

/// Comma-separated `nats://` URLs as a list.
pub fn servers(urls: &str) -> Vec<String> {
    urls.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// A key prefix no other test run uses: `name` and 12 random hex digits.
pub fn unique_prefix(name: &str) -> String {
    format!(
        "{name}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// The configuration of a test store under `prefix` on the R3 test bucket.
pub fn config(prefix: &str, clock: Option<Arc<dyn Clock>>) -> NatsKvConfig {
    NatsKvConfig {
        bucket: BUCKET.into(),
        prefix: prefix.into(),
        replicas: Some(3),
        retention: RETENTION,
        clock,
        ..NatsKvConfig::default()
    }
}

/// A store under `prefix` on the cluster's R3 test bucket.
pub async fn store(servers: &[String], prefix: &str, clock: Option<Arc<dyn Clock>>) -> NatsKvStore {
    NatsKvStore::connect(servers, config(prefix, clock))
        .await
        .expect("open a store on the NATS cluster")
}
