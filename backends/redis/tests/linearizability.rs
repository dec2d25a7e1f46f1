//! Recorded concurrent histories of `RedisStore` (four handles, on the server's `TIME`
//! with real expiry), standalone and Redis Cluster, are linearizable.

mod common;

use std::sync::Arc;

use common::{RETENTION, Target, unique_prefix};
use dedup_conformance::linearizability::{Workload, assert_linearizable};
use dedup_core::SystemClock;
use dedup_redis::RedisConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn linearizable_redis_histories() {
    for target in Target::all("linearizable_redis_histories") {
        let config = RedisConfig {
            prefix: unique_prefix("linearizable"),
            retention: RETENTION,
            ..RedisConfig::default()
        };
        let mut stores = Vec::new();
        for _ in 0..4 {
            stores.push(Arc::new(target.open(config.clone()).await));
        }
        println!("{}:", target.name());
        // The server's TIME reads the same wall clock as this process (loopback).
        assert_linearizable(stores, Arc::new(SystemClock), &Workload::default()).await;
    }
}
