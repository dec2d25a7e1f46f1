//! The store through a proxy that cuts its connections at random moments (before a
//! statement reaches the server, after it did and before its reply, mid-reply): every
//! call returns `Ok` or a retryable error, retries converge, and the invariants hold.
//!
//! The same on every sqlx backend: each backend's `tests/proxy.rs` includes this file
//! (`#[path]`) beside its `common` helpers. Not a test target of its own.

use std::sync::Arc;

use super::common;

use dedup_conformance::proxy::{Converging, CutRates, Proxy, retried_operations_converge};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxy_cuts_leave_the_store_consistent() {
    let url = crate::url_or_skip!();
    let (proxy, through_url) = Proxy::for_url(&url, CutRates::default(), 14)
        .await
        .expect("start the proxy");
    let table = common::unique_table("proxy");
    let direct = common::store_on(&url, &table, None).await;
    let mut through = Vec::new();
    for _ in 0..3 {
        through.push(Arc::new(common::store_on(&through_url, &table, None).await));
    }
    proxy.set_cutting(true);
    retried_operations_converge(through, &direct, &proxy, &Converging::default()).await;
}
