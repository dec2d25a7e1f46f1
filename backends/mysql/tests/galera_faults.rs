//! Node loss on the Galera cluster (`DEDUP_GALERA_URLS`), mid-run: workers on each of the
//! three nodes consume messages through `TxInbox` (a business row and an outbox message
//! in the handler's transaction), a relay on each node publishes the outbox. Node 3 is
//! SIGKILLed (`scripts/services.sh crash-restart galera`), or partitioned from the other
//! two: it runs in a network namespace, and the link carrying the cluster's traffic to it
//! (`DEDUP_GALERA_CUT_LINK`) goes down. Its clients still reach it over a link of their
//! own, as clients beside it would, and get error 1047 once it leaves the primary
//! component. Then the node comes back and catches up. No message is lost or processed
//! twice, and every committed outbox message is published, none other.
//!
//! A commit can succeed on the cluster while its answer is lost (the node killed after
//! replicating it, or the delivery timed out while it committed). The worker then sees a
//! failure, and the redelivery answers `Duplicate`: the business row is there once. So a
//! duplicate is allowed only for a message that had a failed delivery before it.
//!
//! A delivery that failed (its node down, a conflict, a timeout) goes back to the queue,
//! as a broker redelivers it, and may reach a worker on another node. `DEDUP_GALERA_SEED`
//! replays a run's message order and fault point.

#[path = "galera/mod.rs"]
mod common;
#[path = "common/mod.rs"]
mod mysql_common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_core::outbox::{ConsumerOutbox, MemoryPublisher, OutboxStore, Relay, RelayConfig};
use dedup_core::{BoxError, Handled, InboxConfig, InboxError, Key};
use dedup_mysql::sqlx::mysql::MySqlDatabaseError;
use dedup_mysql::sqlx::{self, AssertSqlSafe, Connection, MySqlConnection};
use dedup_mysql::{MySqlStore, TxInbox};

/// Messages per run.
const MESSAGES: usize = 240;
/// Workers per node.
const WORKERS_PER_NODE: usize = 2;
/// How long one delivery may take before it counts as failed and goes back to the queue.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(5);
/// The inbox's lease: a delivery whose worker lost its node is taken over after it.
const LEASE: Duration = Duration::from_secs(5);
/// How long the killed node stays down, and the cut node out of the primary component.
const FAULT_SECONDS: u64 = 4;
/// The variable naming the host end of node 3's cluster link (`scripts/services/galera.sh`).
const CUT_LINK_VAR: &str = "DEDUP_GALERA_CUT_LINK";

/// The fault tests take turns: each takes a node of the one cluster away.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What a run takes away, and from which node.
#[derive(Clone, Debug)]
enum Fault {
    /// SIGKILL node 3, restart it after [`FAULT_SECONDS`].
    Kill,
    /// Cut node 3's cluster link; heal it [`FAULT_SECONDS`] after the node left the
    /// primary component.
    Partition(String),
}

/// What a run counted.
#[derive(Debug, Default)]
struct Counts {
    acknowledged: AtomicUsize,
    processed: AtomicUsize,
    duplicates: AtomicUsize,
    redelivered: AtomicUsize,
    /// Deliveries that found the message in flight under another worker's live lease.
    busy: AtomicUsize,
    /// Failed deliveries whose error was the node's 1047 (not in the primary component).
    non_primary: AtomicUsize,
    /// Failed deliveries that ran out of [`DELIVERY_TIMEOUT`].
    timed_out: AtomicUsize,
    /// The store's errors that said a retry could not help: a node lost for a while is
    /// no reason to give a message up.
    not_retryable: Mutex<Vec<String>>,
    /// Messages that had a failed delivery.
    failed_once: Mutex<HashSet<usize>>,
    /// Messages answered `Duplicate` without a failed delivery before: a double claim.
    unexplained_duplicates: Mutex<Vec<usize>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_killed_mid_run_loses_and_doubles_nothing() {
    if common::url().is_none() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    run(Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_partitioned_mid_run_loses_and_doubles_nothing() {
    if common::url().is_none() {
        return;
    }
    let Some(link) = std::env::var(CUT_LINK_VAR).ok().filter(|l| !l.is_empty()) else {
        let why = format!(
            "{CUT_LINK_VAR} is not set: the cluster's node 3 is not in a network namespace \
             (scripts/services.sh start galera, as root)"
        );
        assert!(
            !dedup_conformance::strict(),
            "{why} and DEDUP_TEST_STRICT=1"
        );
        eprintln!("skipped: {why}");
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    run(Fault::Partition(link)).await;
}

/// The seed of a run: `DEDUP_GALERA_SEED`, else the clock's.
fn seed() -> u64 {
    std::env::var("DEDUP_GALERA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        })
}

/// xorshift64: the run's message order and fault point.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

async fn run(fault: Fault) {
    let seed = seed();
    let mut rng = seed;
    let urls = common::urls();
    let table = common::unique_table("faults");
    let mut stores = Vec::new();
    for url in &urls {
        stores.push(common::node_store(url, &table, None).await);
    }
    common::create_business_table(&stores[0]).await;
    let mut order: Vec<usize> = (0..MESSAGES).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (next(&mut rng) % (i as u64 + 1)) as usize);
    }
    let fault_after = MESSAGES / 4 + (next(&mut rng) % (MESSAGES as u64 / 4)) as usize;
    let queue = Arc::new(Mutex::new(order.into_iter().collect::<VecDeque<_>>()));
    let counts = Arc::new(Counts::default());
    let publisher = Arc::new(MemoryPublisher::new());
    let relays: Vec<_> = stores
        .iter()
        .map(|store| {
            Relay::new(Arc::new(store.outbox()), publisher.clone())
                .with_config(
                    RelayConfig::default()
                        .poll_interval(Duration::from_millis(50))
                        .hold(Duration::from_secs(3))
                        .mark_margin(Duration::from_secs(1)),
                )
                .start()
                .expect("a relay starts")
        })
        .collect();
    let started = Instant::now();
    let mut workers = Vec::new();
    for store in &stores {
        for _ in 0..WORKERS_PER_NODE {
            workers.push(tokio::spawn(worker(
                store.clone(),
                queue.clone(),
                counts.clone(),
            )));
        }
    }
    while counts.acknowledged.load(Ordering::SeqCst) < fault_after {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let what = match &fault {
        Fault::Kill => {
            kill_and_restart(3).await;
            "killed".to_owned()
        }
        Fault::Partition(link) => {
            let left = partition_and_heal(link, &urls[2]).await;
            format!("partitioned, out of the primary component {left:.1?} after the cut")
        }
    };
    for worker in workers {
        tokio::time::timeout(Duration::from_secs(120), worker)
            .await
            .expect("the workers finish within 2 minutes")
            .expect("a worker panicked");
    }
    let consumed = started.elapsed();
    let (lost, doubled) = business_rows_per_key(&stores[0]).await;
    let published = published_when_drained(&stores[0], &publisher).await;
    for relay in relays {
        relay.stop().await;
    }
    let unique: HashSet<&String> = published.iter().collect();
    let expected: HashSet<String> = (0..MESSAGES)
        .map(|i| dedup_core::outbox::derived_message_id(&key(i), 0))
        .collect();
    let unexpected = unique
        .iter()
        .filter(|id| !expected.contains(id.as_str()))
        .count();
    let unpublished = expected.iter().filter(|id| !unique.contains(id)).count();
    eprintln!(
        "galera node 3 {what}: seed {seed}, fault after {fault_after} acks, {MESSAGES} \
         messages in {consumed:.1?}: acknowledged {}, processed {}, duplicates {}, \
         redelivered {} (busy {}, non-primary {}, timed out {}); lost {lost}, doubled \
         {doubled}; outbox published {} ({} again), unpublished {unpublished}, not \
         committed {unexpected}",
        counts.acknowledged.load(Ordering::SeqCst),
        counts.processed.load(Ordering::SeqCst),
        counts.duplicates.load(Ordering::SeqCst),
        counts.redelivered.load(Ordering::SeqCst),
        counts.busy.load(Ordering::SeqCst),
        counts.non_primary.load(Ordering::SeqCst),
        counts.timed_out.load(Ordering::SeqCst),
        unique.len(),
        published.len() - unique.len(),
    );
    if let Fault::Partition(_) = fault {
        assert!(
            counts.non_primary.load(Ordering::SeqCst) > 0,
            "no client of node 3 saw it out of the primary component (seed {seed})"
        );
    }
    assert_eq!(
        (lost, doubled),
        (0, 0),
        "messages lost, doubled (seed {seed})"
    );
    assert_eq!(
        counts.processed.load(Ordering::SeqCst) + counts.duplicates.load(Ordering::SeqCst),
        MESSAGES,
        "each message acknowledged once, processed or found done (seed {seed})"
    );
    assert_eq!(
        *counts.unexplained_duplicates.lock().expect("the counts"),
        Vec::<usize>::new(),
        "messages found done with no failed delivery before (seed {seed})"
    );
    assert_eq!(
        *counts.not_retryable.lock().expect("the counts"),
        Vec::<String>::new(),
        "store errors that said a retry could not help (seed {seed})"
    );
    assert_eq!(
        (unpublished, unexpected),
        (0, 0),
        "outbox messages committed but never published, published but never committed \
         (seed {seed})"
    );
}

fn key(i: usize) -> Key {
    Key::new("galera-faults", format!("m-{i}")).expect("a key")
}

/// Take messages off the queue until every one is acknowledged; a failed delivery goes
/// back to the end of the queue.
async fn worker(store: MySqlStore, queue: Arc<Mutex<VecDeque<usize>>>, counts: Arc<Counts>) {
    // A lease a killed worker's claim gives up soon: its message is redelivered then.
    let inbox = TxInbox::new(store.clone()).with_config(InboxConfig {
        lease: LEASE,
        ..InboxConfig::default()
    });
    loop {
        let next = queue.lock().expect("the queue").pop_front();
        let Some(i) = next else {
            if counts.acknowledged.load(Ordering::SeqCst) == MESSAGES {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let key = key(i);
        let store = store.clone();
        let handled = tokio::time::timeout(
            DELIVERY_TIMEOUT,
            inbox.handle(&key, None, move |conn, lease| {
                let store = store.clone();
                Box::pin(async move { handle(&store, conn, lease).await })
            }),
        )
        .await;
        match handled {
            Ok(Ok(Handled::Processed { .. })) => {
                counts.processed.fetch_add(1, Ordering::SeqCst);
                counts.acknowledged.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Ok(Handled::Duplicate { .. })) => {
                if !counts.failed_once.lock().expect("the counts").contains(&i) {
                    counts
                        .unexplained_duplicates
                        .lock()
                        .expect("the counts")
                        .push(i);
                }
                counts.duplicates.fetch_add(1, Ordering::SeqCst);
                counts.acknowledged.fetch_add(1, Ordering::SeqCst);
            }
            failed => {
                let tally = match failed {
                    Err(_) => Some(&counts.timed_out),
                    Ok(Ok(Handled::Busy { .. })) => Some(&counts.busy),
                    Ok(Err(InboxError::Store(e))) if !e.is_retryable() => {
                        let mut not_retryable = counts.not_retryable.lock().expect("the counts");
                        not_retryable.push(format!("{e:?}"));
                        None
                    }
                    Ok(Err(e)) if error_number(&e) == Some(1047) => Some(&counts.non_primary),
                    Ok(_) => None,
                };
                if let Some(tally) = tally {
                    tally.fetch_add(1, Ordering::SeqCst);
                }
                counts.failed_once.lock().expect("the counts").insert(i);
                counts.redelivered.fetch_add(1, Ordering::SeqCst);
                queue.lock().expect("the queue").push_back(i);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// The server's error number behind `error`, if a server sent it.
fn error_number(error: &(dyn std::error::Error + 'static)) -> Option<u16> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>() {
            return db
                .try_downcast_ref::<MySqlDatabaseError>()
                .map(MySqlDatabaseError::number);
        }
        next = e.source();
    }
    None
}

/// The handler: a business row and one outbox message, in the inbox's transaction.
async fn handle(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    lease: &dedup_core::Lease,
) -> Result<Option<Vec<u8>>, BoxError> {
    // Not `common::insert_business_row`, which panics: a node lost mid-handler is an error.
    let insert = format!(
        "INSERT INTO {} (consumer, message_id, label) VALUES (?, ?, 'done')",
        common::business_table(store)
    );
    sqlx::query(AssertSqlSafe(insert))
        .bind(lease.key.consumer())
        .bind(lease.key.message_id())
        .execute(&mut *conn)
        .await?;
    let mut out = ConsumerOutbox::new(lease);
    let message = out.message("receipts", b"paid".to_vec())?;
    store.outbox().enqueue(&mut *conn, &[message]).await?;
    Ok(None)
}

/// Keys without a business row, and keys with more than one.
async fn business_rows_per_key(store: &MySqlStore) -> (usize, usize) {
    let sql = format!(
        "SELECT CAST(message_id AS CHAR), COUNT(*) FROM {} GROUP BY message_id",
        common::business_table(store)
    );
    let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(sql))
        .fetch_all(store.pool())
        .await
        .expect("business rows");
    let per_key: HashMap<String, i64> = rows.into_iter().collect();
    let lost = (0..MESSAGES)
        .filter(|i| !per_key.contains_key(key(*i).message_id()))
        .count();
    let doubled = per_key.values().filter(|n| **n > 1).count();
    (lost, doubled)
}

/// The published message ids once no outbox row is pending or held (within 60 s).
async fn published_when_drained(store: &MySqlStore, publisher: &MemoryPublisher) -> Vec<String> {
    let outbox = store.outbox();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = outbox.stats().await.expect("outbox stats");
        if stats.pending == 0 && stats.held == 0 {
            return publisher.message_ids();
        }
        assert!(
            Instant::now() < deadline,
            "the outbox did not drain: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGKILL node `node`, keep it down [`FAULT_SECONDS`], start it again; it rejoins.
async fn kill_and_restart(node: u8) {
    let dir = std::env::var("DEDUP_GALERA_DIR").expect("DEDUP_GALERA_DIR");
    let state_dir = std::path::Path::new(&dir)
        .parent()
        .expect("the services' state dir")
        .to_owned();
    let script =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services.sh");
    let mut restart = std::process::Command::new(script);
    restart
        .args(["crash-restart", "galera", &node.to_string()])
        .arg(FAULT_SECONDS.to_string())
        .env("DEDUP_SERVICES_DIR", state_dir);
    run_command(restart).await;
}

/// Run `command` off the runtime's threads; it must succeed.
async fn run_command(mut command: std::process::Command) {
    let what = format!("{command:?}");
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the command's thread")
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Cut node 3 off (`ip link set LINK down` on its cluster link), wait until it says it is
/// out of the primary component (asked over its client link, which stays up), keep it cut
/// [`FAULT_SECONDS`] more, heal the link and wait until the node is synced again. Returns
/// how long after the cut the node left the primary component.
async fn partition_and_heal(link: &str, url: &str) -> Duration {
    let mut conn = MySqlConnection::connect(url).await.expect("node 3");
    let healed = Cut::new(link).await;
    let cut = Instant::now();
    let left = loop {
        if status(&mut conn, "wsrep_cluster_status").await != "Primary" {
            break cut.elapsed();
        }
        assert!(
            cut.elapsed() < Duration::from_secs(30),
            "node 3 stayed in the primary component 30 s after its link was cut"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(FAULT_SECONDS)).await;
    healed.heal().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while status(&mut conn, "wsrep_local_state_comment").await != "Synced" {
        if Instant::now() >= deadline {
            panic!(
                "node 3 did not rejoin within 60 s of the heal: {}",
                common::cluster_state().await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    left
}

/// Node 3's cluster link while it is down. Dropped without [`Cut::heal`] (the test failed
/// mid-partition), it brings the link up anyway: the tests after it need the whole cluster.
struct Cut {
    link: Option<String>,
}

impl Cut {
    /// `ip link set LINK down`.
    async fn new(link: &str) -> Self {
        run_command(ip_link(link, "down")).await;
        Self {
            link: Some(link.to_owned()),
        }
    }

    /// `ip link set LINK up`.
    async fn heal(mut self) {
        if let Some(link) = self.link.take() {
            run_command(ip_link(&link, "up")).await;
        }
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            let _ = ip_link(&link, "up").status();
        }
    }
}

/// `ip link set LINK STATE`.
fn ip_link(link: &str, state: &str) -> std::process::Command {
    let mut ip = std::process::Command::new("ip");
    ip.args(["link", "set", link, state]);
    ip
}

/// The node's status variable `name`.
async fn status(conn: &mut MySqlConnection, name: &str) -> String {
    common::status(conn, name).await.expect("the node's status")
}
