//! What the `dedup` tests share: a conformance factory over `dedup::open`, the servers'
//! URLs (through `dedup_conformance::server_url`: missing ones skip with a message, or fail
//! under `DEDUP_TEST_STRICT=1`), and reading an error's whole chain.

#![allow(dead_code)] // each test binary uses its own subset

use std::sync::Arc;

use async_trait::async_trait;
use dedup::DedupStore;
use dedup::store::Clock;
use dedup_conformance::{StoreFactory, TestContext};

/// Opens `base` + `&param=<namespace>` (`prefix` gets a trailing `:`) with the clause's
/// clock, through `dedup::open_with_clock`: the URL path users take.
pub struct UrlFactory {
    pub base: String,
    pub param: &'static str,
}

impl UrlFactory {
    pub fn url(&self, ctx: &TestContext) -> String {
        let sep = if self.base.contains('?') { '&' } else { '?' };
        let value = if self.param == "prefix" {
            format!("{}:", ctx.namespace)
        } else {
            ctx.namespace.clone()
        };
        format!("{}{sep}{}={value}", self.base, self.param)
    }
}

#[async_trait]
impl StoreFactory for UrlFactory {
    type Store = Arc<dyn DedupStore>;

    async fn open(&self, ctx: &TestContext) -> Self::Store {
        let clock = Arc::clone(&ctx.clock) as Arc<dyn Clock>;
        dedup::open_with_clock(&self.url(ctx), clock)
            .await
            .unwrap_or_else(|e| {
                panic!("open {}: {}", dedup::url::redact(&self.url(ctx)), chain(&e))
            })
    }
}

/// A few clauses of the conformance suite, run directly: enough to show a store opened
/// this way claims, commits, rejects stale leases and releases as the contract says.
pub async fn smoke<F: StoreFactory>(factory: &F) {
    use dedup_conformance::clauses;
    clauses::first_claim_acquires(factory).await;
    clauses::live_lease_gives_in_flight(factory).await;
    clauses::commit_completes_the_key(factory).await;
    clauses::stale_commit_after_takeover_is_rejected(factory).await;
    clauses::release_lets_the_next_claim_acquire_at_once(factory).await;
}

/// Every message of `e`'s chain, joined by " / ".
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        parts.push(c.to_string());
        cause = c.source();
    }
    parts.join(" / ")
}

/// Whether some error in `e`'s chain is a `T` for which `pred` holds.
pub fn chain_has<T: std::error::Error + 'static>(
    e: &(dyn std::error::Error + 'static),
    pred: impl Fn(&T) -> bool,
) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<T>().is_some_and(&pred) {
            return true;
        }
        cause = c.source();
    }
    false
}

/// `DEDUP_REDIS_CLUSTER_URLS` as a `redis+cluster://h:p,h:p` URL.
pub fn cluster_url() -> Option<String> {
    dedup_conformance::server_url("DEDUP_REDIS_CLUSTER_URLS")
        .map(|urls| dedup::redis::cluster_url(&urls))
}

/// The server URL in `var`, or `None` after saying the test is skipped.
pub fn server(var: &str, test: &str) -> Option<String> {
    let url = dedup_conformance::server_url(var);
    if url.is_none() {
        eprintln!("SKIPPED {test}: {var} is not set");
    }
    url
}
