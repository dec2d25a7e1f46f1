//! The slow link scenario (`chaos slow-link`): a worker in a network namespace of its own
//! ([`NetNs`]) reaches a private PostgreSQL (the store, and a fenced downstream table)
//! over a veth pair, through a front on the host end that holds every byte the worker sends
//! for a fixed delay ([`SwitchingProxy::start_delayed`]; `tc qdisc ... netem delay` does
//! the same where the kernel has the `netem` qdisc, which this machine's has not): its
//! requests, lease renewals included, arrive late. It processes messages one at a
//! time: claim, a handler of fixed length during which it renews every third of the
//! lease, a fenced downstream write, commit. A fast worker on the host watches each key the
//! slow one claimed and claims it as soon as the store lets it (the slow lease ran out
//! before a renewal arrived): a takeover while the slow worker still works. It writes the
//! downstream table and commits.
//!
//! Measured: takeovers, the slow worker's renewals refused, its downstream writes
//! rejected by the fence, its commits answered `LeaseLost`, and *doubled downstream*: keys
//! whose table took the writes of both workers (the slow one's landed before the fast
//! one's). A renewal sent every third of the lease L, each waiting for the previous
//! answer, reaches the server L/3 + d after the previous one for a one-way delay d: the
//! lease runs out when d > 2L/3.

use std::process::Stdio;
use std::time::{Duration, Instant};

use dedup_core::{Claim, ClaimOptions, DedupStore};
use dedup_postgres::sqlx::PgPool;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use super::netns::NetNs;
use super::partition::{FencedServer, fenced_write, next_line};
use super::protocol::key;
use super::proxy::SwitchingProxy;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `chaos slow-link`.
#[derive(clap::Args, Clone, Debug)]
pub struct SlowLinkArgs {
    /// One-way delay of the worker's packets, ms (repeatable: one run each).
    #[arg(long, default_values_t = [0u64, 300])]
    pub delay_ms: Vec<u64>,
    /// Lease of the claims, ms.
    #[arg(long, default_value_t = 400)]
    pub lease_ms: u64,
    /// The slow worker's handler, ms.
    #[arg(long, default_value_t = 1000)]
    pub handler_ms: u64,
    /// Messages per run.
    #[arg(long, default_value_t = 10)]
    pub messages: u64,
    /// Also print one `JSON {...}` line per run.
    #[arg(long)]
    pub json: bool,
}

/// The slow worker (started by `chaos slow-link` in the namespace; not for direct use).
#[derive(clap::Args, Clone, Debug)]
pub struct SlowWorkerArgs {
    /// The store, through the host end of the veth pair.
    #[arg(long)]
    pub store: String,
    /// The downstream database, through the same address.
    #[arg(long)]
    pub downstream: String,
    /// Lease of the claims, ms.
    #[arg(long)]
    pub lease_ms: u64,
    /// The handler, ms.
    #[arg(long)]
    pub handler_ms: u64,
    /// Messages 0..N.
    #[arg(long)]
    pub messages: u64,
}

/// What one run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SlowLinkFigures {
    /// One-way delay of the slow worker's packets, ms.
    pub delay_ms: u64,
    /// Lease, ms.
    pub lease_ms: u64,
    /// The slow worker's handler, ms.
    pub handler_ms: u64,
    /// Messages.
    pub messages: u64,
    /// Keys the fast worker took over while the slow worker held them.
    pub takeovers: u64,
    /// The slow worker's mean renewal, ms (a call is several round trips, each delayed).
    pub renew_ms_mean: u64,
    /// The slow worker's renewals refused (`LeaseLost`).
    pub renewals_refused: u64,
    /// The slow worker's downstream writes rejected by the fence.
    pub slow_writes_rejected: u64,
    /// The slow worker's commits answered `LeaseLost`.
    pub slow_commits_lease_lost: u64,
    /// Keys whose downstream row took both workers' writes.
    pub doubled_downstream: u64,
    /// Wall time, seconds.
    pub seconds: f64,
}

impl SlowLinkFigures {
    /// What went against the contract (empty: it held): every takeover's stale commit is
    /// `LeaseLost`, and no key was committed by both.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.slow_commits_lease_lost != self.takeovers {
            out.push(format!(
                "delay {} ms: {} takeovers but {} stale commits answered LeaseLost",
                self.delay_ms, self.takeovers, self.slow_commits_lease_lost
            ));
        }
        out
    }
}

/// How the scenario went: run, or not runnable here (and why).
pub enum Outcome {
    /// It ran: one row per delay.
    Ran(Vec<SlowLinkFigures>),
    /// Network namespaces cannot be made here: the reason.
    Unavailable(String),
}

/// Run the scenario once per delay; `exe` is this program (started again as
/// `slow-worker` inside the namespace).
pub async fn run(args: &SlowLinkArgs, exe: &std::path::Path) -> Result<Outcome, BoxError> {
    let mut rows = Vec::new();
    for &delay in &args.delay_ms {
        let ns = match NetNs::create() {
            Ok(ns) => ns,
            Err(e) => return Ok(Outcome::Unavailable(e.to_string())),
        };
        rows.push(run_one(&ns, delay, args, exe).await?);
    }
    Ok(Outcome::Ran(rows))
}

async fn run_one(
    ns: &NetNs,
    delay_ms: u64,
    args: &SlowLinkArgs,
    exe: &std::path::Path,
) -> Result<SlowLinkFigures, BoxError> {
    let started = Instant::now();
    let lease = Duration::from_millis(args.lease_ms);
    let tmp = tempfile::tempdir()?;
    let FencedServer {
        pg: _pg,
        admin,
        store,
        server,
    } = FencedServer::start(tmp.path().join("pg"), 4).await?;
    let front = SwitchingProxy::start_delayed(
        std::net::SocketAddr::from((ns.host_addr, 0)),
        server,
        Duration::from_millis(delay_ms),
    )?;
    let url = format!("postgres://postgres@{}/dedup", front.addr());
    let mut child = Command::new(ns.exec_prefix()[0])
        .args(&ns.exec_prefix()[1..])
        .arg(exe)
        .args(["slow-worker", "--store", &format!("{url}?pool_size=2")])
        .args(["--downstream", &url])
        .args(["--lease-ms", &args.lease_ms.to_string()])
        .args(["--handler-ms", &args.handler_ms.to_string()])
        .args(["--messages", &args.messages.to_string()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut figures = SlowLinkFigures {
        delay_ms,
        lease_ms: args.lease_ms,
        handler_ms: args.handler_ms,
        messages: args.messages,
        ..SlowLinkFigures::default()
    };
    let (mut renew_count, mut renew_ms_total) = (0u64, 0u64);
    let mut contender: Option<tokio::task::JoinHandle<Result<bool, BoxError>>> = None;
    loop {
        let line = next_line(&mut lines, Duration::from_secs(60), "the slow worker").await?;
        let parts: Vec<&str> = line.split(' ').collect();
        match parts[..] {
            ["CLAIMED", id] => {
                let id: u64 = id.parse()?;
                let (store, admin) = (store.clone(), admin.clone());
                contender = Some(tokio::spawn(async move {
                    contend(&*store, &admin, id, lease).await
                }));
            }
            ["RESULT", id, refused, renewals, renew_ms, write, commit] => {
                let _: u64 = id.parse()?;
                renew_count += renewals.parse::<u64>()?;
                renew_ms_total += renew_ms.parse::<u64>()?;
                figures.renewals_refused += refused.parse::<u64>()?;
                figures.slow_writes_rejected += u64::from(write == "rejected");
                figures.slow_commits_lease_lost += u64::from(commit == "lease_lost");
                if let Some(c) = contender.take()
                    && c.await??
                {
                    figures.takeovers += 1;
                    if write == "accepted" {
                        figures.doubled_downstream += 1;
                    }
                }
            }
            ["DONE"] => break,
            _ => return Err(format!("unexpected line from the slow worker: {line:?}").into()),
        }
    }
    child.wait().await?;
    figures.renew_ms_mean = renew_ms_total.checked_div(renew_count).unwrap_or(0);
    figures.seconds = started.elapsed().as_secs_f64();
    Ok(figures)
}

/// The fast worker on one key: claim it every 10 ms until the store gives it (a
/// takeover: write downstream, commit; `true`) or the key is completed (`false`).
async fn contend(
    store: &dyn DedupStore,
    downstream: &PgPool,
    id: u64,
    lease: Duration,
) -> Result<bool, BoxError> {
    loop {
        match store.claim(&key(id), &ClaimOptions::lease(lease)).await? {
            Claim::Acquired(taken) => {
                fenced_write(downstream, id, taken.fence, "fast").await?;
                store.commit(&taken, Some(b"fast")).await?;
                return Ok(true);
            }
            Claim::Completed { .. } => return Ok(false),
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// The slow worker: per message, claim (retrying while busy), print `CLAIMED id`, run the
/// handler while renewing every third of the lease (until a renewal is refused), write downstream with the claim's
/// fence, commit; print `RESULT id <renewals refused> <renewals> <their ms in all> <write>
/// <commit>`; `DONE` at the end.
pub async fn slow_worker(args: SlowWorkerArgs) -> Result<(), BoxError> {
    let lease_for = Duration::from_millis(args.lease_ms);
    let store = dedup::open(&args.store).await?;
    let downstream = PgPool::connect(&args.downstream).await?;
    for id in 0..args.messages {
        let lease = loop {
            match store
                .claim(&key(id), &ClaimOptions::lease(lease_for))
                .await?
            {
                Claim::Acquired(lease) => break lease,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        println!("CLAIMED {id}");
        let handler_end = Instant::now() + Duration::from_millis(args.handler_ms);
        let (mut refused, mut renewals, mut renew_ms) = (0, 0, 0);
        let mut current = lease.clone();
        loop {
            let next = Instant::now() + lease_for / 3;
            if next >= handler_end {
                tokio::time::sleep_until(handler_end.into()).await;
                break;
            }
            tokio::time::sleep_until(next.into()).await;
            if refused > 0 {
                continue; // the lease is gone: no more renewals
            }
            let sent = Instant::now();
            let renewed = store.renew(&current, lease_for).await;
            renewals += 1;
            renew_ms += sent.elapsed().as_millis();
            match renewed {
                Ok(renewed) => current = renewed,
                Err(e) if e.is_lease_lost() => refused += 1,
                Err(e) => return Err(e.into()),
            }
        }
        let write = fenced_write(&downstream, id, lease.fence, "slow").await?;
        let commit = match store.commit(&current, Some(b"slow")).await {
            Ok(()) => "ok".to_string(),
            Err(e) if e.is_lease_lost() => "lease_lost".to_string(),
            Err(e) => return Err(e.into()),
        };
        println!("RESULT {id} {refused} {renewals} {renew_ms} {write} {commit}");
    }
    println!("DONE");
    Ok(())
}
