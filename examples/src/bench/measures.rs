//! The three measures, the same for every backend.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key, MAX_BATCH_LEN, PurgeOptions,
};
use serde_json::{Map, Value, json};

use super::driver::{Run, drive, percentile_ms};
use super::target::{Raw, Target};
use super::{MAX_ROUNDS, Names, Params, Result};

/// The lease every bench claim asks for (never runs out during the bench).
const LEASE: Duration = Duration::from_secs(30);

/// How far the purge store's clock jumps after the prefill, and the retention the purge
/// uses: the prefilled records are past it, the records claimed after the jump are not.
const CLOCK_JUMP: Duration = Duration::from_secs(2 * 3600);
const PURGE_RETENTION: Duration = Duration::from_secs(3600);

/// One line of the result.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Row {
    /// `sqlite`, `postgres`, `redis`, `redis-cluster`.
    pub(crate) backend: &'static str,
    /// `claim_commit`, `batch`, `claim_p50_during_purge`, `claim_p99_during_purge`.
    pub(crate) measure: &'static str,
    /// Unit of `library` and `baseline`: `msgs/s` or `ms`.
    pub(crate) unit: &'static str,
    /// The library's figure: its throughput, or its claim+commit latency during a purge.
    pub(crate) library: f64,
    /// What it is compared with: the raw driver's throughput, or the latency without purge.
    pub(crate) baseline: f64,
    /// `library / baseline`. Throughput: 1.0 is the backend's physical limit, higher is
    /// better. Latency: 1.0 means the purge does not slow claims down, higher is worse.
    pub(crate) ratio: f64,
    /// Named figures and the setup, as context.
    #[serde(flatten)]
    pub(crate) details: Map<String, Value>,
}

/// Every measure on `target`.
pub(crate) async fn run(target: &Target, params: &Params, names: &Names) -> Result<Vec<Row>> {
    let bench = Bench {
        target,
        params,
        run: &names.run,
    };
    let mut rows = vec![bench.claim_commit().await?, bench.batch().await?];
    rows.extend(bench.purge_latency().await?);
    Ok(rows)
}

struct Bench<'a> {
    target: &'a Target,
    params: &'a Params,
    run: &'a str,
}

fn message_id(i: usize) -> String {
    format!("m{i}")
}

impl Bench<'_> {
    /// A consumer nobody used before.
    fn consumer(&self, what: &str) -> Arc<str> {
        format!("bench-{}-{what}", self.run).into()
    }

    /// Measure 1: claim then commit, one message at a time.
    async fn claim_commit(&self) -> Result<Row> {
        let (p, store, raw) = (self.params, &self.target.store, &self.target.raw);
        let lib = |what: String, n: usize| {
            single(
                Arc::clone(store),
                self.consumer(&what),
                p.concurrency,
                move |i| i < n,
            )
        };
        let baseline = |what: String, n: usize| {
            raw_single(Arc::clone(raw), self.consumer(&what), p.concurrency, n)
        };
        lib("warm-lib".into(), p.warmup).await?;
        baseline("warm-raw".into(), p.warmup).await?;
        let (lib_run, raw_run) = best_of(
            p,
            |round| lib(format!("single-lib-{round}"), p.messages),
            |round| baseline(format!("single-raw-{round}"), p.messages),
        )
        .await?;
        Ok(self.throughput_row("claim_commit", p.messages, &lib_run, &raw_run, Map::new()))
    }

    /// Measure 2: `claim_many` + `commit_many` against raw batched statements.
    async fn batch(&self) -> Result<Row> {
        let (p, store, raw) = (self.params, &self.target.store, &self.target.raw);
        let lib = |what: String, n: usize| {
            batches(
                Arc::clone(store),
                self.consumer(&what),
                p.concurrency,
                n,
                p.batch,
            )
        };
        let baseline = |what: String, n: usize| {
            raw_batches(
                Arc::clone(raw),
                self.consumer(&what),
                p.concurrency,
                n,
                p.batch,
            )
        };
        lib("warm-batch-lib".into(), p.warmup).await?;
        baseline("warm-batch-raw".into(), p.warmup).await?;
        let (lib_run, raw_run) = best_of(
            p,
            |round| lib(format!("batch-lib-{round}"), p.batch_messages),
            |round| baseline(format!("batch-raw-{round}"), p.batch_messages),
        )
        .await?;
        let mut details = Map::new();
        details.insert("batch".into(), json!(p.batch));
        Ok(self.throughput_row("batch", p.batch_messages, &lib_run, &raw_run, details))
    }

    fn throughput_row(
        &self,
        measure: &'static str,
        messages: usize,
        lib: &Run,
        raw: &Run,
        mut details: Map<String, Value>,
    ) -> Row {
        let (library, baseline) = (lib.throughput(messages), raw.throughput(messages));
        details.insert("library_msgs_per_s".into(), json!(library));
        details.insert("raw_msgs_per_s".into(), json!(baseline));
        details.insert("library_secs".into(), json!(lib.elapsed.as_secs_f64()));
        details.insert("raw_secs".into(), json!(raw.elapsed.as_secs_f64()));
        self.row(measure, "msgs/s", library, baseline, messages, details)
    }

    fn row(
        &self,
        measure: &'static str,
        unit: &'static str,
        library: f64,
        baseline: f64,
        messages: usize,
        mut details: Map<String, Value>,
    ) -> Row {
        details.insert("messages".into(), json!(messages));
        details.insert("concurrency".into(), json!(self.params.concurrency));
        details.insert("setup".into(), json!(self.target.setup));
        Row {
            backend: self.target.backend,
            measure,
            unit,
            library,
            baseline,
            ratio: library / baseline,
            details,
        }
    }

    /// Measure 3: claim+commit latency of a stream of fresh keys, alone and while a purge
    /// deletes `purge_rows` completed records.
    async fn purge_latency(&self) -> Result<[Row; 2]> {
        let p = self.params;
        let (store, clock) = (&self.target.purge_store, &self.target.clock);
        let prefill = self.consumer("old");
        batches(
            Arc::clone(store),
            prefill,
            p.concurrency,
            p.purge_rows,
            MAX_BATCH_LEN,
        )
        .await?;
        // The prefilled records are now 2 h old; the retention of the purge is 1 h.
        clock.advance(CLOCK_JUMP);
        let stream = |what: &str, more: Box<dyn Fn(usize) -> bool + Send + Sync>| {
            single(Arc::clone(store), self.consumer(what), p.concurrency, more)
        };
        let (n, warmup) = (p.messages, p.warmup.max(1));
        stream("warm-purge", Box::new(move |i| i < warmup)).await?;
        let alone = stream("alone", Box::new(move |i| i < n)).await?;

        let purging = Arc::new(AtomicBool::new(true));
        let purge = {
            let store = Arc::clone(store);
            // Cleared however the purge ends (also by a panic), so the stream stops.
            let running = Running(Arc::clone(&purging));
            let options = PurgeOptions::older_than(PURGE_RETENTION).batch_size(p.purge_batch);
            tokio::spawn(async move {
                let started = Instant::now();
                let report = store.purge(&options).await;
                let ended = Instant::now();
                drop(running);
                report.map(|r| (r, started, ended))
            })
        };
        // At least `n` claims, and on until the purge is over.
        let during = {
            let purging = Arc::clone(&purging);
            stream(
                "during",
                Box::new(move |i| i < n || purging.load(Ordering::SeqCst)),
            )
            .await?
        };
        let (report, purge_started, purge_ended) = purge.await??;
        if report.completed != p.purge_rows as u64 || report.expired != 0 {
            return Err(format!(
                "the purge removed {report:?}, expected exactly the {} prefilled records",
                p.purge_rows
            )
            .into());
        }
        // Only the claims that ran while the purge did.
        let mut during_latencies: Vec<Duration> = during
            .samples
            .iter()
            .filter(|s| s.started < purge_ended && s.started + s.latency > purge_started)
            .map(|s| s.latency)
            .collect();
        let mut alone_latencies: Vec<Duration> = alone.samples.iter().map(|s| s.latency).collect();

        // Leave the purge store empty (Redis keeps no table to drop).
        clock.advance(Duration::from_secs(60));
        store
            .purge(&PurgeOptions::older_than(Duration::ZERO))
            .await?;

        let purge_ms = (purge_ended - purge_started).as_secs_f64() * 1000.0;
        let mut row = |measure: &'static str, q: f64| {
            let during_ms = percentile_ms(&mut during_latencies, q);
            let alone_ms = percentile_ms(&mut alone_latencies, q);
            let mut details = Map::new();
            details.insert("during_ms".into(), json!(during_ms));
            details.insert("alone_ms".into(), json!(alone_ms));
            details.insert("purge_rows".into(), json!(p.purge_rows));
            details.insert("purged".into(), json!(report.completed));
            details.insert("purge_batches".into(), json!(report.batches));
            details.insert("purge_ms".into(), json!(purge_ms));
            details.insert("samples_during".into(), json!(during_latencies.len()));
            details.insert("samples_alone".into(), json!(alone_latencies.len()));
            self.row(measure, "ms", during_ms, alone_ms, n, details)
        };
        Ok([
            row("claim_p50_during_purge", 0.50),
            row("claim_p99_during_purge", 0.99),
        ])
    }
}

/// Clears its flag when dropped.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Run `lib` and `raw` in rounds, alternating which goes first, at least `params.rounds`
/// times and on until they ran `params.min_secs` together (at most [`MAX_ROUNDS`]); the
/// fastest run of each.
async fn best_of<L, LF, R, RF>(params: &Params, lib: L, raw: R) -> Result<(Run, Run)>
where
    L: Fn(usize) -> LF,
    LF: Future<Output = Result<Run>>,
    R: Fn(usize) -> RF,
    RF: Future<Output = Result<Run>>,
{
    let faster = |best: Option<Run>, run: Run| match best {
        Some(b) if b.elapsed <= run.elapsed => b,
        _ => run,
    };
    let (mut best_lib, mut best_raw) = (None, None);
    let mut spent = Duration::ZERO;
    let mut round = 0;
    while round < params.rounds.max(1)
        || (spent.as_secs_f64() < params.min_secs && round < MAX_ROUNDS)
    {
        let (l, r) = if round % 2 == 0 {
            let r = raw(round).await?;
            (lib(round).await?, r)
        } else {
            let l = lib(round).await?;
            (l, raw(round).await?)
        };
        spent += l.elapsed + r.elapsed;
        round += 1;
        best_lib = Some(faster(best_lib, l));
        best_raw = Some(faster(best_raw, r));
    }
    match (best_lib, best_raw) {
        (Some(l), Some(r)) => Ok((l, r)),
        _ => unreachable!("at least one round runs"),
    }
}

/// Claim then commit fresh keys of `consumer` through the library, one at a time per task.
async fn single(
    store: Arc<dyn DedupStore>,
    consumer: Arc<str>,
    concurrency: usize,
    more: impl Fn(usize) -> bool + Send + Sync + 'static,
) -> Result<Run> {
    drive(concurrency, more, move |_, i| {
        let (store, consumer) = (Arc::clone(&store), Arc::clone(&consumer));
        async move {
            let key = Key::new(&*consumer, message_id(i))?;
            let lease = match store.claim(&key, &ClaimOptions::lease(LEASE)).await? {
                Claim::Acquired(lease) => lease,
                other => return Err(format!("claim of fresh key {key:?}: {other:?}").into()),
            };
            store.commit(&lease, None).await?;
            Ok(())
        }
    })
    .await
}

/// The raw baseline of [`single`].
async fn raw_single(
    raw: Arc<dyn Raw>,
    consumer: Arc<str>,
    concurrency: usize,
    n: usize,
) -> Result<Run> {
    drive(
        concurrency,
        move |i| i < n,
        move |worker, i| raw.claim_commit(worker, Arc::clone(&consumer), message_id(i)),
    )
    .await
}

/// The message ids of batch `b` of `total` messages in batches of `size`, or `None` past
/// the end.
fn batch_ids(b: usize, total: usize, size: usize) -> Option<Vec<String>> {
    let start = b.checked_mul(size).filter(|s| *s < total)?;
    Some((start..total.min(start + size)).map(message_id).collect())
}

/// `claim_many` then `commit_many` of `total` fresh keys in batches of `size`.
async fn batches(
    store: Arc<dyn DedupStore>,
    consumer: Arc<str>,
    concurrency: usize,
    total: usize,
    size: usize,
) -> Result<Run> {
    let size = size.max(1);
    drive(
        concurrency,
        move |b| b * size < total,
        move |_, b| {
            let (store, consumer) = (Arc::clone(&store), Arc::clone(&consumer));
            async move {
                let ids = batch_ids(b, total, size).unwrap_or_default();
                let requests = ids
                    .into_iter()
                    .map(|id| {
                        Key::new(&*consumer, id)
                            .map(|key| ClaimRequest::new(key, ClaimOptions::lease(LEASE)))
                    })
                    .collect::<dedup_core::Result<Vec<_>>>()?;
                let mut commits = Vec::with_capacity(requests.len());
                for (request, claim) in requests.iter().zip(store.claim_many(&requests).await?) {
                    match claim? {
                        Claim::Acquired(lease) => commits.push(CommitRequest {
                            lease,
                            outcome: None,
                        }),
                        other => {
                            return Err(
                                format!("claim of fresh key {:?}: {other:?}", request.key).into()
                            );
                        }
                    }
                }
                for committed in store.commit_many(&commits).await? {
                    committed?;
                }
                Ok(())
            }
        },
    )
    .await
}

/// The raw baseline of [`batches`].
async fn raw_batches(
    raw: Arc<dyn Raw>,
    consumer: Arc<str>,
    concurrency: usize,
    total: usize,
    size: usize,
) -> Result<Run> {
    let size = size.max(1);
    drive(
        concurrency,
        move |b| b * size < total,
        move |worker, b| {
            let ids = batch_ids(b, total, size).unwrap_or_default();
            raw.batch(worker, Arc::clone(&consumer), ids)
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cover_every_message_once() {
        assert_eq!(batch_ids(0, 5, 2).unwrap(), ["m0", "m1"]);
        assert_eq!(batch_ids(2, 5, 2).unwrap(), ["m4"]);
        assert_eq!(batch_ids(3, 5, 2), None);
    }
}
