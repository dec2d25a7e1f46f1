//! `RedisStore` (standalone Redis and Valkey) through a proxy that cuts its connections at random moments
//! (before a script reaches the server, after it did and before its reply, mid-reply):
//! every call returns `Ok` or a retryable error, retries converge, and the invariants hold.
//!
//! Redis Cluster is not run through the proxy: cluster clients follow the nodes' own
//! addresses (`CLUSTER SLOTS`, `MOVED`), which bypass a single proxy.

mod common;

use std::sync::Arc;

use common::{RETENTION, Target, unique_prefix};
use dedup_conformance::proxy::{Converging, CutRates, Proxy, retried_operations_converge};
use dedup_redis::RedisConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxy_cuts_leave_redis_consistent() {
    for target in Target::standalones("proxy_cuts_leave_redis_consistent") {
        let (server, url) = match &target {
            Target::Standalone(server, url) => (*server, url.clone()),
            Target::Cluster(..) => unreachable!("standalones"),
        };
        println!("{}:", target.name());
        let (proxy, through_url) = Proxy::for_url(&url, CutRates::default(), 14)
            .await
            .expect("start the proxy");
        let config = RedisConfig {
            prefix: unique_prefix("proxy"),
            retention: RETENTION,
            ..RedisConfig::default()
        };
        let direct = target.open(config.clone()).await;
        let mut through = Vec::new();
        for _ in 0..3 {
            through.push(Arc::new(
                Target::Standalone(server, through_url.clone())
                    .open(config.clone())
                    .await,
            ));
        }
        proxy.set_cutting(true);
        retried_operations_converge(through, &direct, &proxy, &Converging::default()).await;
    }
}
