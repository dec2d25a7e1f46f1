//! A worker process: receives messages from the queue and processes each under the
//! announcement protocol (see the module docs of [`chaos`](super)), until the queue is
//! drained.
//!
//! Store and queue calls that fail with a retryable error (a server restarting) are
//! retried for up to a minute; anything else ends the worker with an error, which the
//! controller reports.

use std::fs::OpenOptions;
use std::future::Future;
use std::io::{BufRead, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use dedup_core::{Claim, ClaimOptions, DedupStore, Handled, InboxConfig, InboxError, Key, Result};
#[cfg(feature = "mysql")]
use dedup_mysql::{MySqlConfig, MySqlStore, TxInbox as MySqlTxInbox};
use dedup_postgres::sqlx::{self, PgPool};
use dedup_postgres::{PostgresConfig, PostgresStore, TxInbox as PgTxInbox};
use dedup_sqlite::rusqlite::params;
use dedup_sqlite::{SqliteStore, TxInbox as SqliteTxInbox};

use super::queue::Queue;
use super::{Backend, Mode, Window};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The effects table of transactional mode (in the store's database).
pub const EFFECTS_TABLE: &str = "chaos_effects";
/// The effects file of lease mode (in the run's folder).
pub const EFFECTS_FILE: &str = "effects.log";
/// The store's table (SQL backends) / the consumer of every key.
pub const CONSUMER: &str = "chaos";

/// What a worker needs to know (passed on its command line by the controller).
#[derive(clap::Args, Clone, Debug)]
pub struct WorkerArgs {
    /// Which store.
    #[arg(long, value_enum)]
    pub backend: Backend,
    /// Which mode.
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// The PostgreSQL holding the queue.
    #[arg(long)]
    pub queue_url: String,
    /// The queue table.
    #[arg(long)]
    pub queue_table: String,
    /// Visibility timeout of the queue, ms.
    #[arg(long)]
    pub visibility_ms: u64,
    /// The store: an SQLite file path, or a PostgreSQL / Redis URL.
    #[arg(long)]
    pub store: String,
    /// Lease of every claim, ms.
    #[arg(long)]
    pub lease_ms: u64,
    /// The run's folder (the effects file of lease mode).
    #[arg(long)]
    pub dir: PathBuf,
    /// This worker's number (for the effect records).
    #[arg(long)]
    pub worker: u32,
    /// Skip the store (lease mode): no claim, no commit. Proves the harness catches
    /// doubled effects.
    #[arg(long)]
    pub without_dedup: bool,
}

/// Announce `window` for message `id` and wait for the controller's go-ahead (it may kill
/// this process instead). A closed stdin ends the worker.
fn announce(window: Window, id: u64) {
    println!("AT {window} {id}");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(n) if n > 0 => {}
        _ => std::process::exit(0),
    }
}

/// Call `op` until it succeeds or fails with a non-retryable error (or for a minute).
async fn retried<T, F, Fut>(what: &str, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match op().await {
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                eprintln!("{what}: retrying after {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// Call a queue operation until it succeeds (for a minute: a restart takes seconds).
pub(crate) async fn queue_call<T, F, Fut>(what: &str, mut op: F) -> std::result::Result<T, BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, sqlx::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() < deadline => {
                eprintln!("queue {what}: retrying after {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn key(id: u64) -> Key {
    Key::new(CONSUMER, format!("m{id}")).expect("valid key")
}

/// The store a worker uses.
enum Store {
    Any(std::sync::Arc<dyn DedupStore>),
    Postgres(PgTxInbox),
    Sqlite(SqliteTxInbox),
    #[cfg(feature = "mysql")]
    Mysql(MySqlTxInbox),
}

/// Run a worker until the queue is drained.
pub async fn work(args: WorkerArgs) -> std::result::Result<(), BoxError> {
    let pool = queue_call("connect", || PgPool::connect(&args.queue_url)).await?;
    let queue = Queue::new(
        pool,
        &args.queue_table,
        Duration::from_millis(args.visibility_ms),
    );
    let lease = Duration::from_millis(args.lease_ms);
    let tx_config = InboxConfig {
        lease,
        ..InboxConfig::default()
    };
    let store = match (args.backend, args.mode) {
        (Backend::Postgres, Mode::Transactional) => Store::Postgres(
            PgTxInbox::new(
                retried("connect", || {
                    PostgresStore::connect_with(&args.store, postgres_config())
                })
                .await?,
            )
            .with_config(tx_config),
        ),
        (Backend::Sqlite, Mode::Transactional) => Store::Sqlite(
            SqliteTxInbox::new(SqliteStore::open(&args.store).await?).with_config(tx_config),
        ),
        (Backend::Sqlite, Mode::Lease) => {
            Store::Any(std::sync::Arc::new(SqliteStore::open(&args.store).await?))
        }
        (Backend::Postgres, Mode::Lease) => Store::Any(std::sync::Arc::new(
            retried("connect", || {
                PostgresStore::connect_with(&args.store, postgres_config())
            })
            .await?,
        )),
        #[cfg(feature = "mysql")]
        (Backend::Mysql, Mode::Transactional) => Store::Mysql(
            MySqlTxInbox::new(
                retried("connect", || {
                    MySqlStore::connect_with(&args.store, mysql_config())
                })
                .await?,
            )
            .with_config(tx_config),
        ),
        #[cfg(feature = "mysql")]
        (Backend::Mysql, Mode::Lease) => Store::Any(std::sync::Arc::new(
            retried("connect", || {
                MySqlStore::connect_with(&args.store, mysql_config())
            })
            .await?,
        )),
        (Backend::Redis, _) => Store::Any(std::sync::Arc::new(
            retried("connect", || dedup_redis::RedisStore::connect(&args.store)).await?,
        )),
    };
    let options = ClaimOptions::lease(lease);
    loop {
        let Some(id) = queue_call("receive", || queue.receive()).await? else {
            if queue_call("stats", || queue.stats()).await?.acked_all() {
                println!("DONE");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        announce(Window::BeforeClaim, id);
        let done = match &store {
            Store::Any(store) => lease_mode(&**store, id, &options, &args).await?,
            Store::Postgres(inbox) => postgres_tx(inbox, id, args.worker).await?,
            Store::Sqlite(inbox) => sqlite_tx(inbox, id, args.worker).await?,
            #[cfg(feature = "mysql")]
            Store::Mysql(inbox) => mysql_tx(inbox, id, args.worker).await?,
        };
        if done {
            queue_call("ack", || queue.ack(id)).await?;
        }
    }
}

/// The PostgreSQL store's configuration (default table in the private server).
pub fn postgres_config() -> PostgresConfig {
    PostgresConfig {
        max_connections: 2,
        ..PostgresConfig::default()
    }
}

/// The MySQL store's configuration (default table in the private server).
#[cfg(feature = "mysql")]
pub fn mysql_config() -> MySqlConfig {
    MySqlConfig {
        max_connections: 2,
        ..MySqlConfig::default()
    }
}

/// Transactional mode on MySQL: `TxInbox` runs the effect row's insert in the
/// transaction that completes the key.
#[cfg(feature = "mysql")]
async fn mysql_tx(
    inbox: &MySqlTxInbox,
    id: u64,
    worker: u32,
) -> std::result::Result<bool, BoxError> {
    use dedup_mysql::sqlx as mysqlx;
    let handled = inbox
        .handle(&key(id), None, |conn, lease| {
            Box::pin(async move {
                announce(Window::ClaimEffect, id);
                mysqlx::query("INSERT INTO chaos_effects (msg, worker, fence) VALUES (?, ?, ?)")
                    .bind(id as i64)
                    .bind(worker as i64)
                    .bind(lease.fence as i64)
                    .execute(&mut *conn)
                    .await?;
                announce(Window::EffectCommit, id);
                Ok::<_, mysqlx::Error>(Some(b"done".to_vec()))
            })
        })
        .await;
    tx_answer(id, handled).await
}

/// Lease mode: claim, effect (a line appended to the effects file, fsynced), commit.
/// Returns whether to acknowledge.
async fn lease_mode(
    store: &dyn DedupStore,
    id: u64,
    options: &ClaimOptions,
    args: &WorkerArgs,
) -> std::result::Result<bool, BoxError> {
    let key = key(id);
    let lease = match args.without_dedup {
        true => None,
        false => match retried("claim", || store.claim(&key, options)).await? {
            Claim::Completed { .. } => return Ok(true),
            Claim::InFlight { .. } => return Ok(false),
            Claim::Acquired(lease) => Some(lease),
        },
    };
    announce(Window::ClaimEffect, id);
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(args.dir.join(EFFECTS_FILE))?;
    let fence = lease.as_ref().map_or(0, |l| l.fence);
    // One write call per line: workers append to the same file at once, and `writeln!`
    // on a file may issue several writes that another worker's line could split.
    file.write_all(format!("{id} {} {fence}\n", args.worker).as_bytes())?;
    file.sync_data()?;
    announce(Window::EffectCommit, id);
    let Some(lease) = lease else {
        announce(Window::CommitAck, id);
        return Ok(true);
    };
    match retried("commit", || store.commit(&lease, Some(b"done"))).await {
        Ok(()) => {}
        Err(e) if e.is_lease_lost() => {
            // The lease expired and another worker took the message over: its effect may
            // now happen twice without a kill. Told to the controller, which reports it.
            println!("LOST {id}");
            let _ = std::io::stdout().flush();
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    }
    announce(Window::CommitAck, id);
    Ok(true)
}

/// Whether to acknowledge a delivery `TxInbox` answered; an error (a restart cut the
/// transaction, which rolled back) leaves it for the next delivery.
async fn tx_answer(
    id: u64,
    handled: std::result::Result<Handled, InboxError>,
) -> std::result::Result<bool, BoxError> {
    match handled {
        Ok(Handled::Busy { .. }) => Ok(false),
        Ok(Handled::Processed { .. }) => {
            announce(Window::CommitAck, id);
            Ok(true)
        }
        Ok(Handled::Duplicate { .. }) => Ok(true),
        Ok(other) => Err(format!("message {id}: unexpected {other:?}").into()),
        Err(e) => {
            eprintln!("message {id}: transaction failed: {e}");
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(false)
        }
    }
}

/// Transactional mode on PostgreSQL: `TxInbox` runs the effect row's insert in the
/// transaction that completes the key.
async fn postgres_tx(
    inbox: &PgTxInbox,
    id: u64,
    worker: u32,
) -> std::result::Result<bool, BoxError> {
    let handled = inbox
        .handle(&key(id), None, |conn, lease| {
            Box::pin(async move {
                announce(Window::ClaimEffect, id);
                sqlx::query("INSERT INTO chaos_effects (msg, worker, fence) VALUES ($1, $2, $3)")
                    .bind(id as i64)
                    .bind(worker as i64)
                    .bind(lease.fence as i64)
                    .execute(&mut *conn)
                    .await?;
                announce(Window::EffectCommit, id);
                Ok::<_, sqlx::Error>(Some(b"done".to_vec()))
            })
        })
        .await;
    tx_answer(id, handled).await
}

/// Transactional mode on SQLite: `TxInbox` runs the effect row's insert in the
/// transaction that completes the key.
async fn sqlite_tx(
    inbox: &SqliteTxInbox,
    id: u64,
    worker: u32,
) -> std::result::Result<bool, BoxError> {
    let handled = inbox
        .handle(&key(id), None, move |tx, lease| {
            announce(Window::ClaimEffect, id);
            tx.execute(
                "INSERT INTO chaos_effects (msg, worker, fence) VALUES (?1, ?2, ?3)",
                params![id as i64, worker, lease.fence as i64],
            )?;
            announce(Window::EffectCommit, id);
            Ok::<_, dedup_sqlite::rusqlite::Error>(Some(b"done".to_vec()))
        })
        .await;
    tx_answer(id, handled).await
}
