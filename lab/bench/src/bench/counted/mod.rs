//! The counted mode of the bench (`bench --counted`): per message (per key for batches),
//! the library and its baseline side by side, in figures that hold on a busy machine:
//! round trips and statements counted at the client (a [`CountingProxy`] between a second
//! copy of the target and its server), the server's own counters (statements, commits,
//! log flushes: [`probe`](mod@probe)), the server's CPU (`/proc` of its processes) and the client's
//! (getrusage), in microseconds. Throughput is printed beside them as an indication only.
//!
//! Each side runs alone: a warm-up on keys of its own, then `--messages` (batches:
//! `--batch-messages`) on fresh keys between two readings of the counters; then the same
//! again, shorter, through the proxy, for the wire counts (the proxy's own CPU would
//! otherwise be the client's).

pub(crate) mod cpu;
mod probe;

use std::sync::Arc;
use std::time::Duration;

use dedup_conformance::counting::{CountingProxy, Protocol, WireCounts};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::driver::{Run, drive};
use super::target::{Target, TxFlavor};
use super::workloads::{batches, message_id, raw_batches, raw_single, single};
use super::{Names, Params, Result};

pub(crate) use probe::Probe;

/// Messages each side runs through the proxy for the wire counts (fewer than `--messages`:
/// the wire counts are exact per message, the proxy is slow).
pub(crate) const WIRE_MESSAGES: usize = 200;

/// One side of one measure, per message (per key for batches).
#[derive(Debug, serde::Serialize)]
pub(crate) struct CountedRow {
    /// The bench backend name (`postgres`, `mysql`, `valkey`, ...).
    pub(crate) backend: &'static str,
    /// `claim_commit`, `batch`, `tx`.
    pub(crate) measure: &'static str,
    /// Concurrent tasks.
    pub(crate) concurrency: usize,
    /// `library`, `raw`, `TxInbox`, `claim_in_tx`, `hand_written`, `insert_alone`.
    pub(crate) side: &'static str,
    /// The side this one's CPU is compared with (`None`: a baseline itself).
    pub(crate) compared_with: Option<&'static str>,
    /// Throughput of the counted run (an indication only).
    pub(crate) msgs_per_s: f64,
    /// Round trips per message counted at the client, pool pings apart.
    pub(crate) round_trips: Option<f64>,
    /// Pool pings per message (sqlx pings a connection it takes back).
    pub(crate) pings: Option<f64>,
    /// Statements (PostgreSQL `Q`/`E`, MySQL `COM_QUERY`/`COM_STMT_EXECUTE`, RESP
    /// commands) per message, counted at the client.
    pub(crate) client_statements: Option<f64>,
    /// Statements or commands per message by the server's counters.
    pub(crate) server_statements: Option<f64>,
    /// Transactions committed per message (server counters).
    pub(crate) commits: Option<f64>,
    /// Log flushes per message (server counters).
    pub(crate) log_flushes: Option<f64>,
    /// Server CPU per message, microseconds.
    pub(crate) server_cpu_us: Option<f64>,
    /// Client CPU per message, microseconds.
    pub(crate) client_cpu_us: f64,
    /// Server + client CPU per message, microseconds.
    pub(crate) cpu_us: f64,
    /// `cpu_us` over the compared side's.
    pub(crate) cpu_ratio: Option<f64>,
    /// Context: messages counted, setup.
    #[serde(flatten)]
    pub(crate) details: Map<String, Value>,
}

/// Runs `n` items of one side on a target (`tag` names fresh keys).
type Runner<'a> = Box<dyn Fn(&'a Target, String, usize) -> BoxFuture<'static, Result<Run>> + 'a>;

struct Side<'a> {
    name: &'static str,
    compared_with: Option<&'static str>,
    run: Runner<'a>,
}

fn side<'a>(
    name: &'static str,
    compared_with: Option<&'static str>,
    run: impl Fn(&'a Target, String, usize) -> BoxFuture<'static, Result<Run>> + 'a,
) -> Side<'a> {
    Side {
        name,
        compared_with,
        run: Box::new(run),
    }
}

/// A target opened twice: directly (CPU, server counters) and through a counting proxy
/// (wire counts), with the probe of its server.
pub(crate) struct Counted {
    /// Opened on the server's own address.
    pub(crate) direct: Target,
    /// Opened through `proxy` (`None`: no network, or not countable).
    pub(crate) proxied: Option<(Target, CountingProxy)>,
    /// The server's counters.
    pub(crate) probe: Box<dyn Probe>,
}

/// Open the probe of `url`'s server (`None`: no server).
pub(crate) async fn probe(url: Option<&str>) -> Result<Box<dyn Probe>> {
    match url {
        Some(url) => probe::open(url).await,
        None => Ok(Box::new(probe::NoServer)),
    }
}

/// The URL of `url`'s server through a new counting proxy.
pub(crate) async fn proxy(url: &str) -> Result<Option<(CountingProxy, String)>> {
    // NATS KV: through the first server alone (the others are the cluster's).
    #[cfg(feature = "nats-kv")]
    if let Some(server) = super::nats_kv::first_server(url) {
        let proxy = CountingProxy::start(server, Protocol::Nats).await?;
        let through = super::nats_kv::through(url, &proxy.addr().to_string());
        return Ok(through.map(|through| (proxy, through)));
    }
    let Some(protocol) = Protocol::of_url(url) else {
        return Ok(None);
    };
    Ok(Some(CountingProxy::for_url(url, protocol).await?))
}

/// Every counted measure on `counted`, at each concurrency of `params`.
pub(crate) async fn run(
    counted: &Counted,
    params: &Params,
    names: &Names,
) -> Result<Vec<CountedRow>> {
    let probe = &*counted.probe;
    // What one reading costs the server's counters: read twice in a row.
    let first = probe.read().await?;
    let overhead = probe.read().await?.since(&first);
    let wanted = |m: &str| {
        params
            .only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == m))
    };
    let mut rows = Vec::new();
    for &c in &params.concurrency {
        eprintln!("  {} counted at concurrency {c}...", counted.direct.backend);
        let mut measures: Vec<(&'static str, usize, Vec<Side<'_>>)> = Vec::new();
        if wanted("claim_commit") {
            measures.push((
                "claim_commit",
                params.messages,
                vec![
                    side("library", Some("raw"), move |t: &Target, tag, n| {
                        single(Arc::clone(&t.store), tag.into(), c, 0, move |i| i < n).boxed()
                    }),
                    side("raw", None, move |t: &Target, tag, n| {
                        raw_single(Arc::clone(&t.raw), tag.into(), c, 0, n).boxed()
                    }),
                ],
            ));
        }
        if wanted("batch") {
            let size = params.batch;
            measures.push((
                "batch",
                params.batch_messages,
                vec![
                    side("library", Some("raw"), move |t: &Target, tag, n| {
                        batches(Arc::clone(&t.store), tag.into(), c, n, size).boxed()
                    }),
                    side("raw", None, move |t: &Target, tag, n| {
                        raw_batches(Arc::clone(&t.raw), tag.into(), c, n, size).boxed()
                    }),
                ],
            ));
        }
        if wanted("tx") && counted.direct.tx.is_some() {
            let flavor = |flavor: TxFlavor| tx_flavor(c, flavor);
            measures.push((
                "tx",
                params.messages,
                vec![
                    side("TxInbox", Some("claim_in_tx"), flavor(TxFlavor::Inbox)),
                    side(
                        "claim_in_tx",
                        Some("insert_alone"),
                        flavor(TxFlavor::Library),
                    ),
                    side(
                        "hand_written",
                        Some("claim_in_tx"),
                        flavor(TxFlavor::HandWritten),
                    ),
                    side("insert_alone", None, flavor(TxFlavor::BusinessOnly)),
                ],
            ));
        }
        if wanted("outbox") && counted.direct.tx.is_some() {
            measures.push((
                "outbox_enqueue",
                params.messages,
                vec![
                    side(
                        "enqueue",
                        Some("insert_alone"),
                        tx_flavor(c, TxFlavor::Enqueue),
                    ),
                    side("insert_alone", None, tx_flavor(c, TxFlavor::BusinessOnly)),
                ],
            ));
        }
        for (measure, n, sides) in measures {
            let mut found = Vec::new();
            let sides = sides.into_iter().filter(|s| {
                params
                    .sides
                    .as_ref()
                    .is_none_or(|only| only.iter().any(|o| o == s.name))
            });
            for s in &sides.collect::<Vec<_>>() {
                let tag =
                    |pass: &str| format!("bench-{}-n-c{c}-{measure}-{}-{pass}", names.run, s.name);
                (s.run)(&counted.direct, tag("warm"), params.warmup).await?;
                let before = probe.read().await?;
                let client_before = cpu::client();
                let run = (s.run)(&counted.direct, tag("counted"), n).await?;
                let client = cpu::client().saturating_sub(client_before);
                let server = probe.read().await?.since(&before).less(&overhead);
                let wire = match &counted.proxied {
                    Some((target, proxy)) => {
                        (s.run)(target, tag("wire-warm"), params.warmup.min(WIRE_MESSAGES)).await?;
                        let before = proxy.counts();
                        let m = WIRE_MESSAGES.min(n);
                        (s.run)(target, tag("wire"), m).await?;
                        // The pool's pings after the last call.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Some((proxy.counts() - before, m))
                    }
                    None => None,
                };
                found.push(row(
                    counted.direct.backend,
                    measure,
                    c,
                    s,
                    n,
                    &run,
                    client,
                    &server,
                    wire,
                ));
            }
            // Each side's CPU against the side it is compared with.
            let totals: Vec<(&str, f64)> = found.iter().map(|r| (r.side, r.cpu_us)).collect();
            for r in &mut found {
                if let Some(other) = r.compared_with
                    && let Some((_, base)) = totals.iter().find(|(name, _)| *name == other)
                {
                    r.cpu_ratio = Some(r.cpu_us / base);
                }
            }
            rows.extend(found);
        }
    }
    Ok(rows)
}

/// A side that processes its messages the `flavor` way (the target's transactional mode).
fn tx_flavor(
    c: usize,
    flavor: TxFlavor,
) -> impl Fn(&Target, String, usize) -> BoxFuture<'static, Result<Run>> {
    move |t: &Target, tag: String, n: usize| {
        let tx = t.tx.clone();
        let consumer: Arc<str> = tag.into();
        async move {
            let tx = tx.ok_or("no transactional mode")?;
            drive(
                c,
                move |i| i < n,
                move |worker, i| tx.process(flavor, worker, Arc::clone(&consumer), message_id(i)),
            )
            .await
        }
        .boxed()
    }
}

#[allow(clippy::too_many_arguments)] // one row's figures, each from its own source
fn row(
    backend: &'static str,
    measure: &'static str,
    concurrency: usize,
    side: &Side<'_>,
    n: usize,
    run: &Run,
    client: Duration,
    server: &probe::Reading,
    wire: Option<(WireCounts, usize)>,
) -> CountedRow {
    let per = |v: f64| v / n as f64;
    let server_cpu_us = server.cpu.map(|d| per(d.as_secs_f64() * 1e6));
    let client_cpu_us = per(client.as_secs_f64() * 1e6);
    let per_wire = |f: fn(&WireCounts) -> u64| wire.map(|(w, m)| f(&w) as f64 / m as f64);
    let mut details = Map::new();
    details.insert("messages".into(), json!(n));
    if let Some((_, m)) = wire {
        details.insert("wire_messages".into(), json!(m));
    }
    CountedRow {
        backend,
        measure,
        concurrency,
        side: side.name,
        compared_with: side.compared_with,
        msgs_per_s: run.throughput(n),
        round_trips: per_wire(|w| w.round_trips),
        pings: per_wire(|w| w.pings),
        client_statements: per_wire(|w| w.statements),
        server_statements: server.statements.map(per),
        commits: server.commits.map(per),
        log_flushes: server.log_flushes.map(per),
        server_cpu_us,
        client_cpu_us,
        cpu_us: client_cpu_us + server_cpu_us.unwrap_or(0.0),
        cpu_ratio: None,
        details,
    }
}

/// The counted rows as a table's cells.
pub(crate) fn table(rows: &[CountedRow]) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let opt = |v: Option<f64>, digits: usize| match v {
        Some(v) => format!("{v:.digits$}"),
        None => "n/a".into(),
    };
    let headers = vec![
        "backend",
        "measure",
        "c",
        "side",
        "msgs/s",
        "rt",
        "pings",
        "stmts",
        "srv stmts",
        "commits",
        "flushes",
        "srv µs",
        "cli µs",
        "cpu µs",
        "vs",
        "cpu ratio",
    ];
    let cells = rows
        .iter()
        .map(|r| {
            vec![
                r.backend.to_owned(),
                r.measure.to_owned(),
                r.concurrency.to_string(),
                r.side.to_owned(),
                format!("{:.0}", r.msgs_per_s),
                opt(r.round_trips, 2),
                opt(r.pings, 2),
                opt(r.client_statements, 2),
                opt(r.server_statements, 2),
                opt(r.commits, 2),
                opt(r.log_flushes, 3),
                opt(r.server_cpu_us, 0),
                format!("{:.0}", r.client_cpu_us),
                format!("{:.0}", r.cpu_us),
                r.compared_with.unwrap_or("").to_owned(),
                opt(r.cpu_ratio, 2),
            ]
        })
        .collect();
    (headers, cells)
}
