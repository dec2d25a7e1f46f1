//! Where a durable message's time goes: the transactions, log flushes (`fdatasync`) and log
//! writes the server counts (`pg_stat_database.xact_commit`, `pg_stat_wal.wal_sync`,
//! `wal_write`) per message, for the store's claim + commit, for the same work issued raw
//! (an `INSERT` and an `UPDATE` per message, each on its own), for `TxInbox` and for a
//! hand-written `claim_in_tx`, at 1 and 16 concurrent tasks.
//!
//! A measurement, not a check of the contract: ignored by default, and only meaningful on a
//! server of your own with durable settings and no other load (the counters are the whole
//! server's). Run it with
//!
//! ```text
//! DEDUP_POSTGRES_URL=postgres://... cargo test -p dedup-postgres --test write_counts -- --ignored --nocapture
//! ```

mod common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dedup_core::{BoxError, Claim, ClaimOptions, DedupStore, Key, TxClaim};
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use dedup_postgres::{PostgresConfig, PostgresStore, SqlSettings, TxInbox};

/// Messages per measure.
const MESSAGES: usize = 1_600;

/// The server's counters.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    xact_commit: i64,
    wal_sync: i64,
    wal_write: i64,
    wal_records: i64,
    /// CPU seconds (user + system) of the server's processes, exited backends included
    /// (the postmaster's children's times), when it runs on this machine (`/proc`).
    server_cpu: Option<f64>,
    /// CPU seconds of this process (the client).
    client_cpu: Option<f64>,
}

/// Clock ticks per second of `/proc/*/stat` times (100 on Linux).
const TICKS: f64 = 100.0;

/// The `/proc/PID/stat` fields after the command: (ppid, utime + stime, cutime + cstime) in
/// ticks.
fn proc_stat(pid: &str) -> Option<(u32, f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    Some((f.get(1)?.parse().ok()?, n(11)? + n(12)?, n(13)? + n(14)?))
}

/// CPU seconds of the postmaster `postmaster` and its live children, plus its exited
/// children's.
fn server_cpu(postmaster: u32) -> Option<f64> {
    let (_, own, exited) = proc_stat(&postmaster.to_string())?;
    let mut total = own + exited;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if let Some((ppid, cpu, _)) = proc_stat(pid)
            && ppid == postmaster
        {
            total += cpu;
        }
    }
    Some(total / TICKS)
}

async fn counters(url: &str) -> Counters {
    use sqlx::Connection;
    // Closed pools' backends flushed their statistics when they exited; wait for that.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    let (xact_commit, wal_sync, wal_write, wal_records): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), \
                wal_sync, wal_write, wal_records::bigint FROM pg_stat_wal",
    )
    .fetch_one(&mut conn)
    .await
    .expect("read the counters");
    let (backend,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .expect("read the backend's pid");
    let postmaster = proc_stat(&backend.to_string()).map(|(ppid, _, _)| ppid);
    // This connection's own backend is counted too: the same small amount every time.
    let server_cpu = postmaster.and_then(server_cpu);
    let client_cpu = proc_stat("self").map(|(_, cpu, _)| cpu / TICKS);
    Counters {
        xact_commit,
        wal_sync,
        wal_write,
        wal_records,
        server_cpu,
        client_cpu,
    }
}

/// Run `one(i)` for `MESSAGES` messages on `concurrency` tasks.
async fn drive<F, Fut>(concurrency: usize, one: F) -> Duration
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let one = Arc::new(one);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (one, next) = (Arc::clone(&one), Arc::clone(&next));
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= MESSAGES {
                        break;
                    }
                    one(i).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    started.elapsed()
}

fn report(name: &str, concurrency: usize, elapsed: Duration, before: Counters, after: Counters) {
    let per = |a: i64, b: i64| (a - b) as f64 / MESSAGES as f64;
    println!(
        "{name:<22} c={concurrency:<2} {:>7.0} msg/s  per message: {:.2} commits, {:.3} log flushes, \
         {:.3} log writes, {:.2} log records, CPU µs server {} client {}",
        MESSAGES as f64 / elapsed.as_secs_f64(),
        per(after.xact_commit, before.xact_commit),
        per(after.wal_sync, before.wal_sync),
        per(after.wal_write, before.wal_write),
        per(after.wal_records, before.wal_records),
        cpu(before.server_cpu, after.server_cpu),
        cpu(before.client_cpu, after.client_cpu),
    );
}

/// CPU microseconds per message between two readings, or `n/a`.
fn cpu(before: Option<f64>, after: Option<f64>) -> String {
    match (before, after) {
        (Some(b), Some(a)) => format!("{:.0}", (a - b) * 1e6 / MESSAGES as f64),
        _ => "n/a".into(),
    }
}

async fn store(url: &str) -> PostgresStore {
    let table = common::unique_table("counts");
    PostgresStore::connect_with(
        url,
        PostgresConfig {
            schema: common::SCHEMA.into(),
            sql: SqlSettings {
                table,
                ..Default::default()
            },
            ..PostgresConfig::default()
        },
    )
    .await
    .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement for a server of your own: see the file's docs"]
async fn commits_and_log_flushes_per_message() {
    let url = url_or_skip!();
    let lease = ClaimOptions::lease(Duration::from_secs(30));
    for concurrency in [1, 16] {
        // The store's claim + commit.
        let s = store(&url).await;
        let before = counters(&url).await;
        let handle = s.clone();
        let options = lease.clone();
        let elapsed = drive(concurrency, move |i| {
            let (store, options) = (handle.clone(), options.clone());
            async move {
                let key = Key::new("counts", i.to_string()).unwrap();
                let Claim::Acquired(lease) = store.claim(&key, &options).await.unwrap() else {
                    panic!("a fresh key was not acquired")
                };
                store.commit(&lease, None).await.unwrap();
            }
        })
        .await;
        s.pool().close().await;
        report(
            "claim+commit",
            concurrency,
            elapsed,
            before,
            counters(&url).await,
        );

        // The same raw: INSERT, then UPDATE, each on a connection of its own.
        let s = store(&url).await;
        let raw = format!("{}_raw", s.table().trim_end_matches('"'));
        let raw = format!("{raw}\"");
        let pool: PgPool = dedup_postgres::pool_options(s.config())
            .connect(&url)
            .await
            .unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {raw} (consumer text, message_id text, token uuid, fence bigint, \
             attempt int, expires_at bigint, processed_at bigint, PRIMARY KEY (consumer, message_id))"
        )))
        .execute(&pool)
        .await
        .unwrap();
        let insert: Arc<str> = format!(
            "INSERT INTO {raw} VALUES ('counts', $1, gen_random_uuid(), 1, 1, 0, NULL) ON CONFLICT DO NOTHING"
        )
        .into();
        let update: Arc<str> =
            format!("UPDATE {raw} SET processed_at = 1, expires_at = NULL WHERE consumer = 'counts' AND message_id = $1").into();
        let before = counters(&url).await;
        let p = pool.clone();
        let elapsed = drive(concurrency, move |i| {
            let (pool, insert, update) = (p.clone(), Arc::clone(&insert), Arc::clone(&update));
            async move {
                let id = i.to_string();
                let done = sqlx::query(AssertSqlSafe(&*insert))
                    .bind(&id)
                    .execute(&pool)
                    .await
                    .unwrap();
                assert_eq!(done.rows_affected(), 1);
                sqlx::query(AssertSqlSafe(&*update))
                    .bind(&id)
                    .execute(&pool)
                    .await
                    .unwrap();
            }
        })
        .await;
        pool.close().await;
        report(
            "raw INSERT+UPDATE",
            concurrency,
            elapsed,
            before,
            counters(&url).await,
        );

        // TxInbox with a business insert, and the hand-written claim_in_tx beside it.
        for hand_written in [false, true] {
            let s = store(&url).await;
            common::create_business_table(&s).await;
            let business: Arc<str> = format!(
                "INSERT INTO {} (consumer, message_id, label) VALUES ('counts', $1, 'x')",
                common::business_table(&s)
            )
            .into();
            let inbox = TxInbox::new(s.clone());
            let before = counters(&url).await;
            let handle = s.clone();
            let elapsed = drive(concurrency, move |i| {
                let (store, inbox, business) =
                    (handle.clone(), inbox.clone(), Arc::clone(&business));
                async move {
                    let id = i.to_string();
                    let key = Key::new("counts", &id).unwrap();
                    if hand_written {
                        let mut tx = store.pool().begin().await.unwrap();
                        let claim = store.claim_in_tx(&mut tx, &key, None).await.unwrap();
                        assert!(matches!(claim, TxClaim::Claimed { .. }), "{claim:?}");
                        sqlx::query(AssertSqlSafe(&*business))
                            .bind(&id)
                            .execute(&mut *tx)
                            .await
                            .unwrap();
                        tx.commit().await.unwrap();
                    } else {
                        let handled = inbox
                            .handle(&key, None, |conn, _lease| {
                                let (business, id) = (Arc::clone(&business), id.clone());
                                Box::pin(async move {
                                    sqlx::query(AssertSqlSafe(&*business))
                                        .bind(&id)
                                        .execute(&mut *conn)
                                        .await?;
                                    Ok::<_, BoxError>(None)
                                })
                            })
                            .await
                            .unwrap();
                        assert!(handled.is_settled(), "{handled:?}");
                    }
                }
            })
            .await;
            s.pool().close().await;
            let name = if hand_written {
                "claim_in_tx"
            } else {
                "TxInbox"
            };
            report(name, concurrency, elapsed, before, counters(&url).await);
        }
    }
}
