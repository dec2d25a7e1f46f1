//! [`CostGuard`]: measure operations one at a time through a [`CountingProxy`] and collect
//! every one whose cost changed.

use std::future::Future;
use std::time::{Duration, Instant};

use super::{Cost, CountingProxy, WireCounts, cost_mismatch};

/// How long [`CostGuard::check`] waits for the store's connections to be back in its pool.
const SETTLE: Duration = Duration::from_secs(5);

/// Measures operations through a [`CountingProxy`], one at a time, and fails once at the
/// end ([`finish`](Self::finish)) listing every operation whose cost is not the expected
/// one, so one run shows everything a change moved.
pub struct CostGuard {
    backend: &'static str,
    proxy: CountingProxy,
    settled: Box<dyn Fn() -> bool + Send + Sync>,
    wrong: Vec<String>,
}

impl CostGuard {
    /// A guard for `backend` (named in failures) measuring through `proxy`; `settled`
    /// answers whether the store's pool holds all its connections again (a connection
    /// goes back after sqlx pinged it: waiting for that puts the ping in the count of the
    /// operation that caused it).
    pub fn new(
        backend: &'static str,
        proxy: CountingProxy,
        settled: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Self {
        CostGuard {
            backend,
            proxy,
            settled: Box::new(settled),
            wrong: Vec::new(),
        }
    }

    /// Run `op` (which returns its connections to the pool), wait until they are back,
    /// compare what it cost with `expected`; return its output.
    pub async fn check<T>(
        &mut self,
        operation: &str,
        expected: Cost,
        op: impl Future<Output = T>,
    ) -> T {
        self.measure(operation, expected, op, true).await
    }

    /// [`check`](Self::check) for an operation on a connection the caller holds (its own
    /// transaction): nothing goes back to the pool, nothing to wait for.
    pub async fn check_holding<T>(
        &mut self,
        operation: &str,
        expected: Cost,
        op: impl Future<Output = T>,
    ) -> T {
        self.measure(operation, expected, op, false).await
    }

    async fn measure<T>(
        &mut self,
        operation: &str,
        expected: Cost,
        op: impl Future<Output = T>,
        settle: bool,
    ) -> T {
        if settle {
            self.settle(operation).await;
        }
        let before = self.proxy.counts();
        let out = op.await;
        if settle {
            self.settle(operation).await;
        }
        let counts: WireCounts = self.proxy.counts() - before;
        println!("{} {operation}: {counts:?}", self.backend);
        assert_eq!(
            counts.connections, 0,
            "{} {operation}: the pool opened a connection while measuring",
            self.backend
        );
        self.wrong.extend(cost_mismatch(
            self.backend,
            operation,
            counts.cost(),
            expected,
        ));
        out
    }

    /// Wait until the store's pool holds all its connections (the pings of what ran
    /// before are done).
    async fn settle(&self, operation: &str) {
        let started = Instant::now();
        while !(self.settled)() {
            assert!(
                started.elapsed() < SETTLE,
                "{} {operation}: the pool did not get its connection back within {SETTLE:?}",
                self.backend
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Panic listing every operation whose cost was not the expected one.
    #[track_caller]
    pub fn finish(self) {
        assert!(
            self.wrong.is_empty(),
            "what an operation costs on the wire changed (if meant, update the expected \
             numbers and the table in BENCHMARKS.md):\n{}",
            self.wrong.join("\n")
        );
    }
}
