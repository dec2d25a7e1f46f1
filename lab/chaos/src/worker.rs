//! A worker process: receives messages from the queue and processes each under the
//! announcement protocol (see the module docs of [`chaos`](super)), until the queue is
//! drained.
//!
//! Store and queue calls that fail with a retryable error (a server restarting) are
//! retried for up to a minute; anything else ends the worker with an error, which the
//! controller reports.

use std::fs::OpenOptions;
use std::future::Future;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup::{OpenError, StoreUrl};
use dedup_core::{Claim, ClaimOptions, DedupStore, Handled, InboxConfig, InboxError};
use dedup_postgres::sqlx::{self, PgPool};

use super::backends::{self, TxHandler};
use super::protocol::{EFFECTS_FILE, announce, key, retried, retried_if};
use super::queue::Queue;
use super::{Mode, Window};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a worker needs to know (passed on its command line by the controller).
#[derive(clap::Args, Clone, Debug)]
pub struct WorkerArgs {
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
    /// The store's URL (any registered backend; its descriptor picks the chaos module of
    /// transactional mode).
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

/// The store a worker uses.
enum Store {
    /// Lease mode: the URL opened with `dedup::open`.
    Lease(Arc<dyn DedupStore>),
    /// Transactional mode: the backend's handler.
    Transactional(Box<dyn TxHandler>),
}

/// Open the store `url` for `mode`.
async fn open(url: &str, mode: Mode, lease: Duration) -> Result<Store, BoxError> {
    match mode {
        Mode::Lease => Ok(Store::Lease(
            retried_if("open", OpenError::is_retryable, || dedup::open(url)).await?,
        )),
        Mode::Transactional => {
            let parsed = StoreUrl::parse(url)?;
            let tx = backends::of(parsed.descriptor())
                .and_then(|c| c.transactional.as_ref())
                .ok_or_else(|| {
                    format!(
                        "transactional mode: backend {} has no transactional chaos module",
                        parsed.backend()
                    )
                })?;
            let config = InboxConfig {
                lease,
                ..InboxConfig::default()
            };
            let handler = retried("connect", || (tx.open)(parsed.target(), config.clone())).await?;
            Ok(Store::Transactional(handler))
        }
    }
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
    let store = open(&args.store, args.mode, lease).await?;
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
            Store::Lease(store) => lease_mode(&**store, id, &options, &args).await?,
            Store::Transactional(handler) => {
                tx_answer(id, handler.handle(id, args.worker).await).await?
            }
        };
        if done {
            queue_call("ack", || queue.ack(id)).await?;
        }
    }
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
