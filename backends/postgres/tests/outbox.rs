//! The outbox on PostgreSQL (`DEDUP_POSTGRES_URL`): the conformance clauses
//! (`outbox_suite!`, relays racing over ordering keys among them), the tests shared with
//! MySQL (`backends/sql/tests/clauses/outbox.rs`: producers of one key taking turns, the
//! consumer outbox from a `TxInbox` handler), and the relay woken by `NOTIFY`.

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use dedup_core::outbox::{MemoryPublisher, OutboxMessage, OutboxStore, Relay, RelayConfig};
use dedup_core::trace::{CORRELATION_ID_HEADER, MessageTrace, TRACEPARENT_HEADER};
use dedup_core::{Error, Handled, Key};
use dedup_postgres::sqlx::{self, AssertSqlSafe};
use dedup_postgres::{PostgresConfig, PostgresStore, SqlSettings, TxInbox};

/// What the shared sqlx outbox tests (`backends/sql/tests/clauses/outbox.rs`) run on.
type Store = PostgresStore;
/// This backend's sqlx database, for the shared outbox factory's transactions.
type Db = sqlx::Postgres;
/// This backend's sqlx connection, for the shared tests' handlers.
type Conn = sqlx::PgConnection;

#[path = "../../sql/tests/clauses/outbox.rs"]
mod sql_clauses;
use sql_clauses::{SqlOutboxFactory, enqueue, handler};

dedup_conformance::outbox_suite!(SqlOutboxFactory);

/// With a poll interval of a minute, a committed row is published within a second: the
/// relay listens on the outbox's channel and the producer's commit notifies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_wakes_on_notify() {
    let url = url_or_skip!();
    let store = common::store(&url, "outbox_notify", None).await;
    let publisher = Arc::new(MemoryPublisher::new());
    let relay = Relay::new(Arc::new(store.outbox()), publisher.clone())
        .with_config(RelayConfig::default().poll_interval(Duration::from_secs(60)))
        .start()
        .expect("the relay starts");
    // Let it take (nothing), subscribe and settle into its wait.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let m = OutboxMessage::new("orders", "woken-1", b"x".to_vec()).unwrap();
    let committed = Instant::now();
    assert_eq!(enqueue(&store, &[m]).await, 1);
    while publisher.message_ids().is_empty() {
        assert!(
            committed.elapsed() < Duration::from_secs(1),
            "not published within 1 s of the commit: the relay did not wake"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(publisher.message_ids(), vec!["woken-1".to_owned()]);
    relay.stop().await;
}

/// A burst of producers notifies at most once per `NOTIFY_EVERY` from their own
/// transactions (notifying commits take a database-wide lock), plus the trailing
/// notifications of those skipped, and every row of the burst is still published at once: the relay
/// looks again `linger` after a round that took rows, well before its 60 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_notifies_sparingly_and_every_row_still_goes_out_at_once() {
    let url = url_or_skip!();
    let store = common::store(&url, "outbox_notify_burst", None).await;
    let mut wakeups = store
        .outbox()
        .wakeups()
        .await
        .unwrap()
        .expect("postgres listens");
    let publisher = Arc::new(MemoryPublisher::new());
    let relay = Relay::new(Arc::new(store.outbox()), publisher.clone())
        .with_config(RelayConfig::default().poll_interval(Duration::from_secs(60)))
        .start()
        .expect("the relay starts");
    tokio::time::sleep(Duration::from_millis(500)).await;
    const BURST: usize = 30;
    let started = Instant::now();
    for i in 0..BURST {
        let m = OutboxMessage::new("orders", format!("burst-{i}"), b"x".to_vec()).unwrap();
        assert_eq!(enqueue(&store, &[m]).await, 1);
    }
    let burst_took = started.elapsed();
    let mut notifications = 0;
    while let Ok(Some(Ok(()))) = tokio::time::timeout(
        Duration::from_millis(300),
        futures::StreamExt::next(&mut wakeups),
    )
    .await
    {
        notifications += 1;
    }
    // Per window, at most one producer's and one trailing notification (for the producers
    // whose own was skipped), and one trailing after the burst's last window.
    let windows = burst_took.as_millis() / dedup_postgres::NOTIFY_EVERY.as_millis() + 1;
    let most = 2 * windows + 1;
    assert!(
        (1..=most as usize).contains(&notifications),
        "{notifications} notifications for {BURST} commits in {burst_took:?}"
    );
    while publisher.message_ids().len() < BURST {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "only {} of {BURST} published within 5 s (poll interval 60 s)",
            publisher.message_ids().len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    relay.stop().await;
}

/// A producer whose notification was skipped (another notified less than `NOTIFY_EVERY`
/// before) and whose transaction commits after the relay looked again (its `linger`) is
/// published within tens of ms, not at the 60 s poll: the store sends a trailing
/// notification once that transaction has committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_notification_trails_the_commit() {
    let url = url_or_skip!();
    let store = common::store(&url, "outbox_notify_trailing", None).await;
    let publisher = Arc::new(MemoryPublisher::new());
    let relay = Relay::new(Arc::new(store.outbox()), publisher.clone())
        .with_config(RelayConfig::default().poll_interval(Duration::from_secs(60)))
        .start()
        .expect("the relay starts");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The first producer notifies; the second writes within the same window (its
    // notification is skipped) and keeps its transaction open. Both transactions are open
    // before the first enqueue, so only its statement separates the two turns. Tried again,
    // with fresh ids, should a loaded machine space the two by a whole window.
    let mut open = None;
    for attempt in 0..50 {
        tokio::time::sleep(dedup_postgres::NOTIFY_EVERY * 2).await;
        let first =
            OutboxMessage::new("orders", format!("first-{attempt}"), b"x".to_vec()).unwrap();
        let second =
            OutboxMessage::new("orders", format!("second-{attempt}"), b"x".to_vec()).unwrap();
        let mut notifying = store.pool().begin().await.unwrap();
        let mut tx = store.pool().begin().await.unwrap();
        let started = Instant::now();
        assert_eq!(
            store
                .outbox()
                .enqueue(&mut notifying, &[first])
                .await
                .unwrap(),
            1
        );
        store.outbox().enqueue(&mut tx, &[second]).await.unwrap();
        if started.elapsed() < dedup_postgres::NOTIFY_EVERY {
            notifying.commit().await.unwrap();
            open = Some((attempt, tx));
            break;
        }
        notifying.rollback().await.unwrap();
        tx.rollback().await.unwrap();
    }
    let (attempt, tx) = open.expect("two enqueues within NOTIFY_EVERY in 50 tries");
    let first = format!("first-{attempt}");
    let second = format!("second-{attempt}");
    let started = Instant::now();
    while !publisher.message_ids().contains(&first) {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the first row was not published: the relay did not wake"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Past the relay's linger look.
    tokio::time::sleep(RelayConfig::default().linger * 5).await;
    assert!(
        !publisher.message_ids().contains(&second),
        "published before its commit"
    );
    tx.commit().await.unwrap();
    let committed = Instant::now();
    while !publisher.message_ids().contains(&second) {
        assert!(
            committed.elapsed() < Duration::from_millis(500),
            "not published within 500 ms of its commit (poll interval 60 s): no trailing notification"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    relay.stop().await;
}

/// A rolled-back enqueue notifies nothing and an enqueue of known ids writes (and
/// notifies) nothing, while a new row notifies once its transaction commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_follow_commits_of_new_rows_only() {
    let url = url_or_skip!();
    let store = common::store(&url, "outbox_notify_only", None).await;
    let mut wakeups = store
        .outbox()
        .wakeups()
        .await
        .unwrap()
        .expect("postgres listens");
    let m = OutboxMessage::new("orders", "n-1", b"x".to_vec()).unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    store
        .outbox()
        .enqueue(&mut tx, std::slice::from_ref(&m))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let quiet = tokio::time::timeout(
        Duration::from_millis(300),
        futures::StreamExt::next(&mut wakeups),
    )
    .await;
    assert!(quiet.is_err(), "a rollback woke the relay");
    assert_eq!(enqueue(&store, std::slice::from_ref(&m)).await, 1);
    let woke = tokio::time::timeout(
        Duration::from_secs(2),
        futures::StreamExt::next(&mut wakeups),
    )
    .await;
    assert!(matches!(woke, Ok(Some(Ok(())))), "{woke:?}");
    assert_eq!(enqueue(&store, &[m]).await, 0, "a known id writes nothing");
    let quiet = tokio::time::timeout(
        Duration::from_millis(300),
        futures::StreamExt::next(&mut wakeups),
    )
    .await;
    assert!(
        quiet.is_err(),
        "an enqueue that wrote nothing woke the relay"
    );
}

/// Opened without migrating, the outbox of a table whose outbox was never created is
/// refused with `SchemaNotMigrated`; `migrate` creates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmigrated_outbox_is_refused_until_migrate() {
    let url = url_or_skip!();
    let store = common::store(&url, "outbox_unmigrated", None).await;
    let config = store.config().clone();
    let outbox = config.outbox_table_name();
    let mut conn = store.pool().acquire().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "DROP TABLE \"{}\".\"{outbox}\"",
        common::SCHEMA
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM \"{}\".dedup_schema_versions WHERE table_name = $1",
        common::SCHEMA
    )))
    .bind(&outbox)
    .execute(&mut *conn)
    .await
    .unwrap();
    let readonly = PostgresStore::connect_with(
        &url,
        PostgresConfig {
            sql: SqlSettings {
                migrate: false,
                ..config.sql.clone()
            },
            ..config.clone()
        },
    )
    .await
    .expect("the records table is current");
    let err = readonly.outbox().stats().await.unwrap_err();
    assert!(matches!(err, Error::SchemaNotMigrated { .. }), "{err:?}");
    store.migrate().await.unwrap();
    let again = PostgresStore::connect_with(
        &url,
        PostgresConfig {
            sql: SqlSettings {
                migrate: false,
                ..config.sql
            },
            ..config
        },
    )
    .await
    .unwrap();
    assert_eq!(again.outbox().stats().await.unwrap().pending, 0);
}

/// An outbox table at version 1 (its due index over rows in every state) is brought to
/// version 2 by `migrate`: the due index gives way to the one over pending and held rows,
/// and the rows written before go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_outbox_migrates_to_the_narrow_due_index() {
    let url = url_or_skip!();
    let store = common::store(&url, "outbox_v1_upgrade", None).await;
    let outbox = store.config().outbox_table_name();
    let table = format!("\"{}\".\"{outbox}\"", common::SCHEMA);
    let m = OutboxMessage::new("orders", "before-upgrade", b"x".to_vec()).unwrap();
    assert_eq!(enqueue(&store, &[m]).await, 1);
    // Back to version 1's layout, as the previous release left it.
    let mut conn = store.pool().acquire().await.unwrap();
    for statement in [
        format!("DROP INDEX \"{}\".\"{outbox}_active_idx\"", common::SCHEMA),
        format!("CREATE INDEX \"{outbox}_due_idx\" ON {table} (state, due_at)"),
        format!(
            "UPDATE \"{}\".dedup_schema_versions SET version = 1 WHERE table_name = '{outbox}'",
            common::SCHEMA
        ),
    ] {
        sqlx::query(AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    store.migrate().await.unwrap();
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 \
         ORDER BY indexname",
    )
    .bind(common::SCHEMA)
    .bind(&outbox)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert!(
        indexes.contains(&format!("{outbox}_active_idx"))
            && !indexes.contains(&format!("{outbox}_due_idx")),
        "{indexes:?}"
    );
    let version: i32 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM \"{}\".dedup_schema_versions WHERE table_name = $1",
        common::SCHEMA
    )))
    .bind(&outbox)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(version, 2);
    let held = store
        .outbox()
        .take(10, Duration::from_secs(30))
        .await
        .unwrap();
    let ids: Vec<&str> = held.rows.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(ids, ["before-upgrade"]);
}

/// Drop `store`'s outbox table and forget its version, as if it had never been migrated.
async fn drop_outbox(store: &PostgresStore) {
    let outbox = store.config().outbox_table_name();
    let mut conn = store.pool().acquire().await.unwrap();
    let drop = format!("DROP TABLE \"{}\".\"{outbox}\"", common::SCHEMA);
    sqlx::query(AssertSqlSafe(drop))
        .execute(&mut *conn)
        .await
        .unwrap();
    let forget = format!(
        "DELETE FROM \"{}\".dedup_schema_versions WHERE table_name = $1",
        common::SCHEMA
    );
    sqlx::query(AssertSqlSafe(forget))
        .bind(&outbox)
        .execute(&mut *conn)
        .await
        .unwrap();
}

/// The outbox names its table and its backend. A store checks its outbox table once, at
/// its first use, and not at all after it migrated: a table dropped later is then the
/// server's error (`42P01`, undefined table), not `SchemaNotMigrated`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_table_is_checked_once_and_never_after_a_migrate() {
    let url = url_or_skip!();
    let store = common::store(&url, "outbox_checked_once", None).await;
    let config = store.config().clone();
    let quoted = format!("\"{}\".\"{}\"", common::SCHEMA, config.outbox_table_name());
    assert_eq!(store.outbox().table(), quoted);
    assert_eq!(store.outbox().backend(), "postgres");
    let shown = format!("{:?}", store.outbox());
    assert!(
        shown.starts_with(&format!("SqlOutbox {{ table: {quoted:?}, dialect: ")),
        "{shown}"
    );

    let unmigrated = PostgresStore::connect_with(
        &url,
        PostgresConfig {
            sql: SqlSettings {
                migrate: false,
                ..config.sql.clone()
            },
            ..config
        },
    )
    .await
    .unwrap();
    assert_eq!(unmigrated.outbox().stats().await.unwrap().pending, 0);
    drop_outbox(&store).await;
    for (who, store) in [("checked", &unmigrated), ("migrated", &store)] {
        let err = store.outbox().stats().await.unwrap_err();
        assert!(
            matches!(&err, Error::Backend { .. }) && format!("{err:?}").contains("42P01"),
            "{who}: {err:?}"
        );
    }
    store.migrate().await.unwrap();
}

/// A `TxInbox` handler running with a delivery's trace in scope (as the broker consumers
/// run it) writes messages that follow it: stored and published with the incoming message
/// id as causation id, its correlation id and its trace id in a `traceparent` of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tx_inbox_handlers_messages_follow_the_delivery_in_scope() {
    let url = url_or_skip!();
    let store = common::store(&url, "outbox_follow", None).await;
    common::create_business_table(&store).await;
    let key = Key::new("billing", "order-9").unwrap();
    let incoming_tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let incoming = MessageTrace::from_headers(
        "order-9",
        [
            (CORRELATION_ID_HEADER, "checkout-1"),
            (TRACEPARENT_HEADER, incoming_tp),
        ],
    );
    let inbox = TxInbox::new(store.clone());
    let handle = handler(store.clone(), Arc::new(AtomicU32::new(0)), false);
    let handled = incoming
        .scope(inbox.handle(&key, None, handle))
        .await
        .unwrap();
    assert!(matches!(handled, Handled::Processed { .. }), "{handled:?}");

    let publisher = MemoryPublisher::new();
    let relay = Relay::new(Arc::new(store.outbox()), Arc::new(publisher.clone()));
    assert_eq!(relay.run_once().await.unwrap().sent, 2);
    let published = publisher.published();
    assert_eq!(published.len(), 2);
    let mut parents = Vec::new();
    for row in &published {
        let t = MessageTrace::from_headers(
            &row.message_id,
            row.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        );
        assert_eq!(t.causation_id(), Some("order-9"), "{row:?}");
        assert_eq!(t.correlation_id(), "checkout-1", "{row:?}");
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736", "{row:?}");
        parents.push(t.traceparent().parent_id());
    }
    assert_ne!(parents[0], parents[1], "a parent id per message");
    assert!(!parents.contains(&"00f067aa0ba902b7".to_owned()));
}
