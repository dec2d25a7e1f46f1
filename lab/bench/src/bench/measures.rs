//! The measures, the same for every backend (the transactional ones on SQL backends).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dedup_core::{DedupStore, MAX_BATCH_LEN, PurgeOptions};
use futures::FutureExt;
use serde_json::{Map, Value, json};

use super::driver::{Run, drive, percentile_ms};
use super::rounds::{best_of, contender};
use super::target::{Target, Transactional, TxFlavor};
use super::workloads::{Ids, aged_batches, batches, message_id, raw_batches, raw_single, single};
use super::{Names, Params, Result};

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
    /// `sqlite`, `postgres` (durable settings), `postgres-nosync`, `mysql`, `galera`,
    /// `redis`, `redis-cluster`, `valkey`, `valkey-cluster`, `nats-kv` (R1),
    /// `nats-kv-r3`.
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
        aged_batches(
            Arc::clone(store),
            Arc::clone(clock),
            prefill,
            c.max(PREFILL_CONCURRENCY),
            p.purge_rows,
            MAX_BATCH_LEN,
            Ids::Numbered,
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
