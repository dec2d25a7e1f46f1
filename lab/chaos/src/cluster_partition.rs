//! The Redis Cluster partition scenario (`chaos cluster-partition`): a three-primary
//! cluster with a replica per primary ([`Cluster`]), primary 0 alone in a network
//! namespace with a worker beside it. The veth pair is cut: primary 0 is in a minority,
//! its replica with the majority.
//!
//! - During the cut the worker in the namespace claims and commits keys of primary 0's
//!   slots through two stores: one without `WAIT`, one with `wait_replicas=1`. The
//!   isolated primary answers them until it sees itself in a minority (after
//!   `cluster-node-timeout`), then refuses (`CLUSTERDOWN`).
//! - On the host (the majority side) a client claims keys of the same slots until one is
//!   taken: the time the slots were unavailable (until the majority promoted the replica).
//! - Then the network heals; the old primary rejoins as a replica of the new one and drops
//!   what it acknowledged alone. On the majority side, each key the worker committed is
//!   read (*completions lost*: not completed; *doubled*: a redelivery's claim acquires it,
//!   so the effect runs again) and each key it claimed without a commit acknowledged is
//!   claimed (*leases lost*: taken while the worker's 60 s lease still runs). Last, the
//!   worker commits those keys late (expected `LeaseLost`: the new owner's token).
//!
//! The messages are picked from the seed; everything else depends on the servers' timing.

use std::process::Stdio;
use std::time::{Duration, Instant};

use dedup_core::{Claim, ClaimOptions, DedupStore, RecordState};
use dedup_lab::rng::Rng;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use super::netns::NetNs;
use super::partition::{next_line, say};
use super::protocol::key;
use super::redis_cluster::{Cluster, SLOTS};

pub use super::cluster_worker::{ClusterWorkerArgs, cluster_worker};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The worker's lease: far longer than the scenario, so a key taken on the majority side
/// is a live lease lost.
pub const LEASE: Duration = Duration::from_secs(60);

/// How long after a fresh client the majority-side probe waits for the long-lived one.
const LONG_LIVED_GRACE_MS: u64 = 5000;

/// `chaos cluster-partition`.
#[derive(clap::Args, Clone, Debug)]
pub struct ClusterPartitionArgs {
    /// The cluster's `cluster-node-timeout`, ms (repeatable: one run each).
    #[arg(long, default_values_t = [1000u64, 3000])]
    pub node_timeout_ms: Vec<u64>,
    /// Messages per store the worker may use during the cut.
    #[arg(long, default_value_t = 60)]
    pub messages: usize,
    /// Seed of the messages' ids (default: random).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Also print one `JSON {...}` line per row.
    #[arg(long)]
    pub json: bool,
}

/// What one store (with or without `WAIT`) of one run saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClusterPartitionFigures {
    /// The cluster's `cluster-node-timeout`, ms.
    pub node_timeout_ms: u64,
    /// Whether the store ran `WAIT 1` after each commit (`wait_replicas=1`).
    pub wait: bool,
    /// The run's seed.
    pub seed: u64,
    /// Claims the isolated primary acquired during the cut.
    pub claims_acked: u64,
    /// Commits it acknowledged during the cut.
    pub commits_acked: u64,
    /// Claims and commits that failed or got no answer during the cut.
    pub errors: u64,
    /// The first error's text.
    pub first_error: String,
    /// The last acknowledgement of the isolated primary, ms after the cut.
    pub last_ack_ms: Option<u64>,
    /// The majority side's first claim on primary 0's slots through a store opened for
    /// the attempt (as a restarted client would), ms after the cut.
    pub fresh_client_claim_ms: Option<u64>,
    /// ... through the store opened before the cut (`None`: not within 5 s of the fresh
    /// one: the cluster client keeps sending to the cut-off primary's silent connection).
    pub long_lived_client_claim_ms: Option<u64>,
    /// When the replica of primary 0 reported itself primary, ms after the cut.
    pub replica_promoted_ms: Option<u64>,
    /// When the old primary was a replica again, ms after the heal.
    pub rejoined_ms: Option<u64>,
    /// Acknowledged commits whose key the majority does not hold as completed.
    pub completions_lost: u64,
    /// Of those, keys a redelivery's claim acquired (the effect runs a second time).
    pub doubled: u64,
    /// Keys claimed by the worker, commit not acknowledged, that the majority claimed while
    /// the worker's lease still ran.
    pub leases_lost: u64,
    /// The worker's late commits of those keys after the heal that answered `Ok`.
    pub late_commits_ok: u64,
    /// ... that answered `LeaseLost`.
    pub late_commits_lease_lost: u64,
    /// Wall time of the run, seconds.
    pub seconds: f64,
}

impl ClusterPartitionFigures {
    /// What went against the contract (empty: it held). Without `WAIT` the losses are
    /// measured, not checked: that is what asynchronous replication allows.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        let tag = format!(
            "node timeout {} ms, {}",
            self.node_timeout_ms,
            if self.wait { "WAIT 1" } else { "no WAIT" }
        );
        if self.wait && self.completions_lost > 0 {
            out.push(format!(
                "{tag}: {} completions acknowledged with WAIT lost",
                self.completions_lost
            ));
        }
        if self.late_commits_ok > 0 {
            out.push(format!(
                "{tag}: {} late commits of a key taken over answered Ok",
                self.late_commits_ok
            ));
        }
        if self.fresh_client_claim_ms.is_none() {
            out.push(format!(
                "{tag}: the majority never served primary 0's slots"
            ));
        }
        out
    }
}

/// How the scenario went: run, or not runnable here (and why).
pub enum Outcome {
    /// It ran: per node timeout, the store without `WAIT`, then with.
    Ran(Vec<ClusterPartitionFigures>),
    /// Network namespaces cannot be made here (not root, no `ip`): the reason.
    Unavailable(String),
}

/// Run the scenario once per node timeout; `exe` is this program (started again as
/// `cluster-worker` inside the namespace).
pub async fn run(
    args: &ClusterPartitionArgs,
    seed: u64,
    exe: &std::path::Path,
) -> Result<Outcome, BoxError> {
    let mut rows = Vec::new();
    for &timeout in &args.node_timeout_ms {
        let ns = match NetNs::create() {
            Ok(ns) => ns,
            Err(e) => return Ok(Outcome::Unavailable(e.to_string())),
        };
        rows.extend(run_one(&ns, timeout, args.messages, seed, exe).await?);
    }
    Ok(Outcome::Ran(rows))
}

/// `n` message ids of the keys in primary 0's slots, from a seeded start, for each of
/// `sets` uses.
async fn pick_ids(
    cluster: &Cluster,
    seed: u64,
    n: usize,
    sets: usize,
) -> Result<Vec<Vec<u64>>, BoxError> {
    let store = dedup_redis::RedisStore::connect_cluster(
        &[cluster.nodes[1].url()],
        dedup_redis::RedisConfig::default(),
    )
    .await?;
    let mut next = Rng::new(seed).below(1_000_000_000);
    let mut ids = Vec::new();
    while ids.len() < n * sets {
        let batch: Vec<u64> = (next..next + 200).collect();
        next += 200;
        let keys: Vec<String> = batch.iter().map(|&id| store.redis_key(&key(id))).collect();
        let slots = tokio::task::block_in_place(|| cluster.slots(&keys))?;
        ids.extend(
            batch
                .into_iter()
                .zip(slots)
                .filter(|(_, slot)| *slot <= SLOTS[0].1)
                .map(|(id, _)| id),
        );
    }
    ids.truncate(n * sets);
    Ok(ids.chunks(n).map(<[u64]>::to_vec).collect())
}

/// What the worker reported for one store.
#[derive(Default)]
struct Reported {
    committed: Vec<u64>,
    held: Vec<u64>,
    figures: ClusterPartitionFigures,
}

async fn run_one(
    ns: &NetNs,
    node_timeout_ms: u64,
    messages: usize,
    seed: u64,
    exe: &std::path::Path,
) -> Result<Vec<ClusterPartitionFigures>, BoxError> {
    let started = Instant::now();
    let tmp = tempfile::tempdir()?;
    let cluster = tokio::task::block_in_place(|| Cluster::start(tmp.path(), ns, node_timeout_ms))?;
    let majority_url = cluster.url(&[1, 2], "?response_timeout=1s&connect_timeout=500ms");
    let sets = pick_ids(&cluster, seed, messages, 3).await?;
    let long_lived = dedup::open(&majority_url).await?;
    let ns_url = |params: &str| cluster.url(&[0], &format!("?connect_timeout=1s{params}"));
    let mut child = Command::new(ns.exec_prefix()[0])
        .args(&ns.exec_prefix()[1..])
        .arg(exe)
        .arg("cluster-worker")
        .args(["--store", &ns_url("&response_timeout=2s")])
        .args([
            "--store-wait",
            &ns_url("&response_timeout=2s&wait_replicas=1&wait_timeout=500ms"),
        ])
        .args(["--ids", &join(&sets[0]), "--ids-wait", &join(&sets[1])])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    expect(&next(&mut lines).await?, "READY")?;

    ns.cut()?;
    let cut = Instant::now();
    eprintln!(
        "cluster-partition: cut after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    say(&mut stdin, "go").await?;
    let probe = majority_probe(&cluster, &majority_url, &*long_lived, &sets[2], cut).await?;
    // The isolated primary refuses by then; a little more, then the worker stops.
    tokio::time::sleep(Duration::from_millis(500)).await;
    say(&mut stdin, "stop").await?;
    let mut reported = [Reported::default(), Reported::default()];
    loop {
        let line = next(&mut lines).await?;
        if line == "STOPPED" {
            break;
        }
        record(&mut reported, &line)?;
    }

    ns.heal()?;
    let healed = Instant::now();
    eprintln!(
        "cluster-partition: {probe:?}, healed at {} ms",
        cut.elapsed().as_millis()
    );
    tokio::task::block_in_place(|| {
        super::redis_cluster::wait_until("the old primary rejoins as a replica", || {
            Ok(cluster.is_primary(0) == Some(false)
                && cluster.nodes[0].info_field("replication", "master_link_status")? == "up"
                && cluster.nodes[1].info_field("cluster-info", "cluster_state")? == "ok")
        })
    })?;
    let rejoined_ms = healed.elapsed().as_millis() as u64;
    eprintln!("cluster-partition: rejoined {rejoined_ms} ms after the heal");
    // The checks through a client that knows the new topology.
    let majority = dedup::open(&majority_url).await?;

    for r in &mut reported {
        for &id in &r.committed {
            let completed = matches!(
                majority.get(&key(id)).await?.map(|r| r.state),
                Some(RecordState::Completed { .. })
            );
            if !completed {
                r.figures.completions_lost += 1;
                if let Claim::Acquired(lease) = majority
                    .claim(&key(id), &ClaimOptions::lease(LEASE))
                    .await?
                {
                    r.figures.doubled += 1;
                    majority.commit(&lease, Some(b"again")).await?;
                }
            }
        }
        for &id in &r.held {
            if let Claim::Acquired(_) = majority
                .claim(&key(id), &ClaimOptions::lease(LEASE))
                .await?
            {
                r.figures.leases_lost += 1;
            }
        }
    }
    say(&mut stdin, "late").await?;
    loop {
        let line = next(&mut lines).await?;
        if line == "END" {
            break;
        }
        record(&mut reported, &line)?;
    }
    child.wait().await?;
    Ok(reported
        .into_iter()
        .enumerate()
        .map(|(i, r)| ClusterPartitionFigures {
            node_timeout_ms,
            wait: i == 1,
            seed,
            replica_promoted_ms: probe.promoted,
            fresh_client_claim_ms: probe.fresh_client,
            long_lived_client_claim_ms: probe.long_lived_client,
            rejoined_ms: Some(rejoined_ms),
            seconds: started.elapsed().as_secs_f64(),
            ..r.figures
        })
        .collect())
}

/// When the majority side served primary 0's slots again, in ms after the cut (`None`:
/// not within the probe's time).
#[derive(Clone, Copy, Debug, Default)]
struct Probe {
    /// Primary 0's replica reported itself primary.
    promoted: Option<u64>,
    /// A store opened afresh for the attempt acquired a key.
    fresh_client: Option<u64>,
    /// The store opened before the cut acquired a key.
    long_lived_client: Option<u64>,
}

/// On the majority side, from the cut: watch primary 0's replica become primary, and
/// claim keys of primary 0's slots, through the store opened before the cut and through a
/// store opened for each attempt, until both have acquired one, or the fresh one has and
/// the other has not within 5 s more (60 s at most in all).
async fn majority_probe(
    cluster: &Cluster,
    url: &str,
    long_lived: &dyn DedupStore,
    ids: &[u64],
    cut: Instant,
) -> Result<Probe, BoxError> {
    let mut probe = Probe::default();
    let since = || Some(cut.elapsed().as_millis() as u64);
    let mut ids = ids.iter().cycle();
    let mut take = async |store: &dyn DedupStore| -> Result<bool, BoxError> {
        let id = ids.next().ok_or("no probe ids")?;
        let claim = tokio::time::timeout(
            Duration::from_millis(1000),
            store.claim(&key(*id), &ClaimOptions::lease(LEASE)),
        )
        .await;
        if let Ok(Ok(Claim::Acquired(lease))) = claim {
            store.commit(&lease, None).await?;
            return Ok(true);
        }
        Ok(false)
    };
    while cut.elapsed() < Duration::from_secs(60) {
        if probe.promoted.is_none()
            && tokio::task::block_in_place(|| cluster.is_primary(3)) == Some(true)
        {
            probe.promoted = since();
        }
        if probe.fresh_client.is_none() {
            let fresh = tokio::time::timeout(Duration::from_secs(2), dedup::open(url)).await;
            if let Ok(Ok(fresh)) = fresh
                && take(&*fresh).await?
            {
                probe.fresh_client = since();
            }
        }
        if probe.long_lived_client.is_none() && take(long_lived).await? {
            probe.long_lived_client = since();
        }
        match (probe.fresh_client, probe.long_lived_client) {
            (Some(_), Some(_)) => break,
            (Some(fresh), None) if since() > Some(fresh + LONG_LIVED_GRACE_MS) => break,
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    Ok(probe)
}

/// One line of the worker's report into `reported` (`[without WAIT, with WAIT]`).
fn record(reported: &mut [Reported; 2], line: &str) -> Result<(), BoxError> {
    let bad = || format!("unexpected line from the cluster worker: {line:?}");
    let mut parts = line.splitn(5, ' ');
    let (Some(what), Some(store), Some(id), Some(ms)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad().into());
    };
    let r = &mut reported[usize::from(store == "wait")];
    let id: u64 = id.parse().map_err(|_| bad())?;
    let ms: u64 = ms.parse().map_err(|_| bad())?;
    let f = &mut r.figures;
    match what {
        "CLAIMED" => {
            f.claims_acked += 1;
            f.last_ack_ms = Some(ms);
            r.held.push(id);
        }
        "COMMITTED" => {
            f.commits_acked += 1;
            f.last_ack_ms = Some(ms);
            r.held.retain(|h| *h != id);
            r.committed.push(id);
        }
        "FAILED" => {
            f.errors += 1;
            if f.first_error.is_empty() {
                f.first_error = parts.next().unwrap_or("").to_string();
            }
        }
        "LATE" => match parts.next() {
            Some("ok") => f.late_commits_ok += 1,
            Some("lease_lost") => f.late_commits_lease_lost += 1,
            _ => {}
        },
        _ => return Err(bad().into()),
    }
    Ok(())
}

fn join(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

fn expect(line: &str, want: &str) -> Result<(), BoxError> {
    if line == want {
        Ok(())
    } else {
        Err(format!("expected {want:?} from the cluster worker, got {line:?}").into())
    }
}

async fn next(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> Result<String, BoxError> {
    next_line(lines, Duration::from_secs(90), "the cluster worker").await
}
