//! The scale mode (`bench --scale`, not in CI): what a claim costs when the store already
//! holds many records, and what the default purge of the expired ones does meanwhile.
//!
//! For each store and each size N of `--scale-records`, on a fresh table / key prefix:
//!
//! 1. preload N records through the store on a manual clock, in batches of 1 000 from 16
//!    tasks (`claim_many` + `commit_many`: the store's own rows, written as it writes
//!    them), keyed as a service would be (one consumer, UUID message ids), each batch
//!    claimed a millisecond after the one before, as a consumer's claims spread over time
//!    (a clock standing still would give every record the same `claimed_at`, which no
//!    store in service holds); 30 % of them are then two hours old, past the purge's
//!    retention of an hour;
//! 2. the server settles: it writes back what the bulk preload left to write (a
//!    checkpoint, InnoDB's dirty pages; see [`Sizer::settle`]), as a server that took its
//!    records over days has done;
//! 3. a claim+commit stream of fresh UUID keys of the same consumer: p50 / p99 latency
//!    and the server's CPU per message (see `counted/probe.rs`; the whole server's, so run
//!    on servers of its own);
//! 4. bytes per record: the store's table and indexes (PostgreSQL
//!    `pg_total_relation_size`, MySQL / MariaDB `data_length + index_length` after
//!    `ANALYZE TABLE`, SQLite the pages the preload added, Redis `MEMORY USAGE` of a sample
//!    of keys) against the smallest raw row holding the same key (a two-column table whose
//!    primary key is the key, `WITHOUT ROWID` on SQLite; on Redis a string key of the same
//!    length holding `1` with a TTL). Measured twice: on the preloaded store, whose rows
//!    were written in batches of 1 000 on a manual clock, and, before the preload, on
//!    [`ONE_AT_A_TIME`] records claimed and committed one at a time by the store as an
//!    application opens it (its default clock, a table or key prefix of its own), as a
//!    consumer writes them. The two differ: on PostgreSQL a batch's commits find the pages
//!    its claims filled and write each row's new version elsewhere, with index entries
//!    of its own, where a single commit updates the row in its page; on Redis the manual
//!    clock writes a record with its instants in full, the server's clock a shorter one;
//! 5. the default (paced) purge of the 30 % expired records while the same claim stream
//!    runs: claim p99 during it against step 3's, its rows/s, the claim p99 of a stream
//!    right after, and the bytes left per remaining record.

pub(crate) mod size;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dedup_core::{Claim, ClaimOptions, DedupStore, Key, ManualClock, PurgeOptions, PurgeReport};
use serde::Serialize;

use super::counted::Probe;
use super::driver::{Run, drive, percentile_ms};
use super::workloads::{Ids, aged_batches};
use super::{Names, Result, Target};

pub(crate) use size::{Sizer, Which};

/// The consumer of every scale key: one service's inbox.
const CONSUMER: &str = "orders-service";
/// Share of the preloaded records past the purge's retention, in percent.
const EXPIRED_PERCENT: usize = 30;
/// How old the expired share is when the stream runs, and the purge's retention.
const CLOCK_JUMP: Duration = Duration::from_secs(2 * 3600);
const PURGE_RETENTION: Duration = Duration::from_secs(3600);
/// Preload: keys per batch and concurrent tasks.
const PRELOAD_BATCH: usize = 1000;
const PRELOAD_TASKS: usize = 16;
/// The lease of every scale claim.
const LEASE: Duration = Duration::from_secs(30);
/// Records the store as an application opens it writes one claim+commit at a time, to
/// size them (step 4).
pub(crate) const ONE_AT_A_TIME: usize = 50_000;
/// Longest the claim stream runs alongside the purge once it made its messages.
const PURGE_STREAM_SECS: f64 = 300.0;

/// One line of the scale table: one store at one size.
#[derive(Debug, Serialize)]
pub(crate) struct ScaleRow {
    /// The backend, as the other modes name it.
    pub(crate) backend: &'static str,
    /// Records preloaded.
    pub(crate) records: usize,
    /// Seconds the preload took (context).
    pub(crate) preload_secs: f64,
    /// Seconds the server took to write back what the preload left (see
    /// [`Sizer::settle`]); `None`: nothing to wait for, or the server refused.
    pub(crate) settle_secs: Option<f64>,
    /// Claim+commit concurrency of the streams.
    pub(crate) concurrency: usize,
    /// Claim+commit latency of the stream, p50 and p99, in ms.
    pub(crate) claim_p50_ms: f64,
    /// See `claim_p50_ms`.
    pub(crate) claim_p99_ms: f64,
    /// Server CPU per claim+commit, µs (the whole server's; `None`: not readable).
    pub(crate) server_cpu_us: Option<f64>,
    /// Bytes per record of the store, and of the smallest raw row holding the key.
    pub(crate) store_bytes: Option<f64>,
    /// See `store_bytes`.
    pub(crate) raw_bytes: Option<f64>,
    /// Bytes per record of [`ONE_AT_A_TIME`] records written one claim+commit at a time
    /// by the store as an application opens it, and of the raw rows of their keys.
    pub(crate) single_bytes: Option<f64>,
    /// See `single_bytes`.
    pub(crate) single_raw_bytes: Option<f64>,
    /// Expired records the purge removed.
    pub(crate) purged: u64,
    /// The purge's rate, rows/s.
    pub(crate) purge_rows_per_s: f64,
    /// Claim p99 while the purge ran, ms, and the claims that ran meanwhile.
    pub(crate) purge_claim_p99_ms: f64,
    /// See `purge_claim_p99_ms`.
    pub(crate) purge_claims: usize,
    /// Claim p99 of a stream right after the purge, ms.
    pub(crate) after_claim_p99_ms: f64,
    /// Bytes per remaining record after the purge (what it left behind).
    pub(crate) store_bytes_after: Option<f64>,
}

/// One store at one size: the steps of the module's description.
pub(crate) async fn measure(
    target: &Target,
    probe: &dyn Probe,
    sizer: &dyn Sizer,
    names: &Names,
    records: usize,
    concurrency: usize,
    messages: usize,
) -> Result<ScaleRow> {
    let (store, clock) = (&target.purge_store, &target.clock);
    stream(&target.store, concurrency, |i| i < ONE_AT_A_TIME).await?;
    let (single_bytes, single_raw_bytes) = match sizer.sizes(names, Which::Default).await? {
        Some((store_total, raw_total)) => (
            Some(store_total / ONE_AT_A_TIME as f64),
            Some(raw_total / ONE_AT_A_TIME as f64),
        ),
        None => (None, None),
    };
    let started = Instant::now();
    let expired = records * EXPIRED_PERCENT / 100;
    preload(store, clock, expired).await?;
    clock.advance(CLOCK_JUMP);
    preload(store, clock, records - expired).await?;
    let preload_secs = started.elapsed().as_secs_f64();
    eprintln!("  {} records preloaded in {preload_secs:.0} s", records);
    // A server that refuses (no privilege for `CHECKPOINT` or `SET GLOBAL`) is measured
    // unsettled, and the line says so.
    let settle_secs = match sizer.settle().await {
        Ok(Some((what, took))) => {
            eprintln!("  settled ({what}) in {:.1} s", took.as_secs_f64());
            Some(took.as_secs_f64())
        }
        Ok(None) => None,
        Err(e) => {
            eprintln!("  could not let the server settle ({e}); measuring it unsettled");
            None
        }
    };

    stream(store, concurrency, |i| i < 100).await?; // warm-up
    let before = probe.read().await?;
    let alone = stream(store, concurrency, move |i| i < messages).await?;
    let after = probe.read().await?;
    let server_cpu_us = after
        .since(&before)
        .cpu
        .map(|cpu| cpu.as_secs_f64() * 1e6 / messages as f64);
    let mut alone_latencies = latencies(&alone, None);
    let claim_p50_ms = percentile_ms(&mut alone_latencies, 0.50);
    let claim_p99_ms = percentile_ms(&mut alone_latencies, 0.99);

    let held = records + messages + 100;
    let (store_bytes, raw_bytes) = match sizer.sizes(names, Which::Scale).await? {
        Some((store_total, raw_total)) if records > 0 => (
            Some(store_total / held as f64),
            Some(raw_total / held as f64),
        ),
        _ => (None, None),
    };

    let (report, during) = purge_under_stream(store, concurrency, messages).await?;
    if report.total() != expired as u64 {
        return Err(format!(
            "the purge removed {report:?}, expected exactly the {expired} expired records"
        )
        .into());
    }
    let purge_claims = during.len();
    let mut during = during;
    let purge_claim_p99_ms = percentile_ms(&mut during, 0.99);
    let after_run = stream(store, concurrency, move |i| i < messages).await?;
    let after_claim_p99_ms = percentile_ms(&mut latencies(&after_run, None), 0.99);
    let left = held - expired + purge_claims + messages;
    let store_bytes_after = match sizer.sizes(names, Which::Scale).await? {
        Some((store_total, _)) if records > 0 => Some(store_total / left as f64),
        _ => None,
    };
    Ok(ScaleRow {
        backend: target.backend,
        records,
        preload_secs,
        settle_secs,
        concurrency,
        claim_p50_ms,
        claim_p99_ms,
        server_cpu_us,
        store_bytes,
        raw_bytes,
        single_bytes,
        single_raw_bytes,
        purged: report.total(),
        purge_rows_per_s: report.rate(),
        purge_claim_p99_ms,
        purge_claims,
        after_claim_p99_ms,
        store_bytes_after,
    })
}

/// A key of the scale consumer with a fresh UUID message id.
fn fresh_key() -> Result<Key> {
    Ok(Key::new(CONSUMER, uuid::Uuid::new_v4().to_string())?)
}

/// Claim and commit `n` fresh keys in batches, the clock moving on before each
/// ([`aged_batches`]).
async fn preload(store: &Arc<dyn DedupStore>, clock: &Arc<ManualClock>, n: usize) -> Result<()> {
    aged_batches(
        Arc::clone(store),
        Arc::clone(clock),
        CONSUMER.into(),
        PRELOAD_TASKS,
        n,
        PRELOAD_BATCH,
        Ids::Random,
    )
    .await?;
    Ok(())
}

/// Claim then commit fresh keys one at a time from `concurrency` tasks while `more(i)`.
async fn stream(
    store: &Arc<dyn DedupStore>,
    concurrency: usize,
    more: impl Fn(usize) -> bool + Send + Sync + 'static,
) -> Result<Run> {
    let store = Arc::clone(store);
    drive(concurrency, more, move |_, _| {
        let store = Arc::clone(&store);
        async move {
            let key = fresh_key()?;
            match store.claim(&key, &ClaimOptions::lease(LEASE)).await? {
                Claim::Acquired(lease) => store.commit(&lease, None).await?,
                other => return Err(format!("claim of fresh key {key:?}: {other:?}").into()),
            }
            Ok(())
        }
    })
    .await
}

/// The latencies of `run`'s claims that overlapped `window` (all of them: `None`).
fn latencies(run: &Run, window: Option<(Instant, Instant)>) -> Vec<Duration> {
    run.samples
        .iter()
        .filter(|s| window.is_none_or(|(a, b)| s.started < b && s.started + s.latency > a))
        .map(|s| s.latency)
        .collect()
}

/// The default purge of the expired records while fresh claims stream: its report and
/// the latencies of the claims that overlapped it.
async fn purge_under_stream(
    store: &Arc<dyn DedupStore>,
    concurrency: usize,
    messages: usize,
) -> Result<(PurgeReport, Vec<Duration>)> {
    let purging = Arc::new(AtomicBool::new(true));
    let purge = {
        let store = Arc::clone(store);
        let purging = Arc::clone(&purging);
        tokio::spawn(async move {
            let started = Instant::now();
            let report = store
                .purge(&PurgeOptions::older_than(PURGE_RETENTION))
                .await;
            let ended = Instant::now();
            purging.store(false, Ordering::SeqCst);
            report.map(|r| (r, started, ended))
        })
    };
    let deadline = Instant::now() + Duration::from_secs_f64(PURGE_STREAM_SECS);
    let during = {
        let purging = Arc::clone(&purging);
        stream(store, concurrency, move |i| {
            i < messages || (purging.load(Ordering::SeqCst) && Instant::now() < deadline)
        })
        .await
    };
    let (report, started, ended) = purge.await??;
    let during = during?;
    Ok((report, latencies(&during, Some((started, ended)))))
}

/// The table's columns and a line under it.
pub(crate) fn table(rows: &[ScaleRow]) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let headers = vec![
        "backend",
        "records",
        "c",
        "claim p50 ms",
        "claim p99 ms",
        "p99 vs empty",
        "srv cpu µs/msg",
        "B/record (raw)",
        "B/record 1-by-1 (raw)",
        "purged",
        "purge rows/s",
        "p99 during purge",
        "p99 after",
        "B/record after",
    ];
    let opt = |v: Option<f64>, digits: usize| match v {
        Some(v) => format!("{v:.digits$}"),
        None => "n/a".into(),
    };
    let cells = rows
        .iter()
        .map(|r| {
            let empty = rows
                .iter()
                .find(|e| e.backend == r.backend && e.records == 0)
                .map(|e| e.claim_p99_ms);
            vec![
                r.backend.to_owned(),
                r.records.to_string(),
                r.concurrency.to_string(),
                format!("{:.2}", r.claim_p50_ms),
                format!("{:.2}", r.claim_p99_ms),
                opt(empty.map(|e| r.claim_p99_ms / e), 2),
                opt(r.server_cpu_us, 0),
                format!("{} ({})", opt(r.store_bytes, 0), opt(r.raw_bytes, 0)),
                format!(
                    "{} ({})",
                    opt(r.single_bytes, 0),
                    opt(r.single_raw_bytes, 0)
                ),
                r.purged.to_string(),
                format!("{:.0}", r.purge_rows_per_s),
                format!(
                    "{:.2} ({:.1}x)",
                    r.purge_claim_p99_ms,
                    r.purge_claim_p99_ms / r.claim_p99_ms
                ),
                format!("{:.2}", r.after_claim_p99_ms),
                opt(r.store_bytes_after, 0),
            ]
        })
        .collect();
    (headers, cells)
}
