//! A node lost mid-run loses nothing: the stream leader of an R3 bucket SIGKILLed, and the
//! leader cut off by its network link, while workers claim and commit redelivered messages
//! on the server's clock. Each run has a private 3-node cluster
//! (`scripts/services.sh start nats-cluster` in a state dir of its own), stopped at the end.
//!
//! Every message is delivered twice, and a delivery that met an error, a live lease or a
//! lost lease is delivered again later, as a broker would. At the end, for every message:
//! - **lost**: 0. No message acknowledged as completed (its commit answered `Ok`) is
//!   claimable again, and its record holds that commit's outcome;
//! - **doubled**: 0. No message has two acknowledged completions (two commits answering
//!   `Ok` under different leases);
//! - every message is completed and acknowledged once.
//!
//! The seeds, counts and the time the bucket was unavailable are printed.

mod common;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_core::{Claim, ClaimOptions, DedupStore, Error, Key};
use dedup_nats_kv::NatsKvStore;
use dedup_nats_kv::async_nats::{self, jetstream};

/// Messages per run (each delivered twice).
const MESSAGES: usize = 300;
/// Concurrent workers.
const WORKERS: usize = 8;
/// The workers' lease: longer than an election, so takeovers come from real expiry only.
const LEASE: Duration = Duration::from_secs(10);
/// The bucket each private cluster holds.
const BUCKET: &str = "node_loss";

/// A private cluster, stopped (its state dir removed) when dropped.
struct Cluster {
    dir: PathBuf,
    servers: Vec<String>,
    /// The link that cuts n3 off (partition runs only).
    cut_link: Option<String>,
}

fn services() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services.sh")
}

impl Cluster {
    fn start(netns: bool) -> Cluster {
        let dir = std::env::temp_dir().join(common::unique_prefix("dedup-nats-loss"));
        let status = Command::new(services())
            .args(["start", "nats-cluster"])
            .env("DEDUP_SERVICES_DIR", &dir)
            .env("DEDUP_NATS_CLUSTER_NETNS", if netns { "1" } else { "0" })
            .status()
            .expect("run scripts/services.sh");
        let mut cluster = Cluster {
            dir,
            servers: Vec::new(),
            cut_link: None,
        };
        assert!(status.success(), "the private NATS cluster did not start");
        let env = Command::new(services())
            .arg("env")
            .env("DEDUP_SERVICES_DIR", &cluster.dir)
            .output()
            .expect("run scripts/services.sh env");
        let env = String::from_utf8_lossy(&env.stdout).to_string();
        let value = |name: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .map(|v| v.trim_matches('\'').to_owned())
        };
        cluster.servers = common::servers(&value("DEDUP_NATS_CLUSTER_URLS").expect("cluster URLs"));
        cluster.cut_link = value("DEDUP_NATS_CLUSTER_CUT_LINK");
        cluster
    }

    /// The pid of node `name` (`n1`...).
    fn pid(&self, name: &str) -> String {
        let file = self
            .dir
            .join(format!("nats-cluster/node-{}/nats.pid", &name[1..]));
        std::fs::read_to_string(file)
            .expect("the node's pid file")
            .trim()
            .to_owned()
    }

    fn link(&self, up: bool) {
        let link = self.cut_link.as_deref().expect("a partitionable cluster");
        let state = if up { "up" } else { "down" };
        let ok = Command::new("ip")
            .args(["link", "set", link, state])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip link set {link} {state}");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(services())
            .arg("stop")
            .env("DEDUP_SERVICES_DIR", &self.dir)
            .status();
    }
}

/// A plain client of the cluster, for asking it about the stream.
async fn client(servers: &[String]) -> async_nats::Client {
    let addrs: Vec<async_nats::ServerAddr> = servers
        .iter()
        .map(|s| s.parse().expect("a server URL"))
        .collect();
    async_nats::connect(addrs).await.expect("connect")
}

/// The bucket's stream and its leader's name, asked of any node that answers.
async fn leader(servers: &[String]) -> String {
    let js = jetstream::new(client(servers).await);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut stream) = js.get_stream(format!("KV_{BUCKET}")).await
            && let Ok(info) = stream.info().await
            && let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.clone())
        {
            return leader;
        }
        assert!(Instant::now() < deadline, "no stream leader in 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Move the bucket's stream leader to `node` (asking the current one to step down until
/// the election lands there).
async fn lead_from(servers: &[String], node: &str) {
    let client = client(servers).await;
    for _ in 0..30 {
        if leader(servers).await == node {
            return;
        }
        let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.KV_{BUCKET}");
        let _ = client.request(subject, "".into()).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the stream leader never moved to {node}");
}

/// What the workers saw.
#[derive(Default)]
struct Tally {
    /// The outcomes of the acknowledged commits, per message.
    acknowledged: HashMap<Key, Vec<String>>,
    /// Calls that failed with a (retryable) error.
    errors: u64,
    /// When the first and the last error happened.
    unavailable: Option<(Instant, Instant)>,
    /// Deliveries handled (done or sent back).
    deliveries: u64,
}

/// Deliver every message twice to [`WORKERS`] workers until each delivery found its
/// message completed; `fault` runs once a third of the messages are acknowledged.
async fn run(stores: Vec<NatsKvStore>, fault: impl AsyncFnOnce()) -> Tally {
    let keys: Vec<Key> = (0..MESSAGES)
        .map(|i| Key::new("loss", format!("m{i}")).expect("key"))
        .collect();
    let queue: VecDeque<Key> = keys.iter().chain(&keys).cloned().collect();
    let queue = Arc::new(Mutex::new(queue));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let store = stores[w % stores.len()].clone();
            tokio::spawn(worker(store, w, queue.clone(), tally.clone()))
        })
        .collect();
    loop {
        let acked = tally.lock().unwrap().acknowledged.len();
        if acked >= MESSAGES / 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fault().await;
    for w in workers {
        w.await.expect("a worker panicked");
    }
    Arc::into_inner(tally).unwrap().into_inner().unwrap()
}

async fn worker(
    store: NatsKvStore,
    w: usize,
    queue: Arc<Mutex<VecDeque<Key>>>,
    tally: Arc<Mutex<Tally>>,
) {
    let failed = |tally: &Mutex<Tally>, e: &Error| {
        assert!(e.is_retryable(), "worker {w}: a non-retryable error: {e:?}");
        let mut t = tally.lock().unwrap();
        t.errors += 1;
        let now = Instant::now();
        t.unavailable = Some(t.unavailable.map_or((now, now), |(first, _)| (first, now)));
    };
    loop {
        let Some(key) = queue.lock().unwrap().pop_front() else {
            return;
        };
        tally.lock().unwrap().deliveries += 1;
        let done = match store.claim(&key, &ClaimOptions::lease(LEASE)).await {
            Ok(Claim::Completed { .. }) => true,
            Ok(Claim::InFlight { .. }) => false,
            Ok(Claim::Acquired(lease)) => {
                let outcome = format!("worker {w} token {}", lease.token);
                // The handler's effect happened; commit until the store answers.
                loop {
                    match store.commit(&lease, Some(outcome.as_bytes())).await {
                        Ok(()) => {
                            let mut t = tally.lock().unwrap();
                            t.acknowledged.entry(key.clone()).or_default().push(outcome);
                            break true;
                        }
                        Err(Error::LeaseLost { .. }) => break false,
                        Err(e) => {
                            failed(&tally, &e);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }
            Err(e) => {
                failed(&tally, &e);
                tokio::time::sleep(Duration::from_millis(50)).await;
                false
            }
        };
        if !done {
            // Redelivered later, as a broker would after a nack.
            queue.lock().unwrap().push_back(key);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Check the run's promises against the records; print the counts.
async fn assert_nothing_lost_or_doubled(what: &str, store: &NatsKvStore, tally: &Tally) {
    let mut lost = 0;
    let mut doubled = 0;
    for i in 0..MESSAGES {
        let key = Key::new("loss", format!("m{i}")).expect("key");
        let acked = tally.acknowledged.get(&key).cloned().unwrap_or_default();
        if acked.len() > 1 {
            doubled += 1;
        }
        let stored = read_back(store, &key).await;
        let outcome = stored.and_then(|r| match r.state {
            dedup_core::RecordState::Completed { outcome, .. } => outcome,
            dedup_core::RecordState::InFlight { .. } => None,
        });
        let outcome = outcome.map(|o| String::from_utf8_lossy(&o).into_owned());
        if acked.is_empty() || outcome.as_ref() != acked.first() {
            lost += 1;
        }
    }
    let window = tally.unavailable.map_or(Duration::ZERO, |(a, b)| b - a);
    println!(
        "{what}: {MESSAGES} messages, {} deliveries, {} acknowledged, lost {lost}, doubled \
         {doubled}, {} retryable errors over {window:?}",
        tally.deliveries,
        tally.acknowledged.len(),
        tally.errors,
    );
    assert_eq!((lost, doubled), (0, 0), "{what}: lost, doubled");
}

/// `key`'s record, read again on retryable errors for up to 30 s (an election may still
/// be going on).
async fn read_back(store: &NatsKvStore, key: &Key) -> Option<dedup_core::Record> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match store.get(key).await {
            Ok(record) => return record,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("read {key} back: {e:?}"),
        }
    }
}

async fn stores(servers: &[String]) -> Vec<NatsKvStore> {
    let mut stores = Vec::new();
    for _ in 0..3 {
        let mut config = common::config("loss", None);
        config.bucket = BUCKET.into();
        let store = NatsKvStore::connect(servers, config).await.expect("open");
        stores.push(store);
    }
    stores
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_stream_leader_loses_nothing() {
    if common::cluster().is_none() {
        return;
    }
    let cluster = Cluster::start(false);
    let stores = stores(&cluster.servers).await;
    let first = leader(&cluster.servers).await;
    let pid = cluster.pid(&first);
    let tally = run(stores.clone(), async || {
        let killed = Command::new("kill").args(["-KILL", &pid]).status();
        assert!(killed.is_ok_and(|s| s.success()), "kill -KILL {pid}");
    })
    .await;
    let next = leader(&cluster.servers).await;
    assert_ne!(next, first, "a new leader was elected");
    let what = format!("leader {first} killed, {next} took over");
    assert_nothing_lost_or_doubled(&what, &stores[0], &tally).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_stream_leader_loses_nothing() {
    if common::cluster().is_none() {
        return;
    }
    let cluster = Cluster::start(true);
    let stores = stores(&cluster.servers).await;
    lead_from(&cluster.servers, "n3").await;
    let tally = run(stores.clone(), async || cluster.link(false)).await;
    let next = leader(&cluster.servers).await;
    assert_ne!(next, "n3", "the majority elected a leader of its own");
    let what = format!("leader n3 cut off, {next} took over");
    assert_nothing_lost_or_doubled(&what, &stores[0], &tally).await;
    // Healed, n3 catches up and nothing changes.
    cluster.link(true);
    let what = format!("{what}, then healed");
    assert_nothing_lost_or_doubled(&what, &stores[0], &tally).await;
}
