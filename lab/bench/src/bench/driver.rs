//! Running one operation from C concurrent tasks and timing every call.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::Result;

/// One timed call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    /// When the call started.
    pub(crate) started: Instant,
    /// How long it took.
    pub(crate) latency: Duration,
}

/// What a run did.
#[derive(Debug)]
pub(crate) struct Run {
    /// From the start of the first call to the end of the last.
    pub(crate) elapsed: Duration,
    /// Every call, in no particular order.
    pub(crate) samples: Vec<Sample>,
}

impl Run {
    /// `messages` handled in all, per second of the run.
    pub(crate) fn throughput(&self, messages: usize) -> f64 {
        messages as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Run `op(worker, item)` from `concurrency` tokio tasks; workers take items 0, 1, 2, ...
/// in turn while `more(item)` says so. The first failing call fails the run.
pub(crate) async fn drive<F, Fut, M>(concurrency: usize, more: M, op: F) -> Result<Run>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
    M: Fn(usize) -> bool + Send + Sync + 'static,
{
    let op = Arc::new(op);
    let more = Arc::new(more);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|worker| {
            let (op, more, next) = (Arc::clone(&op), Arc::clone(&more), Arc::clone(&next));
            tokio::spawn(async move {
                let mut samples = Vec::new();
                loop {
                    let item = next.fetch_add(1, Ordering::Relaxed);
                    if !more(item) {
                        return Ok::<_, super::BoxError>(samples);
                    }
                    let started = Instant::now();
                    op(worker, item).await?;
                    samples.push(Sample {
                        started,
                        latency: started.elapsed(),
                    });
                }
            })
        })
        .collect();
    let mut samples = Vec::new();
    for worker in futures::future::join_all(workers).await {
        samples.extend(worker??);
    }
    Ok(Run {
        elapsed: start.elapsed(),
        samples,
    })
}

/// The `q`-quantile (0.0..=1.0, nearest rank) of `latencies` in milliseconds; 0 when empty.
pub(crate) fn percentile_ms(latencies: &mut [Duration], q: f64) -> f64 {
    if latencies.is_empty() {
        return 0.0;
    }
    latencies.sort_unstable();
    let rank = ((q * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
    latencies[rank - 1].as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut l: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&mut l, 0.5), 50.0);
        assert_eq!(percentile_ms(&mut l, 0.99), 99.0);
        assert_eq!(percentile_ms(&mut l, 1.0), 100.0);
        assert_eq!(percentile_ms(&mut [], 0.5), 0.0);
    }

    #[tokio::test]
    async fn every_item_runs_once() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        let run = drive(
            3,
            |i| i < 50,
            move |_, i| {
                let s = Arc::clone(&s);
                async move {
                    s.lock().unwrap().push(i);
                    Ok(())
                }
            },
        )
        .await
        .unwrap();
        assert_eq!(run.samples.len(), 50);
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..50).collect::<Vec<_>>());
    }
}
