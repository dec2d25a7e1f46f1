//! Two OS processes hammer the same keys in one database file, each with several tasks
//! mixing single operations, batches and transactional claims: every key is completed
//! exactly once overall, and no operation fails.
//!
//! The processes are this test binary started again in worker mode (`worker_entry`, which
//! is `#[ignore]`d so a normal run only starts it through the parent test).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key, RecordState, TxClaim,
};
use dedup_sqlite::SqliteStore;
use dedup_sqlite::rusqlite::{TransactionBehavior, params};

const ENV_DB: &str = "DEDUP_SQLITE_WORKER_DB";
const ENV_ID: &str = "DEDUP_SQLITE_WORKER_ID";
const KEYS: usize = 200;
const WORKERS: usize = 2;
const CONSUMER: &str = "multi_process";
const BUSINESS: &str = "biz_multi_process";

fn key(i: usize) -> Key {
    Key::new(CONSUMER, format!("m{i:03}")).expect("key")
}

fn index(key: &Key) -> usize {
    key.message_id()[1..].parse().expect("key index")
}

fn out_file(db: &Path, worker: usize) -> PathBuf {
    db.with_extension(format!("worker{worker}.out"))
}

fn ready_file(db: &Path, worker: usize) -> PathBuf {
    db.with_extension(format!("worker{worker}.ready"))
}

/// What one worker completed: (key index, how) lines.
type Log = Arc<Mutex<Vec<(usize, &'static str)>>>;

fn options() -> ClaimOptions {
    // Far longer than the test: a lease never expires here, so nothing is taken over.
    ClaimOptions::lease(Duration::from_secs(300))
}

/// Keys in the order task `task` visits them (each task starts elsewhere).
fn order(task: usize) -> impl Iterator<Item = usize> {
    (0..KEYS).map(move |i| (i * [1, 7, 13, 1][task] + task * 50) % KEYS)
}

async fn single_ops(store: SqliteStore, task: usize, log: Log, outcome: Vec<u8>) {
    for i in order(task) {
        if let Claim::Acquired(lease) = store.claim(&key(i), &options()).await.expect("claim") {
            store.commit(&lease, Some(&outcome)).await.expect("commit");
            log.lock().unwrap().push((i, "lease"));
        }
    }
}

async fn batches(store: SqliteStore, task: usize, log: Log, outcome: Vec<u8>) {
    let keys: Vec<usize> = order(task).collect();
    for chunk in keys.chunks(20) {
        let requests: Vec<ClaimRequest> = chunk
            .iter()
            .map(|i| ClaimRequest::new(key(*i), options()))
            .collect();
        let commits: Vec<CommitRequest> = store
            .claim_many(&requests)
            .await
            .expect("claim_many")
            .into_iter()
            .filter_map(|claim| claim.expect("claim item").into_lease())
            .map(|lease| CommitRequest {
                lease,
                outcome: Some(outcome.clone()),
            })
            .collect();
        let results = store.commit_many(&commits).await.expect("commit_many");
        for (commit, result) in commits.iter().zip(results) {
            result.expect("commit item");
            log.lock()
                .unwrap()
                .push((index(&commit.lease.key), "lease"));
        }
    }
}

fn transactional(store: SqliteStore, task: usize, log: Log, worker: usize) {
    let mut conn = store.open_connection().expect("connection");
    for i in order(task) {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin immediate");
        if let TxClaim::Claimed { .. } = store.claim_in_tx(&tx, &key(i), None).expect("claim") {
            tx.execute(
                &format!("INSERT INTO {BUSINESS} (message, worker) VALUES (?1, ?2)"),
                params![i as i64, worker as i64],
            )
            .expect("business row");
            tx.commit().expect("commit");
            log.lock().unwrap().push((i, "tx"));
        }
    }
}

fn wall_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis()
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
#[ignore = "worker process of two_processes_complete_every_key_exactly_once, started by it"]
fn worker_entry() {
    let Ok(db) = std::env::var(ENV_DB) else {
        eprintln!(
            "worker_entry only runs as a child of two_processes_complete_every_key_exactly_once"
        );
        return;
    };
    let db = PathBuf::from(db);
    let worker: usize = std::env::var(ENV_ID)
        .expect("worker id")
        .parse()
        .expect("id");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    let log: Log = Arc::default();
    let mut span = (0, 0);
    runtime.block_on(async {
        let store = SqliteStore::open(&db).await.expect("open");
        // Start together: both processes opened the file before anyone claims.
        std::fs::write(ready_file(&db, worker), b"").expect("ready file");
        (0..WORKERS).for_each(|w| wait_for(&ready_file(&db, w)));
        let outcome = format!("worker{worker}").into_bytes();
        span.0 = wall_ms();
        let tasks = vec![
            tokio::spawn(single_ops(store.clone(), 0, log.clone(), outcome.clone())),
            tokio::spawn(single_ops(store.clone(), 1, log.clone(), outcome.clone())),
            tokio::spawn(batches(store.clone(), 2, log.clone(), outcome)),
            tokio::task::spawn_blocking({
                let (store, log) = (store.clone(), log.clone());
                move || transactional(store, 3, log, worker)
            }),
        ];
        for task in tasks {
            task.await.expect("worker task");
        }
        span.1 = wall_ms();
    });
    let lines: String = std::iter::once(format!("span {} {}\n", span.0, span.1))
        .chain(
            log.lock()
                .unwrap()
                .iter()
                .map(|(i, how)| format!("{i} {how}\n")),
        )
        .collect();
    std::fs::write(out_file(&db, worker), lines).expect("write output");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_complete_every_key_exactly_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("shared.db");
    // Create the file, the store's table and the business table before the workers start.
    let store = SqliteStore::open(&db).await.expect("open");
    let setup = store.clone();
    tokio::task::spawn_blocking(move || {
        setup
            .open_connection()
            .expect("connection")
            .execute(
                &format!(
                    "CREATE TABLE {BUSINESS} (message INTEGER NOT NULL, worker INTEGER NOT NULL)"
                ),
                [],
            )
            .expect("business table")
    })
    .await
    .expect("setup");

    let exe = std::env::current_exe().expect("test binary");
    let started = Instant::now();
    let children: Vec<_> = (0..WORKERS)
        .map(|worker| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "worker_entry",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(ENV_DB, &db)
                .env(ENV_ID, worker.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    for mut child in children {
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .expect("join")
            .expect("wait");
        assert!(status.success(), "a worker failed: {status}");
    }
    eprintln!("two workers done in {:?}", started.elapsed());

    // Every key completed exactly once across both processes and all their tasks.
    let mut completions: BTreeMap<usize, Vec<(usize, String)>> = BTreeMap::new();
    let mut spans = Vec::new();
    for worker in 0..WORKERS {
        let text = std::fs::read_to_string(out_file(&db, worker)).expect("worker output");
        for line in text.lines() {
            let (i, how) = line.split_once(' ').expect("line");
            if i == "span" {
                let (start, end) = how.split_once(' ').expect("span");
                spans.push((start.parse::<u128>().unwrap(), end.parse::<u128>().unwrap()));
                continue;
            }
            completions
                .entry(i.parse().expect("index"))
                .or_default()
                .push((worker, how.to_owned()));
        }
    }
    assert_eq!(completions.len(), KEYS, "every key was completed");
    for (i, who) in &completions {
        assert_eq!(who.len(), 1, "key {i} completed more than once: {who:?}");
    }
    let per_worker = |w: usize| completions.values().filter(|v| v[0].0 == w).count();
    let per_kind = |k: &str| completions.values().filter(|v| v[0].1 == k).count();
    eprintln!(
        "completed per worker: {:?}; by lease {}, in a transaction {}",
        (0..WORKERS).map(per_worker).collect::<Vec<_>>(),
        per_kind("lease"),
        per_kind("tx"),
    );
    let latest_start = spans.iter().map(|s| s.0).max().expect("spans");
    let earliest_end = spans.iter().map(|s| s.1).min().expect("spans");
    assert!(
        latest_start < earliest_end,
        "the two processes must have worked at the same time: {spans:?}"
    );

    // The stored records agree with the logs: the winner's outcome or a transactional
    // completion with exactly one business row written by the winner.
    let mut business: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let reader = store.clone();
    let rows: Vec<(i64, i64)> = tokio::task::spawn_blocking(move || {
        let conn = reader.open_connection().expect("connection");
        let mut stmt = conn
            .prepare(&format!("SELECT message, worker FROM {BUSINESS}"))
            .expect("prepare");
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    })
    .await
    .expect("join");
    for (message, worker) in rows {
        business
            .entry(message as usize)
            .or_default()
            .push(worker as usize);
    }
    for (i, who) in &completions {
        let (worker, how) = &who[0];
        let record = store.get(&key(*i)).await.expect("get").expect("record");
        let RecordState::Completed { token, outcome, .. } = record.state else {
            panic!("key {i} is not completed: {record:?}");
        };
        if how == "tx" {
            assert_eq!(token, None, "key {i}");
            assert_eq!(
                business.get(i),
                Some(&vec![*worker]),
                "key {i} business rows"
            );
        } else {
            assert_eq!(
                outcome,
                Some(format!("worker{worker}").into_bytes()),
                "key {i}"
            );
            assert_eq!(business.get(i), None, "key {i} has no business row");
        }
    }
}
