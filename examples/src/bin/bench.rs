//! The benchmark: for each backend, in one run on one machine, the library against the
//! same work issued raw through the backend's driver (the physical limit), batches against
//! raw batches, and claim latency while a large purge runs against claim latency without
//! it. It prints ratios; absolute times are context only (they depend on the machine).
//!
//! ```text
//! cargo run --release -p dedup-examples --bin bench -- [--store URL]... [--messages N]
//!     [--concurrency C] [--batch B] [--purge-rows P] [--json]
//! ```
//!
//! Without `--store`, it benches SQLite in a temporary file plus every server named by
//! `DEDUP_POSTGRES_URL`, `DEDUP_REDIS_URL` and `DEDUP_REDIS_CLUSTER_URLS` (comma-separated
//! node URLs). Each run works on tables / key prefixes of its own (`dedup_bench_<id>`,
//! `dedup-bench:<id>:`): SQL tables are dropped at the end, Redis keys expire by themselves
//! after ten minutes.

#[path = "../bench/mod.rs"]
mod bench;

use clap::Parser;
use dedup_examples::report::{print_json, print_table};

use bench::{Names, Params, Row};

/// Library against raw driver, batches against raw batches, claim latency during a purge.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// A store to bench (repeatable): `sqlite:PATH`, `postgres://...`, `redis://...`,
    /// `redis+cluster://h1:p1,h2:p2`. Default: SQLite in a temporary file plus the servers
    /// in DEDUP_POSTGRES_URL / DEDUP_REDIS_URL / DEDUP_REDIS_CLUSTER_URLS.
    #[arg(long = "store")]
    stores: Vec<String>,
    /// Messages claimed and committed one at a time (library, and again raw); also the
    /// length of each latency stream of the purge measure.
    #[arg(long, default_value_t = 2000)]
    messages: usize,
    /// Concurrent tasks.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Messages per batch.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Messages of the batch measure (default: 10 x --messages).
    #[arg(long)]
    batch_messages: Option<usize>,
    /// Completed records the purge deletes while claims run.
    #[arg(long, default_value_t = 20_000)]
    purge_rows: usize,
    /// Records per purge batch.
    #[arg(long, default_value_t = 1000)]
    purge_batch: usize,
    /// Runs of each throughput measure at least (library and raw alternating); the best
    /// run of each side counts.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Repeat each throughput measure (up to 10 rounds) until library and raw together
    /// ran this many seconds.
    #[arg(long, default_value_t = 2.0)]
    min_secs: f64,
    /// Messages handled before each measured part, to open connections.
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// Give the raw SQL tables the store's purge indexes too (splits the gap into the cost
    /// of the store's schema and the cost of its statements).
    #[arg(long)]
    raw_indexes: bool,
    /// Also print one `JSON {...}` line per row.
    #[arg(long)]
    json: bool,
}

impl Args {
    fn params(&self) -> Result<Params, String> {
        if self.messages == 0 || self.concurrency == 0 || self.purge_rows == 0 {
            return Err("--messages, --concurrency and --purge-rows must be at least 1".into());
        }
        if !(1..=dedup_core::MAX_BATCH_LEN).contains(&self.batch) {
            return Err(format!("--batch must be 1..={}", dedup_core::MAX_BATCH_LEN));
        }
        Ok(Params {
            messages: self.messages,
            concurrency: self.concurrency,
            batch: self.batch,
            batch_messages: self.batch_messages.unwrap_or(self.messages * 10).max(1),
            purge_rows: self.purge_rows,
            purge_batch: self.purge_batch,
            rounds: self.rounds.max(1),
            min_secs: self.min_secs,
            warmup: self.warmup,
            raw_indexes: self.raw_indexes,
        })
    }
}

/// The stores to bench: `--store` URLs, or the default set (`None`: temporary SQLite).
fn stores(args: &Args) -> Vec<Option<String>> {
    if !args.stores.is_empty() {
        return args.stores.iter().cloned().map(Some).collect();
    }
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let mut stores = vec![None];
    stores.extend(env("DEDUP_POSTGRES_URL").map(Some));
    stores.extend(env("DEDUP_REDIS_URL").map(Some));
    if let Some(nodes) = env("DEDUP_REDIS_CLUSTER_URLS") {
        let nodes: Vec<&str> = nodes
            .split(',')
            .map(|n| {
                n.trim()
                    .trim_start_matches("redis://")
                    .trim_end_matches('/')
            })
            .filter(|n| !n.is_empty())
            .collect();
        stores.push(Some(format!("redis+cluster://{}", nodes.join(","))));
    }
    stores
}

async fn bench_one(store: Option<&str>, params: &Params) -> Result<Vec<Row>, bench::BoxError> {
    let names = Names::new();
    let target = match store {
        Some(url) => bench::open(url, &names, params).await?,
        #[cfg(feature = "sqlite")]
        None => bench::open_default_sqlite(&names, params).await?,
        #[cfg(not(feature = "sqlite"))]
        None => return Err("this build has no sqlite backend: pass --store".into()),
    };
    eprintln!("bench {} ({})...", target.backend, target.setup);
    let rows = bench::run(&target, params, &names).await;
    let cleaned = target.raw.cleanup().await;
    let rows = rows?;
    cleaned?;
    Ok(rows)
}

fn format_value(unit: &str, v: f64) -> String {
    match unit {
        "ms" => format!("{v:.2} ms"),
        _ => format!("{v:.0} {unit}"),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let params = args.params()?;
    let mut rows = Vec::new();
    for store in stores(&args) {
        let name = store.as_deref().unwrap_or("sqlite (temporary file)");
        let found = bench_one(store.as_deref(), &params)
            .await
            .map_err(|e| format!("bench of {name}: {e}"))?;
        rows.extend(found);
    }
    println!();
    print_table(
        &["backend", "measure", "library", "raw / baseline", "ratio"],
        &rows
            .iter()
            .map(|r| {
                vec![
                    r.backend.to_owned(),
                    r.measure.to_owned(),
                    format_value(r.unit, r.library),
                    format_value(r.unit, r.baseline),
                    format!("{:.2}", r.ratio),
                ]
            })
            .collect::<Vec<_>>(),
    );
    println!(
        "\nthroughput ratio = library / raw driver (1.0 = the backend's limit, higher is \
         better); latency ratio = during purge / alone (1.0 = no slowdown, higher is worse).\n\
         concurrency {}, {} messages one by one, {} in batches of {}, purge of {} records.",
        params.concurrency, params.messages, params.batch_messages, params.batch, params.purge_rows
    );
    if args.json {
        for row in &rows {
            print_json(row);
        }
    }
    Ok(())
}
