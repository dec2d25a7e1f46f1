//! The outbox rows (`--only outbox`), on the servers the environment names:
//!
//! - `outbox_enqueue_vs_insert_alone` (PostgreSQL, SQLite, and MySQL / MariaDB in
//!   `outbox_mysql.rs`): one business row plus one `enqueue` in one transaction, against
//!   the business row alone;
//! - `relay_vs_raw_publish` (PostgreSQL + RabbitMQ): a [`Relay`] with a
//!   [`RabbitPublisher`] (batches of 100) publishing pre-enqueued rows until the outbox is
//!   empty, against the same messages published raw through the same lapin client on a
//!   confirm channel (publish all, then await every confirm);
//! - `commit_to_publish_p50` / `_p99` (PostgreSQL + RabbitMQ): a producer commits one row
//!   every [`LATENCY_TICK`], a relay publishes, a consumer on the queue stamps each
//!   message's arrival: latency from the producer's commit returning to the consumer's
//!   receipt, with `NOTIFY` wakeups (poll interval 10 s) against polling alone (every
//!   100 ms, no wakeups).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use dedup_brokers::rabbitmq::RabbitPublisher;
use dedup_core::outbox::{
    AfterFailure, Held, OutboxEntry, OutboxMessage, OutboxQuery, OutboxStats, OutboxStore, Relay,
    RelayConfig,
};
use dedup_core::{LeaseToken, PurgeOptions, PurgeReport};
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgPool, SqlSafeStr};
use dedup_postgres::{PostgresConfig, PostgresOutbox, PostgresStore};
use dedup_sqlite::rusqlite::{Connection, TransactionBehavior, params};
use dedup_sqlite::{SqliteOutbox, SqliteStore};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection as AmqpConnection};
use serde_json::{Map, json};

use super::driver::{Run, drive, percentile_ms};
use super::rounds::{best_of, contender};
use super::{Names, Params, Result, Row, row};

/// How often the latency measure's producer commits a row.
pub(crate) const LATENCY_TICK: Duration = Duration::from_millis(4);

/// The relay's poll interval with `NOTIFY` (long: wakeups do the work).
const NOTIFY_POLL: Duration = Duration::from_secs(10);

/// The relay's poll interval without wakeups.
const POLL_ONLY: Duration = Duration::from_millis(100);

/// The p99 commit-to-publish latency the issue asks for at most, with `NOTIFY`.
pub(crate) const P99_TARGET_MS: f64 = 50.0;

/// Rows per relay take.
const RELAY_BATCH: usize = 100;

/// Rows per producer transaction when pre-filling the outbox (not measured).
const PREFILL_CHUNK: usize = 500;

/// The servers the outbox rows need.
#[derive(Clone, Debug)]
pub(crate) struct Servers {
    /// `DEDUP_POSTGRES_URL`.
    pub(crate) postgres: Option<String>,
    /// `DEDUP_AMQP_URL`.
    pub(crate) amqp: Option<String>,
    /// `DEDUP_MYSQL_URL` (read with the `mysql` feature).
    pub(crate) mysql: Option<String>,
}

/// Every outbox row: SQLite always, PostgreSQL (and RabbitMQ) when named.
pub(crate) async fn run(params: &Params, servers: &Servers) -> Result<Vec<Row>> {
    let names = Names::new();
    let mut rows = Vec::new();
    eprintln!("outbox: sqlite enqueue...");
    rows.extend(sqlite_enqueue(params, &names).await?);
    #[cfg(feature = "mysql")]
    match &servers.mysql {
        Some(url) => {
            eprintln!("outbox: mysql enqueue...");
            rows.extend(super::outbox_mysql::mysql_enqueue(params, url, &names).await?);
        }
        None => eprintln!("outbox: DEDUP_MYSQL_URL not set: no MySQL rows"),
    }
    let Some(postgres) = &servers.postgres else {
        eprintln!("outbox: DEDUP_POSTGRES_URL not set: no PostgreSQL rows");
        return Ok(rows);
    };
    let schema = format!("dedup_bench_{}_outbox", names.run);
    let store = PostgresStore::connect_with(
        postgres,
        PostgresConfig {
            schema: schema.clone(),
            max_connections: params.max_concurrency() as u32 + 4,
            ..PostgresConfig::default()
        },
    )
    .await?;
    let business = format!("{schema}.business");
    exec(
        store.pool(),
        format!(
            "CREATE TABLE {business} (id bigserial PRIMARY KEY, message_id text NOT NULL, \
             amount integer NOT NULL)"
        ),
    )
    .await?;
    let settings = postgres_settings(store.pool()).await?;
    let pg = Pg {
        pool: store.pool().clone(),
        outbox: store.outbox(),
        insert: format!("INSERT INTO {business} (message_id, amount) VALUES ($1, $2)"),
        setup: format!("PostgreSQL as the server is set ({settings}), schema {schema}"),
    };
    let measured = async {
        eprintln!("outbox: postgres enqueue...");
        let mut rows = pg_enqueue(params, &pg).await?;
        // Its messages go nowhere: the relays must not see them.
        exec(&pg.pool, format!("TRUNCATE {}", pg.outbox.table())).await?;
        match &servers.amqp {
            Some(amqp) => {
                eprintln!("outbox: relay throughput...");
                rows.push(relay_throughput(params, &pg, amqp, &names).await?);
                eprintln!("outbox: commit-to-publish latency...");
                rows.extend(commit_to_publish(params, &pg, amqp, &names).await?);
            }
            None => eprintln!("outbox: DEDUP_AMQP_URL not set: no relay rows"),
        }
        Ok::<_, super::BoxError>(rows)
    }
    .await;
    let dropped = exec(
        store.pool(),
        format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
    )
    .await;
    rows.extend(measured?);
    dropped?;
    Ok(rows)
}

async fn exec(pool: &PgPool, sql: String) -> Result<()> {
    sqlx::raw_sql(SqlSafeStr::into_sql_str(AssertSqlSafe(sql)))
        .execute(pool)
        .await?;
    Ok(())
}

async fn postgres_settings(pool: &PgPool) -> Result<String> {
    let mut out = Vec::new();
    for name in ["fsync", "synchronous_commit"] {
        let (value,): (String,) = sqlx::query_as(SqlSafeStr::into_sql_str(AssertSqlSafe(format!(
            "SHOW {name}"
        ))))
        .fetch_one(pool)
        .await?;
        out.push(format!("{name}={value}"));
    }
    Ok(out.join(" "))
}

/// The message a bench producer writes.
pub(super) fn message(destination: &str, id: String) -> Result<OutboxMessage> {
    Ok(OutboxMessage::new(
        destination,
        id,
        br#"{"order_id":"o-1","item":"book","amount":100}"#.to_vec(),
    )?
    .header("type", "OrderPlaced")?)
}

/// What a PostgreSQL producer transaction writes besides its business row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Extra {
    /// Nothing: the business row alone.
    Nothing,
    /// One message through `PostgresOutbox::enqueue`.
    Enqueue,
    /// The same outbox row by a plain `INSERT`, without `enqueue`'s `pg_notify`: where
    /// `enqueue`'s cost goes (diagnostic).
    RowWithoutNotify,
    /// A `SELECT 1`: the price of one more round trip in the transaction (diagnostic).
    RoundTrip,
}

/// The PostgreSQL side: the store's pool and outbox, and the business insert.
#[derive(Clone)]
struct Pg {
    pool: PgPool,
    outbox: PostgresOutbox,
    insert: String,
    setup: String,
}

impl Pg {
    /// One transaction: the business row, and `extra`.
    async fn write(&self, id: String, extra: Extra, destination: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(SqlSafeStr::into_sql_str(AssertSqlSafe(self.insert.clone())))
            .bind(&id)
            .bind(100_i32)
            .execute(&mut *tx)
            .await?;
        match extra {
            Extra::Nothing => {}
            Extra::RoundTrip => {
                sqlx::query("SELECT 1").execute(&mut *tx).await?;
            }
            Extra::Enqueue => {
                self.outbox
                    .enqueue(&mut tx, &[message(destination, id)?])
                    .await?;
            }
            Extra::RowWithoutNotify => {
                let m = message(destination, id)?;
                let sql = format!(
                    "INSERT INTO {} (destination, message_id, headers, payload, ordering_key, \
                     written_at, due_at, attempts, state) \
                     SELECT $1, $2, $3::jsonb, $4, NULL, ms, ms, 0, 'pending' \
                     FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms) now \
                     ON CONFLICT (message_id) DO NOTHING",
                    self.outbox.table()
                );
                sqlx::query(SqlSafeStr::into_sql_str(AssertSqlSafe(sql)))
                    .bind(m.destination())
                    .bind(m.message_id())
                    .bind(serde_json::to_string(m.headers())?)
                    .bind(m.payload())
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }
}

/// Measure 2a on PostgreSQL, and two diagnostics: the outbox row without `NOTIFY`, and
/// the business row plus a `SELECT 1` (one more round trip, no work).
async fn pg_enqueue(params: &Params, pg: &Pg) -> Result<Vec<Row>> {
    let n = params.messages;
    let mut rows = Vec::new();
    for &c in &params.concurrency {
        let run = |extra: Extra, what: String, n: usize| {
            let pg = pg.clone();
            drive(
                c,
                move |i| i < n,
                move |_, i| {
                    let pg = pg.clone();
                    let id = format!("{what}-{i}");
                    async move { pg.write(id, extra, "/nowhere").await }
                },
            )
            .boxed()
        };
        let kinds = [
            (Extra::Enqueue, "enqueue"),
            (Extra::Nothing, "alone"),
            (Extra::RowWithoutNotify, "no-notify"),
            (Extra::RoundTrip, "round-trip"),
        ];
        for (extra, what) in kinds {
            run(extra, format!("warm-c{c}-{what}"), params.warmup).await?;
        }
        let run = &run;
        let runs = best_of(
            params,
            kinds
                .iter()
                .map(|&(extra, what)| {
                    contender(move |round| run(extra, format!("c{c}-{what}-{round}"), n))
                })
                .collect(),
        )
        .await?;
        let mut row = enqueue_row("postgres", c, n, &runs, &pg.setup);
        row.details.insert(
            "row_without_notify_msgs_per_s".into(),
            json!(runs[2].throughput(n)),
        );
        row.details.insert(
            "one_more_round_trip_msgs_per_s".into(),
            json!(runs[3].throughput(n)),
        );
        rows.push(row);
    }
    Ok(rows)
}

pub(super) fn enqueue_row(
    backend: &'static str,
    c: usize,
    n: usize,
    runs: &[Run],
    setup: &str,
) -> Row {
    let (with, alone) = (&runs[0], &runs[1]);
    let mut details = Map::new();
    details.insert("library_msgs_per_s".into(), json!(with.throughput(n)));
    details.insert("insert_alone_msgs_per_s".into(), json!(alone.throughput(n)));
    details.insert("messages".into(), json!(n));
    details.insert("setup".into(), json!(setup));
    row(
        backend,
        "outbox_enqueue_vs_insert_alone",
        c,
        "msgs/s",
        (with.throughput(n), alone.throughput(n)),
        details,
    )
}

/// The SQLite side: one connection per task on the store's file, writes queued on a
/// mutex for the one write lock (as the bench's other SQLite baselines do).
struct Sqlite {
    connections: Vec<Mutex<Connection>>,
    write_gate: Mutex<()>,
    outbox: SqliteOutbox,
    _tmp: tempfile::TempDir,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sqlite {
    fn write(&self, worker: usize, id: String, with_outbox: bool) -> Result<()> {
        let mut conn = lock(&self.connections[worker % self.connections.len()]);
        let _turn = lock(&self.write_gate);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached("INSERT INTO business (message_id, amount) VALUES (?1, ?2)")?
            .execute(params![id, 100])?;
        if with_outbox {
            self.outbox.enqueue(&tx, &[message("/nowhere", id)?])?;
        }
        tx.commit()?;
        Ok(())
    }
}

/// Measure 2a on SQLite (a temporary file, the store's default settings).
async fn sqlite_enqueue(params: &Params, names: &Names) -> Result<Vec<Row>> {
    let tmp = tempfile::tempdir()?;
    let path: PathBuf = tmp.path().join("outbox-bench.db");
    let store = SqliteStore::open(&path).await?;
    let connections = {
        let store = store.clone();
        let k = params.max_concurrency();
        tokio::task::spawn_blocking(move || {
            (0..k)
                .map(|_| store.open_connection().map(Mutex::new))
                .collect::<dedup_core::Result<Vec<_>>>()
        })
        .await??
    };
    connections[0].lock().unwrap().execute_batch(
        "CREATE TABLE business (id INTEGER PRIMARY KEY, message_id TEXT NOT NULL, \
         amount INTEGER NOT NULL)",
    )?;
    let sqlite = Arc::new(Sqlite {
        connections,
        write_gate: Mutex::new(()),
        outbox: store.outbox(),
        _tmp: tmp,
    });
    let setup = format!(
        "SQLite in a temporary file, the store's default settings, {} connections, run {}",
        params.max_concurrency(),
        names.run
    );
    let n = params.messages;
    let mut rows = Vec::new();
    for &c in &params.concurrency {
        let run = |with: bool, what: String, n: usize| {
            let sqlite = Arc::clone(&sqlite);
            drive(
                c,
                move |i| i < n,
                move |worker, i| {
                    let sqlite = Arc::clone(&sqlite);
                    let id = format!("{what}-{i}");
                    tokio::task::spawn_blocking(move || sqlite.write(worker, id, with))
                        .map(|joined| joined?)
                },
            )
            .boxed()
        };
        let kinds = [(true, "enqueue"), (false, "alone")];
        for (with, what) in kinds {
            run(with, format!("warm-c{c}-{what}"), params.warmup).await?;
        }
        let run = &run;
        let runs = best_of(
            params,
            kinds
                .iter()
                .map(|&(with, what)| {
                    contender(move |round| run(with, format!("c{c}-{what}-{round}"), n))
                })
                .collect(),
        )
        .await?;
        rows.push(enqueue_row("sqlite", c, n, &runs, &setup));
    }
    Ok(rows)
}

/// A fresh durable queue on `connection`.
async fn declare(connection: &AmqpConnection, queue: &str) -> Result<Channel> {
    let channel = connection.create_channel().await?;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok(channel)
}

/// Fill the outbox with `n` messages for `destination`, ids `prefix-0...`.
async fn prefill(pg: &Pg, destination: &str, prefix: &str, n: usize) -> Result<()> {
    let mut i = 0;
    while i < n {
        let end = n.min(i + PREFILL_CHUNK);
        let messages = (i..end)
            .map(|k| message(destination, format!("{prefix}-{k}")))
            .collect::<Result<Vec<_>>>()?;
        let mut tx = pg.pool.begin().await?;
        pg.outbox.enqueue(&mut tx, &messages).await?;
        tx.commit().await?;
        i = end;
    }
    Ok(())
}

/// Measure 2b: a started relay (its default rounds in flight) until the outbox is empty,
/// against raw confirmed publishes.
async fn relay_throughput(params: &Params, pg: &Pg, amqp: &str, names: &Names) -> Result<Row> {
    let n = params.batch_messages;
    let queue = format!("dedup-bench-{}-relay", names.run);
    let destination = format!("/{queue}");
    let connection = AmqpConnection::connect(amqp, lapin::ConnectionProperties::default()).await?;
    let admin = declare(&connection, &queue).await?;
    let publisher = RabbitPublisher::new(&connection).await?;
    let probe = Arc::new(Probe::new(pg.outbox.clone(), true));
    let outbox: Arc<dyn OutboxStore> = Arc::clone(&probe) as Arc<dyn OutboxStore>;
    let relay = Arc::new(
        Relay::new(outbox, Arc::new(publisher))
            .with_config(RelayConfig::default().batch_size(RELAY_BATCH)),
    );
    let raw = connection.create_channel().await?;
    raw.confirm_select(ConfirmSelectOptions::default()).await?;
    // The fastest relay run: its time, its seconds in take and mark_sent, its rounds.
    let fastest = Arc::new(Mutex::new(None::<(Duration, f64, f64, usize)>));

    let relay_run = |round: usize| {
        let (relay, pg, destination, admin, queue) = (
            Arc::clone(&relay),
            pg.clone(),
            destination.clone(),
            admin.clone(),
            queue.clone(),
        );
        let (fastest, probe) = (Arc::clone(&fastest), Arc::clone(&probe));
        async move {
            prefill(&pg, &destination, &format!("relay-{round}"), n).await?;
            probe.split();
            // The relay as an application runs it (`start`: its rounds in flight), until
            // the outbox is empty.
            let started = Instant::now();
            let handle = Relay::clone(&relay).start();
            let pending = |stats: OutboxStats| stats.pending + stats.held;
            while pending(pg.outbox.stats().await?) > 0 {
                if started.elapsed() > Duration::from_secs(120) {
                    handle.stop().await;
                    return Err("the relay did not drain the outbox in 120 s".into());
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let elapsed = started.elapsed();
            let all = handle.stop().await;
            if all.failed + all.dead + all.lost > 0 {
                return Err(format!("relay rounds failed rows: {all:?}").into());
            }
            let (sent, rounds) = (all.sent as usize, n.div_ceil(RELAY_BATCH));
            if sent != n {
                return Err(format!("the relay sent {sent} rows, expected {n}").into());
            }
            let (take, mark) = probe.split();
            {
                let mut fastest = lock(&fastest);
                if fastest.is_none_or(|(e, ..)| elapsed < e) {
                    *fastest = Some((elapsed, take, mark, rounds));
                }
            }
            admin
                .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                .await?;
            Ok(Run {
                elapsed,
                samples: Vec::new(),
            })
        }
        .boxed()
    };
    let raw_run = |round: usize| {
        let (raw, queue, admin) = (raw.clone(), queue.clone(), admin.clone());
        async move {
            let started = Instant::now();
            let mut confirms = Vec::with_capacity(n);
            for k in 0..n {
                confirms.push(publish_raw(&raw, &queue, format!("raw-{round}-{k}")).await?);
            }
            for confirm in confirms {
                match confirm.await? {
                    Confirmation::Ack(None) => {}
                    other => return Err(format!("raw publish: {other:?}").into()),
                }
            }
            let elapsed = started.elapsed();
            admin
                .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                .await?;
            Ok(Run {
                elapsed,
                samples: Vec::new(),
            })
        }
        .boxed()
    };
    let measured = best_of(params, vec![contender(relay_run), contender(raw_run)]).await;
    admin
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    let _ = connection.close(200, "bench done".into()).await;
    let runs = measured?;
    let (relay_r, raw_r) = (&runs[0], &runs[1]);
    let mut details = Map::new();
    details.insert("library_msgs_per_s".into(), json!(relay_r.throughput(n)));
    details.insert("raw_msgs_per_s".into(), json!(raw_r.throughput(n)));
    details.insert("library_secs".into(), json!(relay_r.elapsed.as_secs_f64()));
    details.insert("raw_secs".into(), json!(raw_r.elapsed.as_secs_f64()));
    details.insert("relay_batch".into(), json!(RELAY_BATCH));
    let (_, take, mark, rounds) = lock(&fastest).unwrap_or_default();
    details.insert("relay_rounds".into(), json!(rounds));
    // Summed over the relay's rounds in flight, so together they may exceed its time.
    details.insert("relay_take_secs_summed".into(), json!(take));
    details.insert("relay_mark_sent_secs_summed".into(), json!(mark));
    details.insert(
        "relay_rounds_in_flight".into(),
        json!(RelayConfig::default().rounds_in_flight),
    );
    details.insert("messages".into(), json!(n));
    details.insert(
        "setup".into(),
        json!(format!(
            "{}; RabbitMQ durable queue, persistent messages",
            pg.setup
        )),
    );
    Ok(row(
        "postgres+rabbitmq",
        "relay_vs_raw_publish",
        1,
        "msgs/s",
        (relay_r.throughput(n), raw_r.throughput(n)),
        details,
    ))
}

/// One publish with the properties [`RabbitPublisher`] sets (message id, a string header,
/// timestamp, persistent, mandatory) to `queue` through the default exchange.
async fn publish_raw(
    channel: &Channel,
    queue: &str,
    id: String,
) -> Result<lapin::PublisherConfirm> {
    let mut headers = FieldTable::default();
    headers.insert(
        "type".into(),
        AMQPValue::LongString(LongString::from(b"OrderPlaced".to_vec())),
    );
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let props = BasicProperties::default()
        .with_message_id(id.into())
        .with_headers(headers)
        .with_timestamp(now)
        .with_delivery_mode(2);
    Ok(channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            br#"{"order_id":"o-1","item":"book","amount":100}"#,
            props,
        )
        .await?)
}

/// The PostgreSQL outbox as a relay sees it: with or without its `NOTIFY` wakeups (a
/// relay without them polls only), timing its `take` and `mark_sent` calls.
#[derive(Debug)]
struct Probe {
    inner: PostgresOutbox,
    wakeups: bool,
    take_ns: AtomicU64,
    mark_ns: AtomicU64,
}

impl Probe {
    fn new(inner: PostgresOutbox, wakeups: bool) -> Self {
        Probe {
            inner,
            wakeups,
            take_ns: AtomicU64::new(0),
            mark_ns: AtomicU64::new(0),
        }
    }

    /// Seconds spent in `take` and in `mark_sent` since the last call, and reset.
    fn split(&self) -> (f64, f64) {
        let secs = |a: &AtomicU64| a.swap(0, AtomicOrdering::Relaxed) as f64 / 1e9;
        (secs(&self.take_ns), secs(&self.mark_ns))
    }
}

fn add_elapsed(counter: &AtomicU64, started: Instant) {
    counter.fetch_add(started.elapsed().as_nanos() as u64, AtomicOrdering::Relaxed);
}

#[async_trait]
impl OutboxStore for Probe {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn take(&self, limit: usize, hold: Duration) -> dedup_core::Result<Held> {
        let started = Instant::now();
        let held = self.inner.take(limit, hold).await;
        add_elapsed(&self.take_ns, started);
        held
    }
    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> dedup_core::Result<Vec<i64>> {
        let started = Instant::now();
        let marked = self.inner.mark_sent(token, ids).await;
        add_elapsed(&self.mark_ns, started);
        marked
    }
    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> dedup_core::Result<bool> {
        self.inner.mark_failed(token, id, error, after).await
    }
    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> dedup_core::Result<u64> {
        self.inner.hand_back(token, ids).await
    }
    async fn purge(&self, options: &PurgeOptions) -> dedup_core::Result<PurgeReport> {
        self.inner.purge(options).await
    }
    async fn stats(&self) -> dedup_core::Result<OutboxStats> {
        self.inner.stats().await
    }
    async fn list(&self, query: &OutboxQuery) -> dedup_core::Result<Vec<OutboxEntry>> {
        self.inner.list(query).await
    }
    async fn retry(&self, id: i64) -> dedup_core::Result<bool> {
        self.inner.retry(id).await
    }
    async fn wakeups(
        &self,
    ) -> dedup_core::Result<Option<BoxStream<'static, dedup_core::Result<()>>>> {
        match self.wakeups {
            true => self.inner.wakeups().await,
            false => Ok(None),
        }
    }
}

/// Arrival times by message id, stamped by the latency measure's consumer.
type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

/// Measure 2c: commit-to-receipt latency with `NOTIFY`, against polling alone.
async fn commit_to_publish(
    params: &Params,
    pg: &Pg,
    amqp: &str,
    names: &Names,
) -> Result<Vec<Row>> {
    let n = (params.messages / 2).max(10);
    let queue = format!("dedup-bench-{}-latency", names.run);
    let destination = format!("/{queue}");
    let connection = AmqpConnection::connect(amqp, lapin::ConnectionProperties::default()).await?;
    let admin = declare(&connection, &queue).await?;
    let arrivals: Arrivals = Arc::default();
    let mut consumer = connection
        .create_channel()
        .await?
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    let stamping = {
        let arrivals = Arc::clone(&arrivals);
        tokio::spawn(async move {
            while let Some(Ok(d)) = consumer.next().await {
                let now = Instant::now();
                if let Some(id) = d.properties.message_id() {
                    lock(&arrivals).insert(id.as_str().to_owned(), now);
                }
            }
        })
    };
    let measured = async {
        let mut out = Vec::new();
        for (mode, poll, notify) in [("notify", NOTIFY_POLL, true), ("polling", POLL_ONLY, false)] {
            let store: Arc<dyn OutboxStore> = Arc::new(Probe::new(pg.outbox.clone(), notify));
            let publisher = RabbitPublisher::new(&connection).await?;
            let relay = Relay::new(store, Arc::new(publisher))
                .with_config(
                    RelayConfig::default()
                        .batch_size(RELAY_BATCH)
                        .poll_interval(poll),
                )
                .start();
            // Let it LISTEN before the first commit.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut commits = Vec::with_capacity(n);
            let mut tick = tokio::time::interval(LATENCY_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for i in 0..n {
                tick.tick().await;
                let id = format!("{mode}-{i}");
                pg.write(id.clone(), Extra::Enqueue, &destination).await?;
                commits.push((id, Instant::now()));
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while commits
                .iter()
                .any(|(id, _)| !lock(&arrivals).contains_key(id))
            {
                if Instant::now() > deadline {
                    return Err(format!("{mode}: not every message arrived within 30 s").into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let round = relay.stop().await;
            let arrived = lock(&arrivals);
            let latencies: Vec<Duration> = commits
                .iter()
                .map(|(id, committed)| arrived[id].saturating_duration_since(*committed))
                .collect();
            out.push((latencies, round.sent));
        }
        Ok::<_, super::BoxError>(out)
    }
    .await;
    stamping.abort();
    admin
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    let _ = connection.close(200, "bench done".into()).await;
    let mut measured = measured?;
    let (mut polling, polling_sent) = measured.pop().ok_or("no polling run")?;
    let (mut notify, notify_sent) = measured.pop().ok_or("no notify run")?;
    let mut rows = Vec::new();
    for (measure, q) in [
        ("commit_to_publish_p50", 0.50),
        ("commit_to_publish_p99", 0.99),
    ] {
        let (with, without) = (
            percentile_ms(&mut notify, q),
            percentile_ms(&mut polling, q),
        );
        let mut details = Map::new();
        details.insert("notify_ms".into(), json!(with));
        details.insert("polling_ms".into(), json!(without));
        details.insert(
            "notify_poll_interval_ms".into(),
            json!(NOTIFY_POLL.as_millis()),
        );
        details.insert("polling_interval_ms".into(), json!(POLL_ONLY.as_millis()));
        details.insert("commit_every_ms".into(), json!(LATENCY_TICK.as_millis()));
        details.insert("notify_sent".into(), json!(notify_sent));
        details.insert("polling_sent".into(), json!(polling_sent));
        details.insert("target_p99_ms".into(), json!(P99_TARGET_MS));
        details.insert("messages".into(), json!(n));
        details.insert(
            "setup".into(),
            json!(format!(
                "{}; latency from the producer's commit returning to a consumer's receipt",
                pg.setup
            )),
        );
        rows.push(row(
            "postgres+rabbitmq",
            measure,
            1,
            "ms",
            (with.max(1e-6), without.max(1e-6)),
            details,
        ));
    }
    Ok(rows)
}
