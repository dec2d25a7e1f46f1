//! The measures, the same for every backend (the transactional ones on SQL backends).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key, MAX_BATCH_LEN, PurgeOptions,
};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::driver::{Run, drive, percentile_ms};
use super::target::{Raw, Target, Transactional, TxFlavor};
use super::{MAX_ROUNDS, Names, Params, Result};

/// The lease every bench claim asks for (never runs out during the bench).
const LEASE: Duration = Duration::from_secs(30);

/// How far the purge store's clock jumps after the prefill, and the retention the purge
/// uses: the prefilled records are past it, the records claimed after the jump are not.
const CLOCK_JUMP: Duration = Duration::from_secs(2 * 3600);
const PURGE_RETENTION: Duration = Duration::from_secs(3600);

/// The purge rate the issue asks for at least (rows/s): the baseline of `purge_rows_per_s`.
pub(crate) const PURGE_RATE_FLOOR: f64 = 5000.0;

/// Tasks that prefill the purge store at least (the prefill is not measured).
const PREFILL_CONCURRENCY: usize = 4;

/// One line of the result.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Row {
    /// `sqlite`, `postgres` (durable settings), `postgres-nosync`, `redis`,
    /// `redis-cluster`, `valkey`, `valkey-cluster`.
    pub(crate) backend: &'static str,
    /// What was measured: `claim_commit`, `claim_commit_duplicates`, `batch`,
    /// `tx_claim_vs_insert_alone` and `tx_claim_vs_two_transactions` (SQL backends),
    /// `claim_p50_during_purge`, `claim_p99_during_purge`, `purge_rows_per_s`.
    pub(crate) measure: &'static str,
    /// Concurrent tasks issuing the measured work.
    pub(crate) concurrency: usize,
    /// Unit of `library` and `baseline`: `msgs/s`, `ms` or `rows/s`.
    pub(crate) unit: &'static str,
    /// The library's figure: its throughput, its claim+commit latency during a purge, or
    /// the purge's rate.
    pub(crate) library: f64,
    /// What it is compared with: the raw driver's throughput, the latency without purge,
    /// or the rate the issue asks for at least.
    pub(crate) baseline: f64,
    /// `library / baseline`. Throughput and purge rate: higher is better (1.0 is the
    /// backend's physical limit for throughput). Latency: 1.0 means the purge does not
    /// slow claims down, higher is worse.
    pub(crate) ratio: f64,
    /// Named figures and the setup, as context.
    #[serde(flatten)]
    pub(crate) details: Map<String, Value>,
}

/// Every measure on `target`, at each concurrency of `params`.
pub(crate) async fn run(target: &Target, params: &Params, names: &Names) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &concurrency in &params.concurrency {
        let bench = Bench {
            target,
            params,
            concurrency,
            run: &names.run,
        };
        eprintln!("  {} at concurrency {concurrency}...", target.backend);
        let wanted = |m: &str| {
            params
                .only
                .as_ref()
                .is_none_or(|only| only.iter().any(|o| o == m))
        };
        if wanted("claim_commit") {
            rows.push(bench.claim_commit(0).await?);
        }
        if wanted("claim_commit_duplicates") {
            rows.push(bench.claim_commit(params.duplicate_percent).await?);
        }
        if wanted("batch") {
            rows.push(bench.batch().await?);
        }
        if let (Some(tx), true) = (&target.tx, wanted("tx")) {
            rows.extend(bench.transactional(tx).await?);
        }
        if wanted("purge") {
            rows.extend(bench.purge_latency().await?);
        }
    }
    Ok(rows)
}

struct Bench<'a> {
    target: &'a Target,
    params: &'a Params,
    concurrency: usize,
    run: &'a str,
}

pub(crate) fn message_id(i: usize) -> String {
    format!("m{i}")
}

/// Delivery `i` of a stream in which `percent` % of the deliveries are redeliveries: the
/// message it carries, and whether that message was delivered before. Redeliveries are
/// spread evenly (exactly `percent` of every 100 deliveries) and carry the message
/// delivered first half-way back in the stream, usually processed by then (at high
/// concurrency an early one may still be in flight: a duplicate either way).
fn delivery(i: usize, percent: usize) -> (usize, bool) {
    let percent = percent.min(90);
    let redeliveries_before = |i: usize| i * percent / 100;
    let fresh_before = i - redeliveries_before(i);
    if redeliveries_before(i + 1) > redeliveries_before(i) {
        (fresh_before / 2, true)
    } else {
        (fresh_before, false)
    }
}

/// A measured run by round number, as [`best_of`] takes them.
pub(crate) type Contender<'a> = Box<dyn Fn(usize) -> BoxFuture<'static, Result<Run>> + 'a>;

pub(crate) fn contender<'a>(
    run: impl Fn(usize) -> BoxFuture<'static, Result<Run>> + 'a,
) -> Contender<'a> {
    Box::new(run)
}

impl Bench<'_> {
    /// A consumer nobody used before.
    fn consumer(&self, what: &str) -> Arc<str> {
        format!("bench-{}-c{}-{what}", self.run, self.concurrency).into()
    }

    /// Measures 1 and 2: claim then commit, one message at a time; `duplicate_percent` %
    /// of the deliveries redeliver a message seen before (claimed, then left alone).
    async fn claim_commit(&self, duplicate_percent: usize) -> Result<Row> {
        let (p, c, store, raw) = (
            self.params,
            self.concurrency,
            &self.target.store,
            &self.target.raw,
        );
        let lib = |what: String, n: usize| {
            single(
                Arc::clone(store),
                self.consumer(&what),
                c,
                duplicate_percent,
                move |i| i < n,
            )
            .boxed()
        };
        let baseline = |what: String, n: usize| {
            raw_single(
                Arc::clone(raw),
                self.consumer(&what),
                c,
                duplicate_percent,
                n,
            )
            .boxed()
        };
        let tag = if duplicate_percent == 0 {
            "single"
        } else {
            "dup"
        };
        lib(format!("warm-{tag}-lib"), p.warmup).await?;
        baseline(format!("warm-{tag}-raw"), p.warmup).await?;
        let runs = best_of(
            p,
            vec![
                contender(|round| lib(format!("{tag}-lib-{round}"), p.messages)),
                contender(|round| baseline(format!("{tag}-raw-{round}"), p.messages)),
            ],
        )
        .await?;
        let mut details = Map::new();
        let measure = if duplicate_percent == 0 {
            "claim_commit"
        } else {
            details.insert("duplicate_percent".into(), json!(duplicate_percent.min(90)));
            "claim_commit_duplicates"
        };
        Ok(self.throughput_row(measure, p.messages, &runs[0], &runs[1], "raw", details))
    }

    /// Measure 3: `claim_many` + `commit_many` against raw batched statements.
    async fn batch(&self) -> Result<Row> {
        let (p, c, store, raw) = (
            self.params,
            self.concurrency,
            &self.target.store,
            &self.target.raw,
        );
        let lib = |what: String, n: usize| {
            batches(Arc::clone(store), self.consumer(&what), c, n, p.batch).boxed()
        };
        let baseline = |what: String, n: usize| {
            raw_batches(Arc::clone(raw), self.consumer(&what), c, n, p.batch).boxed()
        };
        lib("warm-batch-lib".into(), p.warmup).await?;
        baseline("warm-batch-raw".into(), p.warmup).await?;
        let runs = best_of(
            p,
            vec![
                contender(|round| lib(format!("batch-lib-{round}"), p.batch_messages)),
                contender(|round| baseline(format!("batch-raw-{round}"), p.batch_messages)),
            ],
        )
        .await?;
        let mut details = Map::new();
        details.insert("batch".into(), json!(p.batch));
        Ok(self.throughput_row(
            "batch",
            p.batch_messages,
            &runs[0],
            &runs[1],
            "raw",
            details,
        ))
    }

    /// Measures 4 to 8: a message processed inside one transaction with the library's
    /// transactional claim, against the business insert alone and against the
    /// two-transaction (MassTransit-style) inbox; with the library's `TxInbox`, against
    /// the hand-written transactional claim (what counting attempts costs) and the
    /// business insert alone; and `TxInbox` against its own steps written by hand (what
    /// the wrapper costs).
    async fn transactional(&self, tx: &Arc<dyn Transactional>) -> Result<[Row; 5]> {
        let (p, c) = (self.params, self.concurrency);
        let flavor = |flavor: TxFlavor, what: String, n: usize| {
            let (tx, consumer) = (Arc::clone(tx), self.consumer(&what));
            drive(
                c,
                move |i| i < n,
                move |worker, i| tx.process(flavor, worker, Arc::clone(&consumer), message_id(i)),
            )
            .boxed()
        };
        let flavors = [
            (TxFlavor::Library, "tx-lib"),
            (TxFlavor::BusinessOnly, "tx-alone"),
            (TxFlavor::TwoTransactions, "tx-two"),
            (TxFlavor::Inbox, "tx-inbox"),
            (TxFlavor::InboxAsHandWritten, "tx-inbox-as-hand"),
            (TxFlavor::HandWritten, "tx-hand"),
        ];
        for (f, what) in flavors {
            flavor(f, format!("warm-{what}"), p.warmup).await?;
        }
        let flavor = &flavor;
        let runs = best_of(
            p,
            flavors
                .iter()
                .map(|&(f, what)| {
                    contender(move |round| flavor(f, format!("{what}-{round}"), p.messages))
                })
                .collect(),
        )
        .await?;
        let (lib, alone, two, inbox) = (&runs[0], &runs[1], &runs[2], &runs[3]);
        let (inbox_as_hand, hand) = (&runs[4], &runs[5]);
        Ok([
            self.throughput_row(
                "tx_claim_vs_insert_alone",
                p.messages,
                lib,
                alone,
                "insert_alone",
                Map::new(),
            ),
            self.throughput_row(
                "tx_claim_vs_two_transactions",
                p.messages,
                lib,
                two,
                "two_transactions",
                Map::new(),
            ),
            self.throughput_row(
                "tx_inbox_vs_claim_in_tx",
                p.messages,
                inbox,
                lib,
                "claim_in_tx",
                Map::new(),
            ),
            self.throughput_row(
                "tx_inbox_vs_insert_alone",
                p.messages,
                inbox,
                alone,
                "insert_alone",
                Map::new(),
            ),
            self.throughput_row(
                "tx_inbox_vs_hand_written",
                p.messages,
                inbox_as_hand,
                hand,
                "hand_written",
                Map::new(),
            ),
        ])
    }

    /// A throughput row: `lib` against `base` (named `base_name` in the details).
    fn throughput_row(
        &self,
        measure: &'static str,
        messages: usize,
        lib: &Run,
        base: &Run,
        base_name: &str,
        mut details: Map<String, Value>,
    ) -> Row {
        let (library, baseline) = (lib.throughput(messages), base.throughput(messages));
        details.insert("library_msgs_per_s".into(), json!(library));
        details.insert(format!("{base_name}_msgs_per_s"), json!(baseline));
        details.insert("library_secs".into(), json!(lib.elapsed.as_secs_f64()));
        details.insert(
            format!("{base_name}_secs"),
            json!(base.elapsed.as_secs_f64()),
        );
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
        details.insert("setup".into(), json!(self.target.setup));
        Row {
            backend: self.target.backend,
            measure,
            concurrency: self.concurrency,
            unit,
            library,
            baseline,
            ratio: library / baseline,
            details,
        }
    }

    /// Measures 6 to 8: claim+commit latency of a stream of fresh keys, alone and while a
    /// purge with default options (paced) deletes `purge_rows` completed records, and the
    /// purge's rate.
    async fn purge_latency(&self) -> Result<[Row; 3]> {
        let (p, c) = (self.params, self.concurrency);
        let (store, clock) = (&self.target.purge_store, &self.target.clock);
        let prefill = self.consumer("old");
        batches(
            Arc::clone(store),
            prefill,
            c.max(PREFILL_CONCURRENCY),
            p.purge_rows,
            MAX_BATCH_LEN,
        )
        .await?;
        // The prefilled records are now 2 h old; the retention of the purge is 1 h.
        clock.advance(CLOCK_JUMP);
        let stream = |what: &str, more: Box<dyn Fn(usize) -> bool + Send + Sync>| {
            single(Arc::clone(store), self.consumer(what), c, 0, more)
        };
        let (n, warmup) = (p.messages, p.warmup.max(1));
        stream("warm-purge", Box::new(move |i| i < warmup)).await?;
        let alone = stream("alone", Box::new(move |i| i < n)).await?;

        let purging = Arc::new(AtomicBool::new(true));
        let mut options = PurgeOptions::older_than(PURGE_RETENTION);
        if let Some(size) = p.purge_batch {
            options = options.batch_size(size);
        }
        let purge = {
            let store = Arc::clone(store);
            // Cleared however the purge ends (also by a panic), so the stream stops.
            let running = Running(Arc::clone(&purging));
            let options = options.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let report = store.purge(&options).await;
                let ended = Instant::now();
                drop(running);
                report.map(|r| (r, started, ended))
            })
        };
        // At least `n` claims, and on until the purge is over or the stream ran its time
        // (claims at full speed can leave a paced purge little room: it then ends alone).
        let stream_deadline = Instant::now() + Duration::from_secs_f64(p.purge_stream_secs);
        let during = {
            let purging = Arc::clone(&purging);
            stream(
                "during",
                Box::new(move |i| {
                    i < n || (purging.load(Ordering::SeqCst) && Instant::now() < stream_deadline)
                }),
            )
            .await?
        };
        let stream_ended = Instant::now();
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

        // Leave the purge store empty for the next concurrency (Redis keeps no table to
        // drop).
        clock.advance(Duration::from_secs(60));
        store
            .purge(&PurgeOptions::older_than(Duration::ZERO).unpaced())
            .await?;

        let mut purge_details = Map::new();
        purge_details.insert("purge_rows".into(), json!(p.purge_rows));
        purge_details.insert("purged".into(), json!(report.completed));
        purge_details.insert("purge_batches".into(), json!(report.batches));
        purge_details.insert("purge_secs".into(), json!(report.elapsed.as_secs_f64()));
        purge_details.insert("purge_rows_per_s".into(), json!(report.rate()));
        purge_details.insert("purge_options".into(), json!(format!("{options:?}")));
        purge_details.insert(
            "purge_outlived_stream".into(),
            json!(purge_ended > stream_ended),
        );
        let mut row = |measure: &'static str, q: f64| {
            let during_ms = percentile_ms(&mut during_latencies, q);
            let alone_ms = percentile_ms(&mut alone_latencies, q);
            let mut details = purge_details.clone();
            details.insert("during_ms".into(), json!(during_ms));
            details.insert("alone_ms".into(), json!(alone_ms));
            details.insert("samples_during".into(), json!(during_latencies.len()));
            details.insert("samples_alone".into(), json!(alone_latencies.len()));
            self.row(measure, "ms", during_ms, alone_ms, n, details)
        };
        let (p50, p99) = (
            row("claim_p50_during_purge", 0.50),
            row("claim_p99_during_purge", 0.99),
        );
        let mut details = purge_details;
        details.insert(
            "baseline_is".into(),
            json!("the rate the issue asks for at least"),
        );
        let rate = self.row(
            "purge_rows_per_s",
            "rows/s",
            report.rate(),
            PURGE_RATE_FLOOR,
            p.purge_rows,
            details,
        );
        Ok([p50, p99, rate])
    }
}

/// Clears its flag when dropped.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Run the contenders in rounds, rotating which goes first, at least `params.rounds`
/// times and on until they ran `params.min_secs` together (at most [`MAX_ROUNDS`]); the
/// fastest run of each, in the contenders' order.
pub(crate) async fn best_of(params: &Params, contenders: Vec<Contender<'_>>) -> Result<Vec<Run>> {
    let n = contenders.len();
    let mut best: Vec<Option<Run>> = (0..n).map(|_| None).collect();
    let mut spent = Duration::ZERO;
    let mut round = 0;
    while round < params.rounds.max(1)
        || (spent.as_secs_f64() < params.min_secs && round < MAX_ROUNDS)
    {
        for k in 0..n {
            let which = (round + k) % n;
            let run = contenders[which](round).await?;
            spent += run.elapsed;
            if best[which].as_ref().is_none_or(|b| run.elapsed < b.elapsed) {
                best[which] = Some(run);
            }
        }
        round += 1;
    }
    Ok(best.into_iter().flatten().collect())
}

/// Claim then commit keys of `consumer` through the library, one at a time per task;
/// `duplicate_percent` % of the deliveries are redeliveries (see [`delivery`]), whose
/// claim answers `Completed` (or `InFlight`) and is left at that. Without redeliveries, a
/// key that is not acquired fails the run; with them, a first delivery may find its key
/// taken by a redelivery that overtook it (other tasks run concurrently), which is the same
/// work in the other order.
pub(crate) async fn single(
    store: Arc<dyn DedupStore>,
    consumer: Arc<str>,
    concurrency: usize,
    duplicate_percent: usize,
    more: impl Fn(usize) -> bool + Send + Sync + 'static,
) -> Result<Run> {
    drive(concurrency, more, move |_, i| {
        let (store, consumer) = (Arc::clone(&store), Arc::clone(&consumer));
        async move {
            let (message, _) = delivery(i, duplicate_percent);
            let key = Key::new(&*consumer, message_id(message))?;
            match store.claim(&key, &ClaimOptions::lease(LEASE)).await? {
                Claim::Acquired(lease) => store.commit(&lease, None).await?,
                Claim::Completed { .. } | Claim::InFlight { .. } if duplicate_percent > 0 => {}
                other => return Err(format!("claim of fresh key {key:?}: {other:?}").into()),
            }
            Ok(())
        }
    })
    .await
}

/// The raw baseline of [`single`] (a duplicate is what a claim that is not acquired is to
/// the library).
pub(crate) async fn raw_single(
    raw: Arc<dyn Raw>,
    consumer: Arc<str>,
    concurrency: usize,
    duplicate_percent: usize,
    n: usize,
) -> Result<Run> {
    drive(
        concurrency,
        move |i| i < n,
        move |worker, i| {
            let (message, _) = delivery(i, duplicate_percent);
            let done = raw.claim_commit(worker, Arc::clone(&consumer), message_id(message));
            async move {
                match done.await? {
                    true => Ok(()),
                    false if duplicate_percent > 0 => Ok(()),
                    false => {
                        Err(format!("raw claim of fresh message {message}: a duplicate").into())
                    }
                }
            }
        },
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
pub(crate) async fn batches(
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
pub(crate) async fn raw_batches(
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
    fn redeliveries_are_the_given_share_and_repeat_earlier_messages() {
        let deliveries: Vec<_> = (0..1000).map(|i| delivery(i, 30)).collect();
        assert_eq!(deliveries.iter().filter(|(_, r)| *r).count(), 300);
        let mut fresh = 0;
        for &(message, redelivered) in &deliveries {
            if redelivered {
                assert!(
                    message < fresh,
                    "redelivery of {message} before it was sent"
                );
            } else {
                assert_eq!(message, fresh, "fresh messages come in order");
                fresh += 1;
            }
        }
        assert!((0..100).all(|i| delivery(i, 0) == (i, false)));
    }

    #[test]
    fn batches_cover_every_message_once() {
        assert_eq!(batch_ids(0, 5, 2).unwrap(), ["m0", "m1"]);
        assert_eq!(batch_ids(2, 5, 2).unwrap(), ["m4"]);
        assert_eq!(batch_ids(3, 5, 2), None);
    }
}
