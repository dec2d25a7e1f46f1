//! The partition scenario (`chaos partition`): a worker on a host of its own (a network
//! namespace, [`NetNs`]) claims a key on a private PostgreSQL it reaches over a veth
//! pair, and is cut off mid-handler; it cannot renew, its lease runs out, and a second
//! worker on the host takes the key over (a higher fence), writes a fenced downstream
//! table and commits. When the network heals, the first worker resumes its handler: the
//! downstream table rejects its write (its fence is stale) and its commit answers
//! `LeaseLost`.
//!
//! The downstream table stands for any system that checks the fence: a write carries the
//! writer's fence and only lands when it is higher than the one the row holds.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use dedup_core::{Claim, ClaimOptions, DedupStore, Lease};
use dedup_lab::servers::{Postgres, Service};
use dedup_postgres::sqlx::{self, PgPool};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use super::netns::NetNs;
use super::protocol::key;
use super::proxy::SwitchingProxy;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The fenced downstream table (also the slow link scenario's).
pub(crate) const CREATE_DOWNSTREAM: &str = "CREATE TABLE partition_downstream \
     (k text PRIMARY KEY, fence bigint NOT NULL, writer text NOT NULL)";
/// A fenced write: lands only over a lower fence (or on no row).
const FENCED_WRITE: &str = "INSERT INTO partition_downstream (k, fence, writer) \
     VALUES ($1, $2, $3) ON CONFLICT (k) DO UPDATE SET fence = EXCLUDED.fence, \
     writer = EXCLUDED.writer WHERE partition_downstream.fence < EXCLUDED.fence";
const READ_DOWNSTREAM: &str = "SELECT fence, writer FROM partition_downstream WHERE k = $1";
/// The message both workers handle.
const MESSAGE: u64 = 7;

/// `chaos partition`.
#[derive(clap::Args, Clone, Debug)]
pub struct PartitionArgs {
    /// Lease of the claims, ms (the cut lasts this long, and a little more).
    #[arg(long, default_value_t = 2000)]
    pub lease_ms: u64,
    /// Also print a `JSON {...}` line.
    #[arg(long)]
    pub json: bool,
}

/// The worker in the namespace (started by `chaos partition`; not for direct use).
#[derive(clap::Args, Clone, Debug)]
pub struct CutWorkerArgs {
    /// The store, through the host end of the veth pair.
    #[arg(long)]
    pub store: String,
    /// The downstream database, through the same address.
    #[arg(long)]
    pub downstream: String,
    /// Lease of the claim, ms.
    #[arg(long)]
    pub lease_ms: u64,
}

/// What the scenario saw, step by step.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PartitionFigures {
    /// The fence of the first worker's claim (in the namespace).
    pub first_fence: u64,
    /// What the first worker's renewal answered while cut off (`timeout`: no answer
    /// within a second).
    pub renew_during_cut: String,
    /// What the second worker's claim answered once the first lease ran out.
    pub second_claim: String,
    /// The second worker's fence.
    pub second_fence: u64,
    /// The second worker's downstream write (`accepted` / `rejected`).
    pub second_write: String,
    /// The first worker's downstream write after the heal.
    pub first_write_after_heal: String,
    /// The first worker's commit after the heal (`lease_lost` expected).
    pub first_commit_after_heal: String,
    /// The downstream row at the end: its writer.
    pub downstream_writer: String,
    /// The downstream row at the end: its fence.
    pub downstream_fence: u64,
    /// Wall time, seconds.
    pub seconds: f64,
}

impl PartitionFigures {
    /// What went against the contract (empty: it held).
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut check = |ok: bool, what: &str| {
            if !ok {
                out.push(what.to_string());
            }
        };
        check(
            self.renew_during_cut != "ok",
            "the cut-off worker renewed its lease",
        );
        check(
            self.second_claim == "acquired",
            "the second worker did not take the key over",
        );
        check(
            self.second_fence > self.first_fence,
            "the takeover did not raise the fence",
        );
        check(
            self.second_write == "accepted",
            "the downstream table refused the new owner",
        );
        check(
            self.first_write_after_heal == "rejected",
            "the downstream table took the stale owner's write",
        );
        check(
            self.first_commit_after_heal == "lease_lost",
            "the stale owner's commit was not LeaseLost",
        );
        check(
            self.downstream_writer == "second" && self.downstream_fence == self.second_fence,
            "the downstream row is not the new owner's",
        );
        out
    }
}

/// How the scenario went: run, or not runnable here (and why).
pub enum Outcome {
    /// It ran.
    Ran(PartitionFigures),
    /// Network namespaces cannot be made here (not root, no `ip`): the reason.
    Unavailable(String),
}

/// The fenced write of `writer` with `fence` for message `id`: `accepted` or `rejected`.
pub(crate) async fn fenced_write(
    pool: &PgPool,
    id: u64,
    fence: u64,
    writer: &str,
) -> Result<&'static str, BoxError> {
    let done = sqlx::query(FENCED_WRITE)
        .bind(key(id).to_string())
        .bind(fence as i64)
        .bind(writer)
        .execute(pool)
        .await?;
    Ok(if done.rows_affected() == 1 {
        "accepted"
    } else {
        "rejected"
    })
}

/// Send `line` to the worker and read its next line.
async fn ask(
    stdin: &mut tokio::process::ChildStdin,
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    line: &str,
) -> Result<String, BoxError> {
    say(stdin, line).await?;
    next(lines).await
}

async fn next(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> Result<String, BoxError> {
    next_line(lines, Duration::from_secs(60), "the cut-off worker").await
}

/// Send `line` to a worker in a namespace (the scenarios talk to theirs in lines).
pub(super) async fn say(
    stdin: &mut tokio::process::ChildStdin,
    line: &str,
) -> Result<(), BoxError> {
    stdin.write_all(format!("{line}\n").as_bytes()).await?;
    Ok(stdin.flush().await?)
}

/// A worker's next line, within `within`; `who` names the worker in the errors.
pub(super) async fn next_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    within: Duration,
    who: &str,
) -> Result<String, BoxError> {
    let line = tokio::time::timeout(within, lines.next_line())
        .await
        .map_err(|_| format!("{who} did not answer within {} s", within.as_secs()))??;
    line.ok_or_else(|| format!("{who} ended early (see its stderr above)").into())
}

/// A private PostgreSQL for a scenario with a fenced downstream: the server, an admin pool
/// on it (the downstream table created), the store on it, and its address (what a front
/// in front of it forwards to).
pub(super) struct FencedServer {
    /// The server (stopped when dropped).
    pub pg: Service,
    /// A pool for reading the downstream table.
    pub admin: PgPool,
    /// The store, with a pool of the size asked for.
    pub store: std::sync::Arc<dyn DedupStore>,
    /// The server's address.
    pub server: SocketAddr,
}

impl FencedServer {
    /// Start it in `dir`, the store's pool `pool_size` connections.
    pub(super) async fn start(
        dir: std::path::PathBuf,
        pool_size: u32,
    ) -> Result<FencedServer, BoxError> {
        let pg = tokio::task::spawn_blocking(move || Postgres::start(&dir)).await??;
        let admin = PgPool::connect(&pg.url).await?;
        sqlx::raw_sql(CREATE_DOWNSTREAM).execute(&admin).await?;
        let store = dedup::open(&format!("{}?pool_size={pool_size}", pg.url)).await?;
        let server = super::backends::socket_addr(&pg.url)?;
        Ok(FencedServer {
            pg,
            admin,
            store,
            server,
        })
    }
}

/// The value after `prefix` in `line`, or an error quoting the line.
fn field<'a>(line: &'a str, prefix: &str) -> Result<&'a str, BoxError> {
    line.strip_prefix(prefix)
        .ok_or_else(|| format!("expected {prefix:?} from the cut-off worker, got {line:?}").into())
}

/// Run the scenario once; `exe` is this program (started again as `cut-worker` inside
/// the namespace).
pub async fn run(args: &PartitionArgs, exe: &std::path::Path) -> Result<Outcome, BoxError> {
    let ns = match NetNs::create() {
        Ok(ns) => ns,
        Err(e) => return Ok(Outcome::Unavailable(e.to_string())),
    };
    let started = Instant::now();
    let lease = Duration::from_millis(args.lease_ms);
    let tmp = tempfile::tempdir()?;
    let FencedServer {
        pg: _pg,
        admin,
        store,
        server,
    } = FencedServer::start(tmp.path().join("pg"), 2).await?;
    // The server, as the namespace sees it: on the host end of the veth pair.
    let front = SwitchingProxy::start(SocketAddr::from((ns.host_addr, 0)), server)?;
    let url = format!("postgres://postgres@{}/dedup", front.addr());
    let mut child = Command::new(ns.exec_prefix()[0])
        .args(&ns.exec_prefix()[1..])
        .arg(exe)
        .args(["cut-worker", "--store", &format!("{url}?pool_size=2")])
        .args([
            "--downstream",
            &url,
            "--lease-ms",
            &args.lease_ms.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut figures = PartitionFigures {
        first_fence: field(&next(&mut lines).await?, "CLAIMED ")?.parse()?,
        ..PartitionFigures::default()
    };
    let claimed_at = Instant::now();
    ns.cut()?;
    figures.renew_during_cut =
        field(&ask(&mut stdin, &mut lines, "renew").await?, "RENEW ")?.into();
    // The first lease runs out while the worker is cut off; the second worker takes over.
    tokio::time::sleep((lease + Duration::from_millis(300)).saturating_sub(claimed_at.elapsed()))
        .await;
    let second = takeover(&*store, lease).await?;
    figures.second_claim = match &second {
        Some(_) => "acquired".into(),
        None => "not acquired within 5 s".into(),
    };
    if let Some(second) = second {
        figures.second_fence = second.fence;
        figures.second_write = fenced_write(&admin, MESSAGE, second.fence, "second")
            .await?
            .into();
        store.commit(&second, Some(b"second")).await?;
    }
    ns.heal()?;
    let result = ask(&mut stdin, &mut lines, "go").await?;
    let (write, commit) = field(&result, "RESULT ")?
        .split_once(' ')
        .ok_or_else(|| format!("malformed result {result:?}"))?;
    figures.first_write_after_heal = write.into();
    figures.first_commit_after_heal = commit.into();
    child.wait().await?;
    let (fence, writer): (i64, String) = sqlx::query_as(READ_DOWNSTREAM)
        .bind(key(MESSAGE).to_string())
        .fetch_one(&admin)
        .await?;
    figures.downstream_fence = fence as u64;
    figures.downstream_writer = writer;
    figures.seconds = started.elapsed().as_secs_f64();
    Ok(Outcome::Ran(figures))
}

/// The second worker's claim, retried for up to 5 s (the first lease expires by the
/// store's clock).
async fn takeover(store: &dyn DedupStore, lease: Duration) -> Result<Option<Lease>, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match store
            .claim(&key(MESSAGE), &ClaimOptions::lease(lease))
            .await?
        {
            Claim::Acquired(lease) => return Ok(Some(lease)),
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            _ => return Ok(None),
        }
    }
}

/// The worker in the namespace: claim, then answer the controller's lines: `renew` (one
/// renewal, a second at most: `RENEW ok|timeout|error ...`) and `go` (the fenced
/// downstream write, then the commit: `RESULT <write> <commit>`, and exit).
pub async fn cut_worker(args: CutWorkerArgs) -> Result<(), BoxError> {
    let lease_for = Duration::from_millis(args.lease_ms);
    let store = dedup::open(&args.store).await?;
    let downstream = PgPool::connect(&args.downstream).await?;
    let lease = match store
        .claim(&key(MESSAGE), &ClaimOptions::lease(lease_for))
        .await?
    {
        Claim::Acquired(lease) => lease,
        other => return Err(format!("the first claim answered {other:?}").into()),
    };
    println!("CLAIMED {}", lease.fence);
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = stdin.next_line().await? {
        match line.as_str() {
            "renew" => {
                let answer =
                    tokio::time::timeout(Duration::from_secs(1), store.renew(&lease, lease_for))
                        .await;
                match answer {
                    Err(_) => println!("RENEW timeout"),
                    Ok(Ok(_)) => println!("RENEW ok"),
                    Ok(Err(e)) => println!("RENEW error {e}"),
                }
            }
            "go" => {
                let write = fenced_write(&downstream, MESSAGE, lease.fence, "first").await?;
                let commit = match store.commit(&lease, Some(b"first")).await {
                    Ok(()) => "ok".to_string(),
                    Err(e) if e.is_lease_lost() => "lease_lost".to_string(),
                    Err(e) => format!("error:{e}").replace(' ', "_"),
                };
                println!("RESULT {write} {commit}");
                return Ok(());
            }
            other => return Err(format!("unexpected line {other:?}").into()),
        }
    }
    Err("the controller closed stdin".into())
}
