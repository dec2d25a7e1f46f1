//! A PostgreSQL server that crashes and restarts under a live store (immediate-mode stop:
//! no shutdown checkpoint, WAL replay on start): every acknowledged commit, its outcome and
//! a live lease survive; the store's pool reconnects by itself, the first operations failing
//! at most with a retryable error; a relay that lost its `LISTEN` in the outage listens
//! again once the server is back, so new rows go out on `NOTIFY`, not at the next poll.
//!
//! The test runs its own server through `scripts/services.sh` in a private state dir (the
//! shared test server must not be restarted under the other tests), with
//! `synchronous_commit = on`: the scripts' test servers run with it off for speed, and with
//! it off a crash may lose the last fraction of a second of commits (see the README).

use std::sync::Arc;
use std::time::{Duration, Instant};

use private_server::Server;

use dedup_conformance::restart::{acknowledged_records_survive_a_restart, until_reconnected};
use dedup_core::outbox::{MemoryPublisher, OutboxMessage, Relay, RelayConfig};
use dedup_postgres::{
    NOTIFY_EVERY, PostgresConfig, PostgresStore, SqlSettings, pool_options, sqlx,
};

#[path = "../../sql/tests/clauses/private_server.rs"]
mod private_server;

/// A private PostgreSQL for the test tagged `tag`.
fn server(tag: &str) -> Option<Server> {
    Server::start("postgres", "DEDUP_POSTGRES_URL", tag)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_and_restarted_server_keeps_every_acknowledged_commit_and_lease() {
    let Some(server) = server("commits") else {
        return;
    };
    let admin = sqlx::PgPool::connect(&server.url)
        .await
        .expect("admin connection");
    for statement in [
        "ALTER SYSTEM SET synchronous_commit = on",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::raw_sql(statement)
            .execute(&admin)
            .await
            .expect("synchronous_commit on");
    }
    admin.close().await;

    let store = PostgresStore::connect(&server.url).await.expect("connect");
    acknowledged_records_survive_a_restart(&store, || server.crash_restart(Some(0))).await;
}

/// The relay's poll interval in the relay test: a row it finds by polling waits 2.5 s on
/// average, so rows published within [`WOKEN_WITHIN`] were woken by `NOTIFY`.
const POLL: Duration = Duration::from_secs(5);
/// The latency of a row the relay was woken for (typically a few milliseconds; the bound
/// leaves room for a loaded machine). A row found by polling instead comes within it with
/// a chance of 4 % (200 ms of the 5 s poll interval), all three rows of a check 0.006 %.
const WOKEN_WITHIN: Duration = Duration::from_millis(200);
/// The pool's acquire timeout in the relay test.
const ACQUIRE: Duration = Duration::from_secs(1);
/// How long the server stays down in the relay test: longer than the poll interval plus
/// the acquire timeout, so the relay's first tries to listen again fail.
const DOWN: Duration = POLL
    .saturating_add(ACQUIRE)
    .saturating_add(Duration::from_secs(1));

/// Enqueue one message (retrying while the pool reconnects) and return how long after its
/// commit the relay published it.
async fn publish_latency(store: &PostgresStore, publisher: &MemoryPublisher, id: &str) -> Duration {
    let message = OutboxMessage::new("orders", id, b"x".to_vec()).unwrap();
    until_reconnected(|| async {
        let mut tx = store
            .pool()
            .begin()
            .await
            .map_err(|e| dedup_core::Error::backend("postgres", true, e))?;
        store
            .outbox()
            .enqueue(&mut tx, std::slice::from_ref(&message))
            .await?;
        tx.commit()
            .await
            .map_err(|e| dedup_core::Error::backend("postgres", true, e))
    })
    .await;
    let committed = Instant::now();
    while !publisher.message_ids().iter().any(|m| m == id) {
        assert!(
            committed.elapsed() < POLL * 3,
            "{id} not published within {:?}",
            POLL * 3
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    committed.elapsed()
}

/// Three rows one after another, each published within [`WOKEN_WITHIN`] of its commit.
/// Each is enqueued [`NOTIFY_EVERY`] after the one before it was published, so each sends
/// its own `NOTIFY`: a row enqueued sooner skips it, and then goes out on the relay's
/// linger look only if it committed before that look, else at the next poll.
async fn assert_woken_by_notify(store: &PostgresStore, publisher: &MemoryPublisher, when: &str) {
    for i in 0..3 {
        tokio::time::sleep(NOTIFY_EVERY * 2).await;
        let id = format!("{when}-{i}");
        let latency = publish_latency(store, publisher, &id).await;
        assert!(
            latency < WOKEN_WITHIN,
            "{when}: {id} published {latency:?} after its commit (poll interval {POLL:?}): \
             the relay is not listening"
        );
    }
}

/// The server is down for [`DOWN`], so the relay's first tries to listen again fail. Once
/// it is back the relay listens again by itself, and new rows go out within
/// [`WOKEN_WITHIN`] of their commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_listens_again_once_the_server_is_back() {
    let Some(server) = server("relay") else {
        return;
    };
    let config = PostgresConfig {
        sql: SqlSettings {
            table: "relay_restart".into(),
            ..Default::default()
        },
        ..PostgresConfig::default()
    };
    let pool = pool_options(&config)
        .acquire_timeout(ACQUIRE)
        .connect(&server.url)
        .await
        .expect("connect");
    let store = PostgresStore::from_pool(pool, config).await.unwrap();
    store.migrate().await.unwrap();
    let publisher = Arc::new(MemoryPublisher::new());
    let relay = Relay::new(Arc::new(store.outbox()), publisher.clone())
        .with_config(RelayConfig::default().poll_interval(POLL))
        .start()
        .expect("the relay starts");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_woken_by_notify(&store, &publisher, "before").await;

    tokio::task::block_in_place(|| server.crash_restart(Some(DOWN.as_secs() as u32)));
    // The relay's tries to listen again back off to at most the poll interval.
    tokio::time::sleep(POLL + Duration::from_secs(1)).await;
    assert_woken_by_notify(&store, &publisher, "after").await;
    let stopped = relay.stop().await;
    // Six rows were enqueued; a row whose mark as sent was lost in the crash is published
    // again (the outbox is at least once), so more than six sends are allowed, never fewer.
    assert!(stopped.sent >= 6, "{stopped:?}");
}
