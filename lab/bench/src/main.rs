//! The benchmark: for each backend, in one run on one machine, the library against the
//! same work issued raw through the backend's driver (the physical limit), with fresh keys
//! and with 30 % redeliveries; batches against raw batches; on SQL backends the
//! transactional claim against the business insert alone and against a two-transaction
//! (MassTransit-style) inbox; and claim latency while a default-options purge runs against
//! claim latency without it, plus the purge's rate. Every measure runs at each
//! concurrency asked for (1 and 16 by default). It prints ratios; absolute times are
//! context only (they depend on the machine).
//!
//! ```text
//! cargo run --release -p dedup-bench --features full -- [--quick] [--json] [--store URL]...
//!     [--concurrency 1,16] [--messages N] [--batch B] [--purge-rows P] ...
//! ```
//!
//! `--counted` measures costs instead of throughput (see `bench/counted/mod.rs` and
//! BENCHMARKS.md): per message, round trips, statements, commits, log flushes, server and
//! client CPU, for the library and its baseline side by side.
//!
//! `--quick` takes a few minutes for the four backends (purge of 100 000 records); without
//! it, the full run purges 1 000 000 and measures longer.
//!
//! Without `--store`, it benches SQLite in a temporary file plus every test server each
//! compiled-in backend's descriptor names in the environment (`dedup::url::backends()`:
//! `DEDUP_POSTGRES_URL`, `DEDUP_MYSQL_URL`, `DEDUP_REDIS_URL`, `DEDUP_REDIS_CLUSTER_URLS`
//! (comma-separated node URLs), `DEDUP_VALKEY_URL`, `DEDUP_VALKEY_CLUSTER_URLS`), the
//! first node of `DEDUP_GALERA_URLS` (a MariaDB Galera cluster: rows `galera`), and NATS
//! JetStream KV: an R1 bucket `dedup_bench_r1` on `DEDUP_NATS_URL` (rows `nats-kv`) and
//! an R3 bucket `dedup_bench_r3` on `DEDUP_NATS_CLUSTER_URLS` (rows `nats-kv-r3`). Each
//! run works on tables / key prefixes of its own (`dedup_bench_<id>`,
//! `dedup-bench:<id>:`, `bench-<id>-`): SQL tables are dropped at the end, Redis keys
//! expire by themselves after ten minutes (the purge measure's are purged), NATS KV keys
//! are purged at the end.
//!
//! Two groups run once, not per store (by default without `--store`; `--only outbox`,
//! `--only brokers` pick them): `outbox` (an `enqueue` inside a business transaction
//! against the insert alone on SQLite, PostgreSQL and MySQL / MariaDB, the relay against
//! raw confirmed publishes to RabbitMQ, commit-to-publish latency with `NOTIFY` against
//! polling alone: `DEDUP_POSTGRES_URL`, `DEDUP_MYSQL_URL`, `DEDUP_AMQP_URL`) and `brokers`
//! (per broker, consumer throughput of the raw client, of a hand-written `Inbox::handle`
//! loop and of the `dedup-brokers` adapter with `with_inbox`: `DEDUP_AMQP_URL`,
//! `DEDUP_REDIS_URL`, `DEDUP_NATS_URL`, `DEDUP_KAFKA_BROKERS`,
//! `DEDUP_PUBSUB_EMULATOR_HOST`). Their queues, streams, topics and schemas are removed at
//! the end.
//!
//! PostgreSQL is benched once per `--postgres-durability` setting (default `durable,fast`):
//! the bench sets the server's `fsync`, `synchronous_commit` and `full_page_writes`
//! (`ALTER SYSTEM`, reload; a superuser is needed), checks them with `SHOW` on a fresh
//! connection, names the rows `postgres` (durable) or `postgres-nosync`, prints the settings
//! in the setup line, and resets them at the end (`ALTER SYSTEM RESET`). `server` leaves
//! the server as it is (the rows are named by what `SHOW` reports).

mod bench;

use clap::Parser;
use dedup_lab::report::{print_json, print_table};

use bench::{Names, Params, Row, Variant};

/// Library against raw driver, batches against raw batches, the transactional claim
/// against its alternatives, claim latency during a purge.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// A store to bench (repeatable): `sqlite:PATH`, `postgres://...`, `mysql://...` (a
    /// Galera node's too), `redis://...`, `redis+cluster://h1:p1,h2:p2`,
    /// `nats-kv://h1:p1,h2:p2/?bucket=B&replicas=3`. Default: SQLite in a temporary file
    /// plus the servers in DEDUP_POSTGRES_URL / DEDUP_MYSQL_URL / DEDUP_REDIS_URL /
    /// DEDUP_REDIS_CLUSTER_URLS / DEDUP_GALERA_URLS / DEDUP_NATS_URL /
    /// DEDUP_NATS_CLUSTER_URLS, and the outbox and brokers groups (with `--store`, those
    /// run only when `--only` names them).
    #[arg(long = "store")]
    stores: Vec<String>,
    /// The quick run (a few minutes): fewer messages, shorter measures, a purge of
    /// 100 000 records instead of 1 000 000. Explicit options below override it.
    #[arg(long)]
    quick: bool,
    /// Messages claimed and committed one at a time per measured run (library, and again
    /// raw); also the length of each latency stream of the purge measure [quick: 1000,
    /// full: 4000].
    #[arg(long)]
    messages: Option<usize>,
    /// Concurrent tasks: every measure runs at each of these, in turn.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 16])]
    concurrency: Vec<usize>,
    /// The share of redeliveries in the duplicate-heavy traffic, in percent (0 to 90).
    #[arg(long, default_value_t = 30)]
    duplicate_percent: usize,
    /// Messages per batch.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Messages of the batch measure (default: 5 x --messages).
    #[arg(long)]
    batch_messages: Option<usize>,
    /// Completed records the purge deletes while claims run [quick: 100 000, full:
    /// 1 000 000].
    #[arg(long)]
    purge_rows: Option<usize>,
    /// Largest records per purge batch (default: the purge's default options).
    #[arg(long)]
    purge_batch: Option<usize>,
    /// Longest the claim stream runs alongside the purge once it made `--messages` claims,
    /// in seconds: a purge still running then finishes alone (the row says so with
    /// `purge_outlived_stream`) [quick: 20, full: 120].
    #[arg(long)]
    purge_stream_secs: Option<f64>,
    /// Runs of each throughput measure at least (contenders alternating); the best run of
    /// each counts [quick: 2, full: 3].
    #[arg(long)]
    rounds: Option<usize>,
    /// Repeat each throughput measure (up to 10 rounds) until its contenders together
    /// ran this many seconds [quick: 1, full: 3].
    #[arg(long)]
    min_secs: Option<f64>,
    /// Messages handled before each measured part, to open connections.
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// Give the raw SQL tables the store's purge indexes too (splits the gap into the cost
    /// of the store's schema and the cost of its statements).
    #[arg(long)]
    raw_indexes: bool,
    /// The PostgreSQL settings to bench on, each in turn: `durable` (fsync,
    /// synchronous_commit and full_page_writes on), `fast` (all three off: test servers
    /// only), `server` (as the server is set). The first two are set with `ALTER SYSTEM`
    /// and reset at the end.
    #[arg(long, value_delimiter = ',', default_values = ["durable", "fast"])]
    postgres_durability: Vec<String>,
    /// Run only these measures (comma-separated: claim_commit, claim_commit_duplicates,
    /// batch, tx, purge) and groups (outbox: enqueue cost, relay throughput and
    /// commit-to-publish latency on SQLite, DEDUP_POSTGRES_URL and DEDUP_AMQP_URL;
    /// brokers: consumer throughput on DEDUP_AMQP_URL, DEDUP_REDIS_URL, DEDUP_NATS_URL, DEDUP_PUBSUB_EMULATOR_HOST)
    /// [default: all].
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// PostgreSQL group commit: statements of each kind in flight at once (0: off, every
    /// call on its own statement) [default: the store's default].
    #[arg(long)]
    postgres_group_rounds: Option<usize>,
    /// PostgreSQL's partitioned layout for the store's tables: `COUNT,WINDOW` (e.g.
    /// `6,30m`), as the store URL's `partitions` and `partition_window` [default: the
    /// plain table].
    #[arg(long)]
    postgres_partitions: Option<String>,
    /// Also print one `JSON {...}` line per row.
    #[arg(long)]
    json: bool,
    /// The counted mode: per message, library and baseline side by side, in round trips
    /// and statements (counted at the client through a proxy), the server's statements,
    /// commits and log flushes, server and client CPU in microseconds (measures
    /// claim_commit, batch, tx; see BENCHMARKS.md). Point it at servers of its own: the
    /// server counters are the whole server's. Needs the `counted` feature.
    #[arg(long)]
    counted: bool,
    /// The scale mode (not in CI): per store and per size of --scale-records, claim+commit
    /// latency and server CPU with that many records preloaded (30 % of them expired),
    /// bytes per record against the smallest raw row, and the default purge of the
    /// expired ones under a claim stream (see `bench/scale/mod.rs` and BENCHMARKS.md). The
    /// streams run at the first --concurrency. Needs the `counted` feature.
    #[arg(long)]
    scale: bool,
    /// Counted mode: run only these sides of each measure (comma-separated: library,
    /// raw, TxInbox, claim_in_tx, hand_written, insert_alone, enqueue); brokers: raw,
    /// loop, adapter, each run once and printed without rows [default: all]. One side
    /// alone is what a `valgrind --tool=callgrind` run counts.
    #[arg(long, value_delimiter = ',')]
    sides: Vec<String>,
    /// Records preloaded, each size in turn on a fresh table (--scale).
    #[arg(long, value_delimiter = ',', default_values_t = [0, 1_000_000])]
    scale_records: Vec<usize>,
}

impl Args {
    fn params(&self) -> Result<Params, String> {
        let quick = self.quick;
        let messages = self.messages.unwrap_or(if quick { 1000 } else { 4000 });
        let purge_rows = self
            .purge_rows
            .unwrap_or(if quick { 100_000 } else { 1_000_000 });
        if messages == 0 || purge_rows == 0 || self.concurrency.contains(&0) {
            return Err("--messages, --concurrency and --purge-rows must be at least 1".into());
        }
        if self.concurrency.is_empty() {
            return Err("--concurrency needs at least one value".into());
        }
        if !(1..=dedup_core::MAX_BATCH_LEN).contains(&self.batch) {
            return Err(format!("--batch must be 1..={}", dedup_core::MAX_BATCH_LEN));
        }
        if let Some(bad) = self
            .only
            .iter()
            .find(|m| !MEASURES.contains(&m.as_str()) && !GROUPS.contains(&m.as_str()))
        {
            return Err(format!(
                "--only: {bad:?} is none of {MEASURES:?} nor of the groups {GROUPS:?}"
            ));
        }
        if self.duplicate_percent > 90 {
            return Err("--duplicate-percent must be 0..=90".into());
        }
        Ok(Params {
            messages,
            concurrency: self.concurrency.clone(),
            duplicate_percent: self.duplicate_percent,
            batch: self.batch,
            batch_messages: self.batch_messages.unwrap_or(messages * 5).max(1),
            purge_rows,
            purge_batch: self.purge_batch,
            purge_stream_secs: self
                .purge_stream_secs
                .unwrap_or(if quick { 20.0 } else { 120.0 }),
            rounds: self.rounds.unwrap_or(if quick { 2 } else { 3 }).max(1),
            min_secs: self.min_secs.unwrap_or(if quick { 1.0 } else { 3.0 }),
            warmup: self.warmup,
            raw_indexes: self.raw_indexes,
            postgres_group_rounds: self.postgres_group_rounds,
            postgres_partitions: self.postgres_partitions.clone(),
            only: (!self.only.is_empty()).then(|| self.only.clone()),
            postgres_durability: self
                .postgres_durability
                .iter()
                .map(|d| d.parse())
                .collect::<Result<_, _>>()?,
            sides: (!self.sides.is_empty()).then(|| self.sides.clone()),
        })
    }
}

/// The measures run on each store.
const MEASURES: [&str; 5] = [
    "claim_commit",
    "claim_commit_duplicates",
    "batch",
    "tx",
    "purge",
];

/// The groups that run once on the servers the environment names, not per store.
const GROUPS: [&str; 2] = ["outbox", "brokers"];

/// The stores to bench: `--store` URLs, or the default set (`None`: temporary SQLite).
fn stores(args: &Args) -> Vec<Option<String>> {
    if !args.stores.is_empty() {
        return args.stores.iter().cloned().map(Some).collect();
    }
    // The default (a temporary file of the embedded store), then the test servers.
    let mut stores = vec![None];
    stores.extend(test_server_urls().into_iter().map(Some));
    stores
}

/// The store URLs of the test servers `scripts/services.sh` runs, as its environment
/// names them, for the backends this build has.
fn test_server_urls() -> Vec<String> {
    let mut urls = Vec::new();
    urls.extend(env_url("DEDUP_POSTGRES_URL"));
    urls.extend(env_url("DEDUP_MYSQL_URL"));
    // A Galera cluster is benched through its first node, as an application uses it.
    urls.extend(env_url("DEDUP_GALERA_URLS").and_then(|nodes| {
        let first = nodes.split(',').next()?.trim().to_owned();
        (!first.is_empty()).then_some(first)
    }));
    for (standalone, cluster) in [
        ("DEDUP_REDIS_URL", "DEDUP_REDIS_CLUSTER_URLS"),
        ("DEDUP_VALKEY_URL", "DEDUP_VALKEY_CLUSTER_URLS"),
    ] {
        urls.extend(env_url(standalone));
        #[cfg(feature = "redis")]
        urls.extend(env_url(cluster).map(|nodes| dedup::redis::cluster_url(&nodes)));
        #[cfg(not(feature = "redis"))]
        let _ = cluster;
    }
    // NATS JetStream KV: an R1 bucket on the single server, an R3 bucket on the cluster.
    for (servers, replicas) in [("DEDUP_NATS_URL", 1), ("DEDUP_NATS_CLUSTER_URLS", 3)] {
        #[cfg(feature = "nats-kv")]
        urls.extend(env_url(servers).map(|servers| {
            let bucket = format!("dedup_bench_r{replicas}");
            format!(
                "{}&replicas={replicas}",
                dedup_nats_kv::store_url(&servers, &bucket)
            )
        }));
        #[cfg(not(feature = "nats-kv"))]
        let _ = (servers, replicas);
    }
    // A URL of a backend this build lacks is left out; any other problem is reported
    // when the URL is opened.
    urls.retain(|url| match dedup::StoreUrl::parse(url) {
        Err(e) => !matches!(e.url_problem(), Some(dedup::UrlError::Disabled { .. })),
        Ok(_) => true,
    });
    urls
}

async fn bench_one(
    store: Option<&str>,
    variant: &Variant,
    params: &Params,
) -> Result<Vec<Row>, bench::BoxError> {
    let names = Names::new();
    let target = match store {
        Some(url) => bench::open(url, variant, &names, params).await?,
        None => bench::open_temporary(&names, params).await?,
    };
    eprintln!("bench {} ({})...", target.backend, target.setup);
    let rows = bench::run(&target, params, &names).await;
    let cleaned = target.raw.cleanup().await;
    let rows = rows?;
    cleaned?;
    Ok(rows)
}

#[cfg(feature = "counted")]
async fn counted_one(
    store: Option<&str>,
    variant: &Variant,
    params: &Params,
) -> Result<Vec<bench::counted::CountedRow>, bench::BoxError> {
    use bench::counted;
    let names = Names::new();
    let direct = match store {
        Some(url) => bench::open(url, variant, &names, params).await?,
        None => bench::open_temporary(&names, params).await?,
    };
    let proxied = match store {
        Some(url) => match counted::proxy(url).await? {
            Some((proxy, through)) => {
                let names = Names::new();
                Some((bench::open(&through, variant, &names, params).await?, proxy))
            }
            None => None,
        },
        None => None,
    };
    let probe = counted::probe(store).await?;
    eprintln!(
        "bench counted {} ({}; {}{})...",
        direct.backend,
        direct.setup,
        probe.describe(),
        if proxied.is_some() {
            ""
        } else {
            "; no wire counts"
        }
    );
    let target = counted::Counted {
        direct,
        proxied,
        probe,
    };
    let rows = counted::run(&target, params, &names).await;
    if let Some((proxied, _)) = &target.proxied {
        proxied.raw.cleanup().await?;
    }
    target.direct.raw.cleanup().await?;
    rows
}

#[cfg(feature = "counted")]
async fn run_counted(args: &Args, params: &Params) -> Result<(), Box<dyn std::error::Error>> {
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for store in stores(args) {
        let name = store.as_deref().unwrap_or("the temporary default store");
        for variant in bench::variants(store.as_deref(), params) {
            match counted_one(store.as_deref(), &variant, params).await {
                Ok(found) => rows.extend(found),
                Err(e) => {
                    let e = format!(
                        "counted bench of {}{variant}: {}",
                        dedup::url::redact(name),
                        error_chain(&*e)
                    );
                    eprintln!("{e}");
                    failed.push(e);
                }
            }
        }
    }
    println!();
    let (headers, cells) = bench::counted::table(&rows);
    print_table(&headers, &cells);
    println!(
        "\nper message (batch: per key): rt = round trips and pings = pool pings, stmts = \
         statements, counted at the client through a proxy ({} messages); srv stmts, commits, \
         flushes = the server's counters; srv/cli/cpu µs = server, client, total CPU; cpu ratio \
         = cpu µs / that of the side named in vs. concurrency {:?}, {} messages one by one, {} \
         in batches of {}.",
        bench::counted::WIRE_MESSAGES,
        params.concurrency,
        params.messages,
        params.batch_messages,
        params.batch
    );
    if args.json {
        for row in &rows {
            print_json(row);
        }
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(failed.join("; ").into()),
    }
}

/// The scale mode: each store at each size of `--scale-records`, on fresh names.
#[cfg(feature = "counted")]
async fn run_scale(args: &Args, params: &Params) -> Result<(), Box<dyn std::error::Error>> {
    use bench::scale;
    let concurrency = params.concurrency.first().copied().unwrap_or(16);
    let tmp = tempfile::tempdir()?;
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for store in stores(args) {
        // The sizer reads the file: the default store is a file of this run's own.
        let url =
            store.unwrap_or_else(|| format!("sqlite:{}", tmp.path().join("scale.db").display()));
        let sizer = scale::size::open(&url);
        let probe = bench::counted::probe(Some(&url))
            .await
            .map_err(|e| -> Box<dyn std::error::Error> { e })?;
        for &records in &args.scale_records {
            let names = Names::new();
            let measured = async {
                // The first of the server settings asked for (`--postgres-durability`).
                let variant = bench::variants(Some(&url), params)
                    .into_iter()
                    .next()
                    .unwrap_or(Variant::AsIs);
                let target = bench::open(&url, &variant, &names, params).await?;
                eprintln!(
                    "bench scale {} ({}; {}) with {records} records...",
                    target.backend,
                    target.setup,
                    probe.describe()
                );
                let row = scale::measure(
                    &target,
                    &*probe,
                    &*sizer,
                    &names,
                    records,
                    concurrency,
                    params.messages,
                )
                .await;
                target.raw.cleanup().await?;
                row
            };
            match measured.await {
                Ok(row) => rows.push(row),
                Err(e) => {
                    let e = format!(
                        "scale bench of {} with {records} records: {}",
                        dedup::url::redact(&url),
                        error_chain(&*e)
                    );
                    eprintln!("{e}");
                    failed.push(e);
                }
            }
        }
    }
    println!();
    let (headers, cells) = scale::table(&rows);
    print_table(&headers, &cells);
    println!(
        "\nc = concurrency of the claim+commit streams ({} messages each); p99 vs empty = claim \
         p99 / the 0-record store's; srv cpu = the server's CPU per claim+commit; B/record = \
         bytes per record of the store's table and indexes (Redis: MEMORY USAGE, sampled), in \
         brackets the smallest raw row holding the same key; 1-by-1 = the same for {} \
         records written one claim+commit at a time by the store on its default clock; the \
         purge is the default (paced) one of the 30 % expired records, p99 during purge \
         against the stream's without.",
        params.messages,
        scale::ONE_AT_A_TIME
    );
    if args.json {
        for row in &rows {
            print_json(row);
        }
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(failed.join("; ").into()),
    }
}

/// The whole chain: a store error's cause is in its sources.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut chain = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        chain.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    chain
}

/// A server URL from the environment, if set and not blank.
fn env_url(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The rows of group `group` (see [`GROUPS`]) and the failures of its parts that failed
/// (the other parts' rows are kept). A group this build cannot run fails when it was asked
/// for by name, and is skipped with a note when `by_default`.
#[cfg_attr(
    not(all(feature = "postgres", feature = "sqlite", feature = "rabbitmq")),
    allow(unused_variables)
)]
async fn run_group(
    group: &str,
    params: &Params,
    by_default: bool,
) -> Result<(Vec<Row>, Vec<String>), bench::BoxError> {
    let rows: Option<(Vec<Row>, Vec<String>)> = match group {
        #[cfg(all(feature = "postgres", feature = "sqlite", feature = "rabbitmq"))]
        "outbox" => {
            let servers = bench::outbox::Servers {
                postgres: env_url("DEDUP_POSTGRES_URL"),
                amqp: env_url("DEDUP_AMQP_URL"),
                mysql: env_url("DEDUP_MYSQL_URL"),
            };
            Some((bench::outbox::run(params, &servers).await?, Vec::new()))
        }
        #[cfg(any(
            feature = "rabbitmq",
            feature = "redis",
            feature = "nats",
            feature = "pubsub"
        ))]
        "brokers" => {
            let servers = bench::brokers::Servers {
                amqp: env_url("DEDUP_AMQP_URL"),
                redis: env_url("DEDUP_REDIS_URL"),
                nats: env_url("DEDUP_NATS_URL"),
                kafka: env_url("DEDUP_KAFKA_BROKERS"),
                pubsub: env_url("DEDUP_PUBSUB_EMULATOR_HOST"),
            };
            Some(bench::brokers::run(params, &servers).await)
        }
        _ => None,
    };
    match rows {
        Some(rows) => Ok(rows),
        None if by_default => {
            eprintln!("bench group {group}: not in this build (see the features it needs)");
            Ok((Vec::new(), Vec::new()))
        }
        None => {
            Err(format!("group {group} is not in this build (build with --features full)").into())
        }
    }
}

fn format_value(unit: &str, v: f64) -> String {
    match unit {
        "ms" => format!("{v:.2} ms"),
        "rows/s" => format!("{v:.0} rows/s"),
        _ => format!("{v:.0} {unit}"),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_lab::exit::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let params = args.params()?;
    if args.counted {
        #[cfg(feature = "counted")]
        return run_counted(&args, &params).await;
        #[cfg(not(feature = "counted"))]
        return Err("--counted needs the `counted` feature (--features full)".into());
    }
    if args.scale {
        #[cfg(feature = "counted")]
        return run_scale(&args, &params).await;
        #[cfg(not(feature = "counted"))]
        return Err("--scale needs the `counted` feature (--features full)".into());
    }
    let mut rows = Vec::new();
    // A backend that fails does not cost the others' figures: they are printed, and the
    // run fails at the end.
    let mut failed = Vec::new();
    let asked = |what: &str| args.only.is_empty() || args.only.iter().any(|o| o == what);
    let per_store = MEASURES.iter().any(|m| asked(m));
    for store in stores(&args).into_iter().filter(|_| per_store) {
        let name = store.as_deref().unwrap_or("the temporary default store");
        for variant in bench::variants(store.as_deref(), &params) {
            match bench_one(store.as_deref(), &variant, &params).await {
                Ok(found) => rows.extend(found),
                Err(e) => {
                    let chain = error_chain(&*e);
                    let e = format!("bench of {}{variant}: {chain}", dedup::url::redact(name));
                    eprintln!("{e}");
                    failed.push(e);
                }
            }
        }
    }
    // The groups run on the servers the environment names: by default only when no
    // `--store` picks the backends explicitly.
    let by_default = args.only.is_empty() && args.stores.is_empty();
    let groups = GROUPS
        .into_iter()
        .filter(|g| by_default || args.only.iter().any(|o| o == g));
    for group in groups {
        match run_group(group, &params, by_default).await {
            Ok((found, failures)) => {
                rows.extend(found);
                for e in failures {
                    let e = format!("bench group {group}: {e}");
                    eprintln!("{e}");
                    failed.push(e);
                }
            }
            Err(e) => {
                let e = format!("bench group {group}: {}", error_chain(&*e));
                eprintln!("{e}");
                failed.push(e);
            }
        }
    }
    println!();
    print_table(
        &[
            "backend",
            "measure",
            "c",
            "library",
            "raw / baseline",
            "ratio",
        ],
        &rows
            .iter()
            .map(|r| {
                vec![
                    r.backend.to_owned(),
                    r.measure.to_owned(),
                    r.concurrency.to_string(),
                    format_value(r.unit, r.library),
                    format_value(r.unit, r.baseline),
                    format!("{:.2}", r.ratio),
                ]
            })
            .collect::<Vec<_>>(),
    );
    println!(
        "\nthroughput ratio = library / raw driver (1.0 = the backend's limit, higher is \
         better); tx_claim_vs_*: library's transactional claim + business insert against the \
         insert alone / the two-transaction inbox; latency ratio = during purge / alone (1.0 = \
         no slowdown, higher is worse); purge_rows_per_s against {} rows/s.\n\
         concurrency {:?}, {} messages one by one ({} % redeliveries in claim_commit_duplicates), \
         {} in batches of {}, purge of {} records.",
        bench::PURGE_RATE_FLOOR,
        params.concurrency,
        params.messages,
        params.duplicate_percent,
        params.batch_messages,
        params.batch,
        params.purge_rows
    );
    if args.json {
        for row in &rows {
            print_json(row);
        }
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(failed.join("; ").into()),
    }
}
