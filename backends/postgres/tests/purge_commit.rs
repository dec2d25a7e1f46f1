//! A purge's batches, and the row recording its run, commit without waiting for the log
//! flush, so a durable server's `fdatasync` per batch does not make the paced purge crawl
//! (the pacing would count each flush as the batch's work, shrink the batches to the
//! smallest size and rest three times as long). Seen from outside: on a server where
//! every synchronous commit waits for a standby that never connects
//! (`synchronous_standby_names` naming nobody), a store whose sessions commit
//! synchronously cannot commit a claim, yet purges its records and its outbox in full.
//!
//! The test runs its own server through `scripts/services.sh` in a private state dir: the
//! shared test server must not be reconfigured under the other tests.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use private_server::Server;

use dedup_core::outbox::{OutboxMessage, OutboxStore};
use dedup_core::{Admin, Claim, ClaimOptions, DedupStore, Key, ManualClock, PurgeOptions};
use dedup_postgres::sqlx::postgres::PgConnectOptions;
use dedup_postgres::sqlx::{self, PgPool};
use dedup_postgres::{PostgresConfig, PostgresStore, SqlSettings, pool_options};

#[allow(dead_code)] // the crash-restart part is for `server_restart`
#[path = "../../sql/tests/clauses/private_server.rs"]
mod private_server;

/// Records and outbox rows purged.
const RECORDS: usize = 300;

/// A store on the private server whose sessions run with `synchronous_commit` as given.
async fn store(url: &str, config: &PostgresConfig, synchronous_commit: &str) -> PostgresStore {
    let options = PgConnectOptions::from_str(url)
        .expect("the server's URL")
        .options([("synchronous_commit", synchronous_commit)]);
    let pool: PgPool = pool_options(config)
        .connect_with(options)
        .await
        .expect("connect");
    PostgresStore::from_pool(pool, config.clone())
        .await
        .expect("a valid configuration")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_does_not_wait_for_the_log_flush() {
    let Some(server) = Server::start("postgres", "DEDUP_POSTGRES_URL", "purge-commit") else {
        return;
    };
    let clock = Arc::new(ManualClock::starting_now());
    let config = PostgresConfig {
        sql: SqlSettings {
            table: "purge_commit".into(),
            clock: Some(clock.clone()),
            ..Default::default()
        },
        ..PostgresConfig::default()
    };

    // Seed while commits still complete: completed records and sent outbox rows.
    let seeding = store(&server.url, &config, "on").await;
    seeding.migrate().await.expect("migrate");
    let lease = Duration::from_secs(30);
    for i in 0..RECORDS {
        let key = Key::new("billing", format!("m-{i}")).unwrap();
        match seeding
            .claim(&key, &ClaimOptions::lease(lease))
            .await
            .unwrap()
        {
            Claim::Acquired(lease) => seeding.commit(&lease, None).await.unwrap(),
            other => panic!("a fresh key was not acquired: {other:?}"),
        }
    }
    let messages: Vec<OutboxMessage> = (0..RECORDS)
        .map(|i| OutboxMessage::new("orders", format!("o-{i}"), b"{}".to_vec()).unwrap())
        .collect();
    let mut tx = seeding.pool().begin().await.unwrap();
    seeding.outbox().enqueue(&mut tx, &messages).await.unwrap();
    tx.commit().await.unwrap();
    let held = seeding.outbox().take(RECORDS, lease).await.unwrap();
    let ids: Vec<i64> = held.rows.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), RECORDS, "every outbox row taken");
    seeding.outbox().mark_sent(&held.token, &ids).await.unwrap();

    // From now on a synchronous commit waits for a standby that never comes.
    for statement in [
        "ALTER SYSTEM SET synchronous_standby_names = 'nobody'",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::raw_sql(statement)
            .execute(seeding.pool())
            .await
            .expect("configure the private server");
    }
    let synchronous = store(&server.url, &config, "on").await;
    let mut seen = String::new();
    for _ in 0..100 {
        seen = sqlx::query_scalar("SELECT current_setting('synchronous_standby_names')")
            .fetch_one(synchronous.pool())
            .await
            .unwrap();
        if seen == "nobody" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        seen, "nobody",
        "the server did not reload its configuration"
    );

    // The control: on this server a synchronous commit does not complete.
    let fresh = Key::new("billing", "after").unwrap();
    let claim = tokio::time::timeout(
        Duration::from_secs(2),
        synchronous.claim(&fresh, &ClaimOptions::lease(lease)),
    )
    .await;
    assert!(
        claim.is_err(),
        "a claim committed although the server waits for a standby: {claim:?}"
    );

    // The purge, on sessions that commit synchronously, completes anyway.
    clock.advance(Duration::from_secs(3600));
    let retention = PurgeOptions::older_than(Duration::from_secs(60));
    let report = tokio::time::timeout(Duration::from_secs(30), synchronous.purge(&retention))
        .await
        .expect("the records' purge waited for the log flush (a synchronous commit)")
        .unwrap();
    assert_eq!(report.total(), RECORDS as u64, "{report:?}");
    let run = tokio::time::timeout(Duration::from_secs(10), synchronous.last_purge())
        .await
        .expect("reading the last purge run")
        .unwrap()
        .expect("the purge recorded its run without waiting for the log flush");
    assert_eq!(run.removed, RECORDS as u64, "{run:?}");

    let report = tokio::time::timeout(
        Duration::from_secs(30),
        synchronous.outbox().purge(&retention),
    )
    .await
    .expect("the outbox purge waited for the log flush (a synchronous commit)")
    .unwrap();
    assert_eq!(report.total(), RECORDS as u64, "{report:?}");
    drop(server);
}
