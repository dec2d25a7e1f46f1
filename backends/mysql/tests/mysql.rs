//! MySQL-specific behaviour against the real server of `DEDUP_MYSQL_URL`: names,
//! concurrent migrations, schema versions, the transactional claim's locking (usable after
//! duplicates, no deadlock on neighbouring keys), the server's clock, TLS.

mod common;

use std::sync::Arc;
use std::time::Duration;

use dedup_core::backend::AdminStorage;
use dedup_core::{Claim, ClaimOptions, DedupStore, Error, Fingerprint, Key, TlsFiles, TxClaim};
use dedup_mysql::sqlx::{self, AssertSqlSafe};
use dedup_mysql::{MySqlConfig, MySqlStore, SqlSettings};

fn key(consumer: &str, id: &str) -> Key {
    Key::new(consumer, id).expect("valid key")
}

fn lease(secs: u64) -> ClaimOptions {
    ClaimOptions::lease(Duration::from_secs(secs))
}

fn fp(s: &str) -> Fingerprint {
    Fingerprint::new(s).expect("valid fingerprint")
}

#[tokio::test]
async fn unsafe_table_names_are_rejected_before_any_io() {
    // No server needed: the name is checked first (the URL points nowhere).
    for name in ["", "a b", "a`b", "t;DROP TABLE x", "é", &"a".repeat(64)] {
        let config = MySqlConfig::from(SqlSettings {
            table: name.into(),
            ..Default::default()
        });
        let e = MySqlStore::connect_with("mysql://nobody@127.0.0.1:1/none", config)
            .await
            .expect_err("refused");
        assert!(matches!(e, Error::InvalidInput { .. }), "{name:?}: {e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_from_eight_tasks_at_once_creates_one_table() {
    let url = url_or_skip!();
    let table = common::unique_table("migrate8");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (url, table) = (url.clone(), table.clone());
        tasks.push(tokio::spawn(async move {
            common::store_on(&url, &table, None).await;
        }));
    }
    for t in tasks {
        t.await.expect("migrated");
    }
    let store = common::store_on(&url, &table, None).await;
    let version: i32 =
        sqlx::query_scalar("SELECT version FROM dedup_schema_versions WHERE table_name = ?")
            .bind(&table)
            .fetch_one(store.pool())
            .await
            .expect("version row");
    assert_eq!(version, 3);
    assert!(
        store
            .claim(&key("c", "m"), &lease(30))
            .await
            .expect("claim")
            .is_acquired()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_false_checks_and_writes_nothing_and_a_newer_version_is_refused() {
    let url = url_or_skip!();
    let table = common::unique_table("versions");
    let read_only = |table: &str| {
        MySqlConfig::from(SqlSettings {
            table: table.into(),
            migrate: false,
            max_connections: 2,
            ..Default::default()
        })
    };
    let e = MySqlStore::connect_with(&url, read_only(&table))
        .await
        .expect_err("missing table");
    assert!(
        matches!(e, Error::SchemaNotMigrated { found: 0, .. }),
        "{e:?}"
    );
    let pool = sqlx::MySqlPool::connect(&url).await.expect("connect");
    let exists: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(1 AS SIGNED) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(&table)
    .fetch_optional(&pool)
    .await
    .expect("lookup");
    assert_eq!(exists, None, "migrate=false created nothing");

    let store = common::store_on(&url, &table, None).await;
    MySqlStore::connect_with(&url, read_only(&table))
        .await
        .expect("a migrated table passes the check");
    sqlx::query("UPDATE dedup_schema_versions SET version = 99 WHERE table_name = ?")
        .bind(&table)
        .execute(&pool)
        .await
        .expect("pretend a newer library migrated it");
    let e = MySqlStore::connect_with(&url, read_only(&table))
        .await
        .expect_err("too new");
    assert!(
        matches!(
            e,
            Error::SchemaTooNew {
                found: 99,
                known: 3,
                ..
            }
        ),
        "{e:?}"
    );
    let e = store.migrate().await.expect_err("too new to migrate");
    assert!(matches!(e, Error::SchemaTooNew { found: 99, .. }), "{e:?}");
}

/// A version 1 table (no `last_failure` column) with a record upgrades to version 2: the
/// record reads with no failure kept and a failure can then be kept. A migration that an
/// interrupted run already applied (the column exists, the version row still says 1) runs
/// again without error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_table_upgrades_and_an_interrupted_upgrade_runs_again() {
    let url = url_or_skip!();
    let table = common::unique_table("v1_upgrade");
    let store = common::store_on(&url, &table, None).await;
    let k = key("billing", "stuck");
    let lease = store
        .claim(&k, &lease(30))
        .await
        .expect("claim")
        .into_lease()
        .expect("acquired");
    let pool = store.pool().clone();
    let exec = |sql: String| {
        let pool = pool.clone();
        async move {
            sqlx::query(AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .expect("setup statement")
        }
    };
    exec(format!("ALTER TABLE `{table}` DROP COLUMN last_failure")).await;
    exec(format!(
        "UPDATE dedup_schema_versions SET version = 1 WHERE table_name = '{table}'"
    ))
    .await;
    store.migrate().await.expect("upgrade from version 1");
    let record = store.get(&k).await.expect("get").expect("record");
    assert_eq!(record.last_failure, None, "an old row keeps no failure");
    let failure = dedup_core::Failure::new(
        "handler",
        vec!["boom".into()],
        1,
        dedup_core::Timestamp::from_millis(5),
        None,
    );
    store
        .release_failed(&lease, &failure)
        .await
        .expect("release_failed");
    exec(format!(
        "UPDATE dedup_schema_versions SET version = 1 WHERE table_name = '{table}'"
    ))
    .await;
    store
        .migrate()
        .await
        .expect("a migration already applied runs again");
    let record = store.get(&k).await.expect("get").expect("record");
    assert_eq!(
        record.last_failure,
        Some(failure),
        "the column and its value stay"
    );
}

/// A version 2 table upgrades to version 3, which keeps the last purge run: a row left for
/// the table's name (a dropped table of that name) is gone, the records stay, and a purge is
/// then kept and read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_table_upgrades_and_keeps_its_last_purge_run() {
    let url = url_or_skip!();
    let table = common::unique_table("v2_upgrade");
    let store = common::store_on(&url, &table, None).await;
    let k = key("billing", "done");
    let lease = store
        .claim(&k, &lease(30))
        .await
        .expect("claim")
        .into_lease()
        .expect("acquired");
    store.commit(&lease, None).await.expect("commit");
    for sql in [
        format!("UPDATE dedup_schema_versions SET version = 2 WHERE table_name = '{table}'"),
        format!(
            "INSERT INTO dedup_purge_runs VALUES ('{table}', 1, 99, 5, TRUE) \
             ON DUPLICATE KEY UPDATE removed = 99"
        ),
    ] {
        sqlx::query(AssertSqlSafe(sql))
            .execute(store.pool())
            .await
            .expect("setup statement");
    }
    store.migrate().await.expect("upgrade from version 2");
    let version: i32 =
        sqlx::query_scalar("SELECT version FROM dedup_schema_versions WHERE table_name = ?")
            .bind(&table)
            .fetch_one(store.pool())
            .await
            .expect("version");
    assert_eq!(version, 3);
    assert_eq!(store.last_purge().await.expect("read"), None);
    assert!(store.get(&k).await.expect("get").is_some(), "records stay");
    // Past the zero retention by the server's clock.
    tokio::time::sleep(Duration::from_millis(5)).await;
    store
        .purge(&dedup_core::PurgeOptions::older_than(Duration::ZERO).unpaced())
        .await
        .expect("purge");
    let run = store.last_purge().await.expect("read").expect("kept");
    assert_eq!((run.removed, run.stopped_early), (1, false), "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_claims_leave_the_transaction_usable() {
    let url = url_or_skip!();
    let clock = common::manual_clock();
    let store = common::store(&url, "tx_usable", Some(clock.clone())).await;
    common::create_business_table(&store).await;
    let (done, with_fp, leased, fresh) = (
        key("billing", "done"),
        key("billing", "with-fp"),
        key("billing", "leased"),
        key("billing", "fresh"),
    );
    let mut tx = store.pool().begin().await.expect("begin");
    for (k, f) in [(&done, None), (&with_fp, Some(fp("A")))] {
        let claim = store
            .claim_in_tx(&mut tx, k, f.as_ref())
            .await
            .expect("claim");
        assert_eq!(claim, TxClaim::Claimed { fence: 1 });
    }
    tx.commit().await.expect("commit");
    assert!(
        store
            .claim(&leased, &lease(30))
            .await
            .expect("claim")
            .is_acquired()
    );

    let mut tx = store.pool().begin().await.expect("begin");
    assert!(matches!(
        store
            .claim_in_tx(&mut tx, &done, None)
            .await
            .expect("duplicate"),
        TxClaim::Completed { outcome: None, .. }
    ));
    assert!(matches!(
        store.claim_in_tx(&mut tx, &with_fp, Some(&fp("B"))).await,
        Err(Error::FingerprintMismatch { .. })
    ));
    assert!(matches!(
        store
            .claim_in_tx(&mut tx, &leased, None)
            .await
            .expect("live lease"),
        TxClaim::InFlight { attempt: 1, .. }
    ));
    // Claimed, then claimed again in the same transaction: its own row is a duplicate.
    assert_eq!(
        store
            .claim_in_tx(&mut tx, &fresh, None)
            .await
            .expect("claim"),
        TxClaim::Claimed { fence: 1 }
    );
    assert!(matches!(
        store
            .claim_in_tx(&mut tx, &fresh, None)
            .await
            .expect("again"),
        TxClaim::Completed { .. }
    ));
    common::insert_business_row(&store, &mut tx, &fresh, "after duplicates").await;
    tx.commit().await.expect("commit after duplicates");
    assert_eq!(
        common::business_rows(&store, &fresh).await,
        ["after duplicates"]
    );
    // The completed record carries no token (the claim's marker was cleared).
    let record = store.get(&fresh).await.expect("get").expect("record");
    assert!(
        matches!(
            record.state,
            dedup_core::RecordState::Completed { token: None, .. }
        ),
        "{record:?}"
    );
}

/// 24 transactions at REPEATABLE READ (the server's default) claim neighbouring new keys at
/// once, each holding its transaction open a while, a third of them rolling back: none
/// deadlocks or waits for another, and exactly the committed ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tx_claims_of_neighbouring_keys_do_not_deadlock() {
    let url = url_or_skip!();
    let store = common::store(&url, "neighbours", None).await;
    common::create_business_table(&store).await;
    // Existing neighbours too, so some claims are takeovers of nothing and some inserts
    // land between records.
    for i in (0..48).step_by(4) {
        let k = key("orders", &format!("k-{i:03}"));
        let mut tx = store.pool().begin().await.expect("begin");
        store.claim_in_tx(&mut tx, &k, None).await.expect("seed");
        tx.commit().await.expect("commit");
    }
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for i in (0..48).filter(|i| i % 4 != 0).take(24) {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let k = key("orders", &format!("k-{i:03}"));
            let mut tx = store.pool().begin().await.expect("begin");
            let isolation: String = sqlx::query_scalar("SELECT @@tx_isolation")
                .fetch_one(&mut *tx)
                .await
                .expect("isolation");
            assert_eq!(isolation, "REPEATABLE-READ");
            let claim = store.claim_in_tx(&mut tx, &k, None).await;
            tokio::time::sleep(Duration::from_millis(150)).await;
            common::insert_business_row(&store, &mut tx, &k, "done").await;
            if i % 3 == 0 {
                tx.rollback().await.expect("rollback");
            } else {
                tx.commit().await.expect("commit");
            }
            (i, claim)
        }));
    }
    for t in tasks {
        let (i, claim) = t.await.expect("task");
        assert_eq!(
            claim.expect("no deadlock"),
            TxClaim::Claimed { fence: 1 },
            "k-{i:03}"
        );
    }
    // They ran side by side, not one after another (24 x 150 ms).
    assert!(
        started.elapsed() < Duration::from_millis(24 * 150 / 2),
        "{:?}",
        started.elapsed()
    );
    for i in (0..48).filter(|i| i % 4 != 0).take(24) {
        let k = key("orders", &format!("k-{i:03}"));
        let record = store.get(&k).await.expect("get");
        assert_eq!(record.is_some(), i % 3 != 0, "k-{i:03}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_use_the_server_clock_by_default() {
    let url = url_or_skip!();
    let store = common::store(&url, "server_clock", None).await;
    let server: i64 = sqlx::query_scalar(
        "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', UTC_TIMESTAMP(6)) \
         DIV 1000 AS SIGNED)",
    )
    .fetch_one(store.pool())
    .await
    .expect("server now");
    let now = AdminStorage::now(&store).await.expect("now").as_millis();
    assert!(
        (now - server).abs() < 5_000,
        "store {now} vs server {server}"
    );
    let Claim::Acquired(l) = store
        .claim(&key("c", "m"), &lease(30))
        .await
        .expect("claim")
    else {
        panic!("not acquired");
    };
    let expires = l.expires_at.as_millis();
    assert!(
        (expires - (now + 30_000)).abs() < 5_000,
        "expiry {expires} is not the server's now {now} + 30 s"
    );
    assert!(store.capabilities().server_clock);
}

#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verify_identity_connects_and_another_ca_is_refused() {
    let url = url_or_skip!();
    let (Some(ca), Some(other)) = (
        dedup_conformance::server_url("DEDUP_TLS_CA"),
        dedup_conformance::server_url("DEDUP_TLS_OTHER_CA"),
    ) else {
        eprintln!("SKIPPED: DEDUP_TLS_CA is not set");
        return;
    };
    let with_ca = |ca: &str| {
        MySqlConfig::from(SqlSettings {
            table: common::unique_table("tls"),
            tls: TlsFiles {
                ca: Some(ca.into()),
                ..TlsFiles::default()
            },
            max_connections: 2,
            ..Default::default()
        })
    };
    let store = MySqlStore::connect_with(&url, with_ca(&ca))
        .await
        .expect("VERIFY_IDENTITY with the server's CA");
    let cipher: Option<(String, String)> = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .fetch_optional(store.pool())
        .await
        .expect("status");
    let cipher = cipher.map(|(_, v)| v).unwrap_or_default();
    assert!(!cipher.is_empty(), "the connection is not encrypted");
    assert!(
        store
            .claim(&key("c", "m"), &lease(30))
            .await
            .expect("claim")
            .is_acquired()
    );
    let e = MySqlStore::connect_with(&url, with_ca(&other))
        .await
        .expect_err("a certificate from another CA");
    assert!(
        format!("{e:?}").contains("TLS") || format!("{e}").contains("TLS"),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_is_a_retryable_error_and_the_pool_recovers() {
    let url = url_or_skip!();
    let config = MySqlConfig::from(SqlSettings {
        table: common::unique_table("killed"),
        max_connections: 1,
        ..Default::default()
    });
    let store = MySqlStore::connect_with(&url, config)
        .await
        .expect("connect");
    // The pool's one connection: its id, then back to the pool.
    let id: i64 = {
        let mut conn = store.pool().acquire().await.expect("conn");
        sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
            .fetch_one(&mut *conn)
            .await
            .expect("id")
    };
    let killer = sqlx::MySqlPool::connect(&url).await.expect("connect");
    sqlx::query(AssertSqlSafe(format!("KILL CONNECTION {id}")))
        .execute(&killer)
        .await
        .expect("kill");
    // The store's next call runs on the killed connection (idle under a second: not
    // pinged first) and fails retryably; the pool then opens a new one.
    let e = store
        .claim(&key("c", "during"), &lease(30))
        .await
        .expect_err("the connection was killed");
    assert!(e.is_retryable(), "{e:?}");
    assert!(
        std::error::Error::source(&e).is_some(),
        "source kept: {e:?}"
    );
    let store = Arc::new(store);
    for i in 0..5 {
        let k = key("c", &format!("after-{i}"));
        assert!(
            store
                .claim(&k, &lease(30))
                .await
                .expect("claim")
                .is_acquired()
        );
    }
}

/// The session's `Questions` (statements the client sent: text queries and prepared
/// executions, not pings or prepares) and `Com_stmt_prepare`, read on `conn` (the read
/// itself counts one question).
async fn session_counts<'c, E>(conn: E) -> (u64, u64)
where
    E: sqlx::Executor<'c, Database = sqlx::MySql>,
{
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT CAST(VARIABLE_NAME AS CHAR), CAST(VARIABLE_VALUE AS CHAR) \
         FROM information_schema.SESSION_STATUS \
         WHERE VARIABLE_NAME IN ('QUESTIONS', 'COM_STMT_PREPARE')",
    )
    .fetch_all(conn)
    .await
    .expect("session status");
    let get = |name: &str| {
        rows.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {rows:?}"))
    };
    (get("QUESTIONS"), get("COM_STMT_PREPARE"))
}

/// The common cases cost one statement each, and statements are prepared once per
/// connection: a claim of a new key, its commit, a transactional claim of a new key, a
/// transactional commit, a purge batch (MariaDB). The counts are the session's own, on a
/// pool of one connection.
#[tokio::test]
async fn common_cases_are_one_statement_each_prepared_once() {
    let url = url_or_skip!();
    let clock = common::manual_clock();
    let config = MySqlConfig::from(SqlSettings {
        table: common::unique_table("one_statement"),
        clock: Some(clock.clone()),
        max_connections: 1,
        ..Default::default()
    });
    let store = MySqlStore::connect_with(&url, config)
        .await
        .expect("connect");
    common::create_business_table(&store).await;
    let pool = store.pool().clone();
    // Statements per round, the first (preparing) round aside.
    let mut lease_mode = Vec::new();
    let mut tx_mode = Vec::new();
    let mut prepared = Vec::new();
    for round in 0..3 {
        let (k, t) = (
            key("c", &format!("k{round}")),
            key("c", &format!("t{round}")),
        );
        let (q0, p0) = session_counts(&pool).await;
        let Claim::Acquired(l) = store.claim(&k, &lease(30)).await.expect("claim") else {
            panic!("a new key is acquired");
        };
        store.commit(&l, None).await.expect("commit");
        let (q1, p1) = session_counts(&pool).await;
        lease_mode.push(q1 - q0 - 1);

        let mut tx = pool.begin().await.expect("begin");
        let (q2, p2) = session_counts(&mut *tx).await;
        assert_eq!(
            store
                .claim_in_tx(&mut tx, &t, None)
                .await
                .expect("tx claim"),
            TxClaim::Claimed { fence: 1 }
        );
        let (q3, p3) = session_counts(&mut *tx).await;
        tx.commit().await.expect("commit");
        tx_mode.push(q3 - q2 - 1);
        prepared.push((p1 - p0) + (p3 - p2));
    }
    assert_eq!(lease_mode[1..], [2, 2], "claim + commit: {lease_mode:?}");
    assert_eq!(
        tx_mode[1..],
        [1, 1],
        "claim_in_tx of a new key: {tx_mode:?}"
    );
    assert_eq!(prepared[1..], [0, 0], "prepared again: {prepared:?}");

    // commit_in_tx of a held lease: one statement.
    let k = key("c", "held");
    let Claim::Acquired(l) = store.claim(&k, &lease(30)).await.expect("claim") else {
        panic!("a new key is acquired");
    };
    for round in 0..2 {
        let mut tx = pool.begin().await.expect("begin");
        let (q0, _) = session_counts(&mut *tx).await;
        store
            .commit_in_tx(&mut tx, &l, None)
            .await
            .expect("commit_in_tx");
        let (q1, _) = session_counts(&mut *tx).await;
        if round == 0 {
            // Rolled back: still held for the next round.
            tx.rollback().await.expect("rollback");
            assert_eq!(q1 - q0 - 1, 1, "commit_in_tx of a held lease");
        } else {
            tx.commit().await.expect("commit");
        }
    }

    // A purge batch on MariaDB: one statement (the first purge also asks the version), and
    // one more per purge run to keep it as the last.
    clock.advance(Duration::from_secs(3600));
    let options = dedup_core::PurgeOptions::older_than(Duration::from_secs(60))
        .batch_size(2)
        .unpaced();
    store.purge(&options).await.expect("warm purge");
    for round in 0..3 {
        let k = key("p", &format!("p{round}"));
        let Claim::Acquired(l) = store.claim(&k, &lease(30)).await.expect("claim") else {
            panic!("a new key is acquired");
        };
        store.commit(&l, None).await.expect("commit");
    }
    clock.advance(Duration::from_secs(3600));
    let (q0, _) = session_counts(&pool).await;
    let report = store.purge(&options).await.expect("purge");
    let (q1, _) = session_counts(&pool).await;
    assert_eq!(report.completed, 3, "{report:?}");
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&pool)
        .await
        .expect("version");
    if version.to_ascii_lowercase().contains("mariadb") {
        // Besides the batches: the one that reads the counts, and the one that keeps the run.
        assert_eq!(
            q1 - q0 - 2,
            u64::from(report.batches),
            "one statement per batch: {report:?}"
        );
    }
}
