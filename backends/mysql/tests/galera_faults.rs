//! Node loss on the Galera cluster (`DEDUP_GALERA_URLS`), mid-run: workers on each of the
//! three nodes consume messages through `TxInbox` (a business row and an outbox message
//! in the handler's transaction), a relay on each node publishes the outbox. One node is
//! SIGKILLed (`scripts/services.sh crash-restart galera`) or isolated from the other two
//! (`gmcast.isolate`, Galera's own cut of a node's group connections), then comes back.
//! No message is lost or processed twice, and every committed outbox message is
//! published, none other.
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
use dedup_core::{BoxError, Handled, InboxConfig, Key};
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
/// How long the killed node stays down, and the isolated node cut off.
const FAULT_SECONDS: u64 = 4;

/// The fault tests take turns: each takes a node of the one cluster away.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What a run takes away, and from which node.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGKILL node 3, restart it after [`FAULT_SECONDS`].
    Kill,
    /// Cut node 2 from the other two for [`FAULT_SECONDS`].
    Isolate,
}

/// What a run counted.
#[derive(Debug, Default)]
struct Counts {
    acknowledged: AtomicUsize,
    processed: AtomicUsize,
    duplicates: AtomicUsize,
    redelivered: AtomicUsize,
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
async fn a_node_cut_off_mid_run_loses_and_doubles_nothing() {
    if common::url().is_none() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    run(Fault::Isolate).await;
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
    match fault {
        Fault::Kill => kill_and_restart(3).await,
        Fault::Isolate => isolate_and_heal(&urls[1]).await,
    }
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
        "galera {fault:?}: seed {seed}, fault after {fault_after} acks, {MESSAGES} messages in \
         {consumed:.1?}: acknowledged {}, processed {}, duplicates {}, redelivered {}; lost \
         {lost}, doubled {doubled}; outbox published {} ({} again), unpublished \
         {unpublished}, not committed {unexpected}",
        counts.acknowledged.load(Ordering::SeqCst),
        counts.processed.load(Ordering::SeqCst),
        counts.duplicates.load(Ordering::SeqCst),
        counts.redelivered.load(Ordering::SeqCst),
        unique.len(),
        published.len() - unique.len(),
    );
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
            _ => {
                counts.failed_once.lock().expect("the counts").insert(i);
                counts.redelivered.fetch_add(1, Ordering::SeqCst);
                queue.lock().expect("the queue").push_back(i);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
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
    let down = FAULT_SECONDS.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(script)
            .args(["crash-restart", "galera", &node.to_string(), &down])
            .env("DEDUP_SERVICES_DIR", state_dir)
            .output()
    })
    .await
    .expect("the restart's thread")
    .expect("services.sh crash-restart");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Cut the node of `url` from the other two for [`FAULT_SECONDS`], then let it rejoin and
/// wait until it is synced again.
async fn isolate_and_heal(url: &str) {
    let mut conn = MySqlConnection::connect(url).await.expect("the node");
    let isolate = |on: u8| format!("SET GLOBAL wsrep_provider_options = 'gmcast.isolate={on}'");
    sqlx::raw_sql(AssertSqlSafe(isolate(1)))
        .execute(&mut conn)
        .await
        .expect("isolate the node");
    tokio::time::sleep(Duration::from_secs(FAULT_SECONDS)).await;
    sqlx::raw_sql(AssertSqlSafe(isolate(0)))
        .execute(&mut conn)
        .await
        .expect("let the node rejoin");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state: Option<(String, String)> =
            sqlx::query_as("SHOW STATUS WHERE Variable_name = 'wsrep_local_state_comment'")
                .fetch_optional(&mut conn)
                .await
                .expect("the node's state");
        if state.is_some_and(|(_, s)| s == "Synced") {
            return;
        }
        assert!(Instant::now() < deadline, "the node did not rejoin");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
