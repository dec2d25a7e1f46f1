//! The benchmark behind `bench`: each backend's library path against the same work issued
//! raw through its driver (fresh keys, and traffic with redeliveries), batches against raw
//! batches, the transactional claim against the business insert alone and against a
//! two-transaction inbox (SQL backends), and claim latency while a large purge runs
//! against claim latency without it, at each concurrency asked for. Only ratios measured in one run on one
//! machine are meant to be compared; absolute figures are printed as context.

#[cfg(any(
    feature = "rabbitmq",
    feature = "redis",
    feature = "nats",
    feature = "pubsub"
))]
pub(crate) mod brokers;
#[cfg(feature = "counted")]
pub(crate) mod counted;
mod driver;
mod measures;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "nats-kv")]
pub(crate) mod nats_kv;
#[cfg(all(feature = "postgres", feature = "sqlite", feature = "rabbitmq"))]
pub(crate) mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
mod rounds;
#[cfg(feature = "counted")]
pub(crate) mod scale;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
mod target;
mod workloads;

use std::time::{SystemTime, UNIX_EPOCH};

#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "redis",
        feature = "nats-kv"
    )),
    allow(unused_imports)
)]
use dedup::StoreUrl;
use dedup::url::{BackendDescriptor, StoreTarget};
use futures::future::BoxFuture;
use serde_json::{Map, Value};

pub(crate) use dedup_core::BoxError;
pub(crate) use measures::{PURGE_RATE_FLOOR, Row, run};
pub(crate) use target::Target;

/// The bench's result type.
pub(crate) type Result<T, E = BoxError> = std::result::Result<T, E>;

/// How much work each measure does.
#[derive(Clone, Debug)]
pub(crate) struct Params {
    /// Messages claimed and committed one by one (library, and again raw), and the length
    /// of each latency stream of the purge measure.
    pub(crate) messages: usize,
    /// The concurrencies (concurrent tasks) to measure at, each in turn.
    pub(crate) concurrency: Vec<usize>,
    /// The share of redeliveries (0 to 90 %) in the duplicate-heavy traffic.
    pub(crate) duplicate_percent: usize,
    /// Messages per batch.
    pub(crate) batch: usize,
    /// Messages of the batch measure (library, and again raw).
    pub(crate) batch_messages: usize,
    /// Completed records the purge deletes while claims run.
    pub(crate) purge_rows: usize,
    /// Largest records per purge batch (`None`: the default options').
    pub(crate) purge_batch: Option<usize>,
    /// Longest the claim stream runs alongside the purge, in seconds (past `messages`).
    pub(crate) purge_stream_secs: f64,
    /// How often each throughput measure runs (library and raw alternating); the best
    /// run of each counts.
    pub(crate) rounds: usize,
    /// Keep repeating each throughput measure (up to [`MAX_ROUNDS`]) until library and raw
    /// together ran this long: short measures on fast backends are noisy.
    pub(crate) min_secs: f64,
    /// Messages handled before each measured part, to open connections and warm caches.
    pub(crate) warmup: usize,
    /// Give the raw SQL tables the store's purge indexes too, to tell the cost of the
    /// store's schema from the cost of its statements.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) raw_indexes: bool,
    /// Only these measures (`claim_commit`, `claim_commit_duplicates`, `batch`, `tx`,
    /// `purge`); `None`: all.
    pub(crate) only: Option<Vec<String>>,
    /// PostgreSQL group commit rounds (`Some(0)`: off; `None`: the store's default).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) postgres_group_rounds: Option<usize>,
    /// PostgreSQL's partitioned layout, `COUNT,WINDOW` (`None`: the plain table).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) postgres_partitions: Option<String>,
    /// The PostgreSQL settings to bench on, each in turn.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) postgres_durability: Vec<Durability>,
    /// Counted mode and the broker rows: only these sides of each measure (`library`,
    /// `raw`, ...; brokers: `raw`, `loop`, `adapter`); `None`: all. One side alone is what
    /// `valgrind --tool=callgrind` runs (see BENCHMARKS.md).
    #[cfg_attr(
        not(any(
            feature = "counted",
            feature = "rabbitmq",
            feature = "redis",
            feature = "nats",
            feature = "pubsub"
        )),
        allow(dead_code)
    )]
    pub(crate) sides: Option<Vec<String>>,
}

/// The PostgreSQL settings a run measures on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Durability {
    /// `fsync`, `synchronous_commit`, `full_page_writes` on (PostgreSQL's defaults): each
    /// commit waits for the log to reach the disk.
    Durable,
    /// All three off: the test servers' setting, no production database's.
    Fast,
    /// As the server is set.
    Server,
}

impl std::str::FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "durable" => Ok(Durability::Durable),
            "fast" => Ok(Durability::Fast),
            "server" => Ok(Durability::Server),
            other => Err(format!(
                "--postgres-durability: {other:?} is not durable, fast or server"
            )),
        }
    }
}

/// One configuration of a store to bench: the server's settings where the bench sets them.
#[derive(Clone, Debug)]
pub(crate) enum Variant {
    /// The store as it is.
    AsIs,
    /// The server on these settings (a backend whose [`Bench::settings`] is true).
    Settings(Durability),
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Variant::AsIs => Ok(()),
            Variant::Settings(d) => write!(f, " ({d:?} settings)"),
        }
    }
}

/// The configurations to bench `url` in (`None`: the temporary default store).
pub(crate) fn variants(url: Option<&str>, params: &Params) -> Vec<Variant> {
    let takes_settings = url
        .and_then(|u| StoreUrl::parse(u).ok())
        .and_then(|u| bench_of(u.descriptor()))
        .is_some_and(|b| b.settings);
    if takes_settings {
        return params
            .postgres_durability
            .iter()
            .map(|&d| Variant::Settings(d))
            .collect();
    }
    vec![Variant::AsIs]
}

/// What the bench opens a store with, for one backend: its module's measures, chosen by
/// the descriptor of the URL's backend.
pub(crate) struct Bench {
    /// The backend it measures.
    pub(crate) descriptor: &'static BackendDescriptor,
    /// Whether it runs once per server setting (`--postgres-durability`).
    pub(crate) settings: bool,
    /// Open the URL's target (of this backend) for the bench, on these server settings.
    pub(crate) open: Opener,
    /// A temporary store of this backend, the bench's default when no URL is given.
    pub(crate) temporary: Option<Temporary>,
}

/// [`Bench::open`]: the URL's target (of the bench's backend), on these server settings.
pub(crate) type Opener =
    for<'a> fn(StoreTarget, Durability, &'a Names, &'a Params) -> BoxFuture<'a, Result<Target>>;

/// [`Bench::temporary`]: a temporary store.
pub(crate) type Temporary = for<'a> fn(&'a Names, &'a Params) -> BoxFuture<'a, Result<Target>>;

/// Why a store is refused: the bench needs one other processes could share.
const NOT_SHARED: &str =
    "the bench needs a backend other processes could share (a file or a server)";

/// The bench modules of the compiled-in backends: one per backend module above.
#[allow(clippy::vec_init_then_push)] // one push per feature
fn benches() -> Vec<&'static Bench> {
    #[allow(unused_mut)]
    let mut benches: Vec<&'static Bench> = Vec::new();
    #[cfg(feature = "sqlite")]
    benches.push(&sqlite::BENCH);
    #[cfg(feature = "postgres")]
    benches.push(&postgres::BENCH);
    #[cfg(feature = "mysql")]
    benches.push(&mysql::BENCH);
    #[cfg(feature = "redis")]
    benches.push(&redis::BENCH);
    #[cfg(feature = "nats-kv")]
    benches.push(&nats_kv::BENCH);
    benches
}

/// The bench of the backend `descriptor` describes.
fn bench_of(descriptor: &BackendDescriptor) -> Option<&'static Bench> {
    benches()
        .into_iter()
        .find(|b| std::ptr::eq(b.descriptor, descriptor))
}

impl Params {
    /// The highest concurrency of the run (connections some baselines open up front).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn max_concurrency(&self) -> usize {
        self.concurrency.iter().copied().max().unwrap_or(1)
    }
}

#[cfg_attr(
    not(any(
        feature = "rabbitmq",
        feature = "redis",
        feature = "nats",
        feature = "pubsub"
    )),
    allow(dead_code)
)]
/// A row of a group measure: `library` against `baseline`.
pub(crate) fn row(
    backend: &'static str,
    measure: &'static str,
    concurrency: usize,
    unit: &'static str,
    (library, baseline): (f64, f64),
    details: Map<String, Value>,
) -> Row {
    Row {
        backend,
        measure,
        concurrency,
        unit,
        library,
        baseline,
        ratio: library / baseline,
        details,
    }
}

/// Most rounds a throughput measure runs (see [`Params::min_secs`]).
pub(crate) const MAX_ROUNDS: usize = 10;

/// The names one bench run creates: tables (SQL) or key prefixes (Redis), unique per run.
#[derive(Clone, Debug)]
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) struct Names {
    /// This run's id (8 hex digits).
    pub(crate) run: String,
    /// The store's table.
    pub(crate) table: String,
    /// The raw baseline's table.
    pub(crate) raw_table: String,
    /// The purge store's table.
    pub(crate) purge_table: String,
    /// The business table of the transactional measures.
    pub(crate) business_table: String,
}

impl Names {
    /// Fresh names.
    pub(crate) fn new() -> Self {
        let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
        let table = format!("dedup_bench_{run}");
        Names {
            raw_table: format!("{table}_raw"),
            purge_table: format!("{table}_purge"),
            business_table: format!("{table}_business"),
            table,
            run,
        }
    }

    /// A Redis key prefix for `part` (none is a prefix of another: see `RedisConfig`).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn redis_prefix(&self, part: &str) -> String {
        format!("dedup-bench:{}:{part}:", self.run)
    }
}

/// Open `url`'s backend for the bench.
pub(crate) async fn open(
    url: &str,
    variant: &Variant,
    names: &Names,
    params: &Params,
) -> Result<Target> {
    let parsed = StoreUrl::parse(url)?;
    let Some(bench) = bench_of(parsed.descriptor()) else {
        return Err(format!("{}: {NOT_SHARED}", dedup::url::redact(url)).into());
    };
    let durability = match variant {
        Variant::Settings(d) => *d,
        Variant::AsIs => Durability::Server,
    };
    (bench.open)(parsed.into_target(), durability, names, params).await
}

/// The default store: a temporary one of the first compiled-in backend that has one.
pub(crate) async fn open_temporary(names: &Names, params: &Params) -> Result<Target> {
    match benches().into_iter().find_map(|b| b.temporary) {
        Some(open) => open(names, params).await,
        None => Err("this build has no backend with a temporary store: pass --store".into()),
    }
}

/// A random lease token, as text.
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "redis",
        feature = "mysql",
        feature = "nats-kv"
    )),
    allow(dead_code)
)]
pub(crate) fn token() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Wall-clock milliseconds since the epoch.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
