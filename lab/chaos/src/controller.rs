//! The controller: starts the servers and the workers, kills workers in the windows they
//! announce, restarts the servers mid-run, and counts the effects at the end.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup::StoreUrl;
use dedup_lab::rng::Rng;
use dedup_lab::servers::Postgres;
use dedup_postgres::sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use super::backends::{self, ChaosBackend};
use super::protocol::EFFECTS_FILE;
use super::protocol::key;
use super::queue::Queue;
use super::worker::queue_call;
use super::{Figures, Mode, Replication, Window};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const QUEUE_TABLE: &str = "chaos_queue";
/// The queue's server in [`Figures::restarts`]: the harness's own PostgreSQL, whichever
/// store is under test.
const QUEUE_SERVER: &str = "postgres";

/// One run's settings.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Which store: the name of a registered backend with a chaos module
    /// ([`backends::named`]).
    pub backend: String,
    /// Which mode.
    pub mode: Mode,
    /// Messages to process.
    pub messages: u64,
    /// Worker processes at a time.
    pub workers: u32,
    /// Probability that an announced window ends in a SIGKILL (after the first of each
    /// window, which always does).
    pub kill_rate: f64,
    /// Lease of every claim.
    pub lease: Duration,
    /// The queue's visibility timeout.
    pub visibility: Duration,
    /// Seed of the kill decisions.
    pub seed: u64,
    /// Fail when the queue is not drained by then.
    pub deadline: Duration,
    /// This program (started again as `worker`).
    pub exe: PathBuf,
    /// Lease mode without the store (see [`WorkerArgs::without_dedup`]).
    ///
    /// [`WorkerArgs::without_dedup`]: super::worker::WorkerArgs::without_dedup
    pub without_dedup: bool,
    /// A failover run with this replication (`None`: the crash-restart run): the store on
    /// a primary with a standby ([`ChaosBackend::failover`]), the primary SIGKILLed and the
    /// standby promoted when half the messages are acknowledged; no other server restart.
    pub failover: Option<Replication>,
}

/// What the worker slots saw.
#[derive(Default)]
struct Tally {
    kills: BTreeMap<Window, u64>,
    effect_commit_kills: HashMap<u64, u64>,
    lease_lost: u64,
    worker_failures: u64,
}

struct Shared {
    config: RunConfig,
    args: Vec<String>,
    log: PathBuf,
    rng: Mutex<Rng>,
    tally: Mutex<Tally>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Whether to kill a worker announcing `window` for message `id` (and count it).
    fn kill(&self, window: Window, id: u64) -> bool {
        let mut tally = lock(&self.tally);
        let kill =
            !tally.kills.contains_key(&window) || lock(&self.rng).chance(self.config.kill_rate);
        if kill {
            *tally.kills.entry(window).or_default() += 1;
            if window == Window::EffectCommit {
                *tally.effect_commit_kills.entry(id).or_default() += 1;
            }
        }
        kill
    }
}

/// One worker slot: run a worker, answer its announcements or kill it and start another,
/// until a worker reports the queue drained.
async fn slot(shared: Arc<Shared>, n: u32) -> Result<(), BoxError> {
    loop {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&shared.log)?;
        let mut child = Command::new(&shared.config.exe)
            .args(&shared.args)
            .args(["--worker", &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        let mut killed = false;
        let mut done = false;
        while let Some(line) = lines.next_line().await? {
            if line == "DONE" {
                done = true;
                continue;
            }
            if line.starts_with("LOST ") {
                lock(&shared.tally).lease_lost += 1;
                continue;
            }
            let mut parts = line.split(' ');
            let (Some("AT"), Some(window), Some(id)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let window = Window::parse(window).ok_or("unknown window")?;
            let id: u64 = id.parse()?;
            if shared.kill(window, id) {
                child.kill().await?; // SIGKILL, reaped
                killed = true;
                break;
            }
            stdin.write_all(b"go\n").await?;
        }
        let status = child.wait().await?;
        if done && status.success() {
            return Ok(());
        }
        if !killed {
            lock(&shared.tally).worker_failures += 1;
            if lock(&shared.tally).worker_failures > 20 {
                return Err(format!("workers keep failing; see {}", shared.log.display()).into());
            }
        }
    }
}

/// Per message: how many effects were recorded (lease mode: the effects file;
/// transactional mode: the effects table, read by the backend's chaos module).
async fn effects(
    mode: Mode,
    chaos: &ChaosBackend,
    dir: &Path,
    store: &str,
) -> Result<HashMap<u64, u64>, BoxError> {
    let mut counts: HashMap<u64, u64> = HashMap::new();
    match (mode, &chaos.transactional) {
        (Mode::Lease, _) => {
            let text = std::fs::read_to_string(dir.join(EFFECTS_FILE)).unwrap_or_default();
            for line in text.lines() {
                let id: u64 = line.split(' ').next().unwrap_or("").parse()?;
                *counts.entry(id).or_default() += 1;
            }
        }
        (Mode::Transactional, Some(tx)) => {
            counts = (tx.effects)(StoreUrl::parse(store)?.target()).await?;
        }
        (Mode::Transactional, None) => return Err(no_transactional(chaos).into()),
    }
    Ok(counts)
}

fn no_transactional(chaos: &ChaosBackend) -> String {
    format!(
        "transactional mode needs a backend whose chaos module has a transactional handler; \
         {} has none",
        chaos.descriptor.name
    )
}

/// How many of the keys of messages `0..messages` (all acknowledged) the store does not
/// hold as completed.
async fn completions_missing(store: &str, messages: u64) -> Result<u64, BoxError> {
    let store = dedup::open(store).await?;
    let mut missing = 0;
    for id in 0..messages {
        let completed = matches!(
            store.get(&key(id)).await?,
            Some(dedup_core::Record {
                state: dedup_core::RecordState::Completed { .. },
                ..
            })
        );
        if !completed {
            missing += 1;
        }
    }
    Ok(missing)
}

/// Create the store's tables (opening it with `dedup::open`, which migrates) and, in
/// transactional mode, the effects table beside them.
async fn prepare_store(mode: Mode, chaos: &ChaosBackend, store: &str) -> Result<(), BoxError> {
    drop(dedup::open(store).await?);
    if mode == Mode::Transactional {
        let tx = chaos
            .transactional
            .as_ref()
            .ok_or_else(|| no_transactional(chaos))?;
        (tx.prepare)(StoreUrl::parse(store)?.target()).await?;
    }
    Ok(())
}

/// Run the harness once with `config`; the figures, or why it could not run.
pub async fn run(config: &RunConfig) -> Result<Figures, BoxError> {
    let chaos = backends::named(&config.backend)?;
    if config.mode == Mode::Transactional && chaos.transactional.is_none() {
        return Err(no_transactional(chaos).into());
    }
    if config.mode == Mode::Transactional && config.without_dedup {
        return Err("--without-dedup is for lease mode".into());
    }
    let started = Instant::now();
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_path_buf();
    let queue_server = tokio::task::spawn_blocking({
        let dir = dir.join("pg");
        move || Postgres::start(&dir)
    })
    .await??;
    let admin = PgPool::connect(&queue_server.url).await?;
    Postgres::commit_durably(&admin).await?;
    let queue = Queue::new(admin, QUEUE_TABLE, config.visibility);
    queue.create(config.messages).await?;
    let server = match config.failover {
        None => tokio::task::block_in_place(|| (chaos.start)(&dir, &queue_server.url))?,
        Some(replication) => {
            let start = chaos
                .failover
                .ok_or_else(|| format!("backend {} has no failover run", chaos.descriptor.name))?;
            tokio::task::block_in_place(|| start(&dir, replication))?
        }
    };
    let store = server.url.clone();
    prepare_store(config.mode, chaos, &store).await?;
    let mode = match config.mode {
        Mode::Lease => "lease",
        Mode::Transactional => "transactional",
    };
    let args: Vec<String> = [
        "worker",
        "--mode",
        mode,
        "--queue-url",
        &queue_server.url,
        "--queue-table",
        QUEUE_TABLE,
        "--visibility-ms",
        &config.visibility.as_millis().to_string(),
        "--store",
        &store,
        "--lease-ms",
        &config.lease.as_millis().to_string(),
        "--dir",
        &dir.display().to_string(),
    ]
    .map(String::from)
    .into_iter()
    .chain(config.without_dedup.then(|| "--without-dedup".to_string()))
    .collect();
    let shared = Arc::new(Shared {
        config: config.clone(),
        args,
        log: dir.join("workers.log"),
        rng: Mutex::new(Rng::new(config.seed)),
        tally: Mutex::default(),
    });
    let slots: Vec<_> = (0..config.workers)
        .map(|n| tokio::spawn(slot(shared.clone(), n)))
        .collect();

    // Restart the queue's PostgreSQL at a third of the messages, the store's own server
    // (if it has one) at two thirds; a failover run only fails the store over, at half.
    let (queue_restart, store_restart) = match config.failover {
        None => (true, (2, 3)),
        Some(_) => (false, (1, 2)),
    };
    let mut restarts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let all_done = async {
        let mut pending = slots;
        loop {
            // A slot that ended with an error (a worker that cannot start, or keeps
            // failing) ends the run with that error, not with figures.
            let mut running = Vec::new();
            for slot in pending {
                if slot.is_finished() {
                    slot.await??;
                } else {
                    running.push(slot);
                }
            }
            pending = running;
            if pending.is_empty() {
                return Ok::<(), BoxError>(());
            }
            let acked = queue_call("stats", || queue.stats()).await?.acked;
            if queue_restart && !restarts.contains_key(QUEUE_SERVER) && acked * 3 >= config.messages
            {
                tokio::task::block_in_place(|| queue_server.crash_restart())?;
                restarts.insert(QUEUE_SERVER, 1);
            }
            if let Some(restart) = &server.restart
                && !restarts.contains_key(restart.name)
                && acked * store_restart.1 >= config.messages * store_restart.0
            {
                let crash_restart = restart.crash_restart.clone();
                tokio::task::spawn_blocking(move || crash_restart()).await??;
                restarts.insert(restart.name, 1);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let drained = tokio::time::timeout(config.deadline, all_done).await;
    let worker_log = std::fs::read_to_string(&shared.log).unwrap_or_default();
    match drained {
        Ok(result) => result?,
        Err(_) => {
            let tail: Vec<&str> = worker_log.lines().rev().take(20).collect();
            return Err(format!(
                "the queue was not drained within {:?}; last worker log lines:\n{}",
                config.deadline,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
            .into());
        }
    }
    let stats = queue_call("stats", || queue.stats()).await?;
    let counts = effects(config.mode, chaos, &dir, &store).await?;
    let completions_lost = match config.failover {
        Some(_) => Some(completions_missing(&store, config.messages).await?),
        None => None,
    };
    let tally = lock(&shared.tally);
    let mut figures = Figures {
        backend: Some(chaos.descriptor.name),
        mode: Some(config.mode),
        without_dedup: config.without_dedup,
        messages: config.messages,
        deliveries: stats.deliveries,
        kills: Window::ALL
            .into_iter()
            .map(|w| (w.name(), tally.kills.get(&w).copied().unwrap_or(0)))
            .collect(),
        restarts,
        effects: counts.values().sum(),
        lease_lost: tally.lease_lost,
        replication: config.failover,
        completions_lost,
        ..Figures::default()
    };

    for id in 0..config.messages {
        match counts.get(&id).copied().unwrap_or(0) {
            0 => figures.lost += 1,
            1 => {}
            n => {
                figures.doubled += 1;
                let kills = tally.effect_commit_kills.get(&id).copied().unwrap_or(0);
                if n - 1 <= kills {
                    figures.doubled_paired += 1;
                }
            }
        }
    }
    figures.seconds = started.elapsed().as_secs_f64();
    Ok(figures)
}
