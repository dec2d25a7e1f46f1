//! Schema versions: a table of the first release's layout is upgraded in place, records
//! intact; a table from a newer library is refused; a foreign table is left alone.

mod common;

use std::time::Duration;

use dedup_core::{Admin, Claim, ClaimOptions, DedupStore, Error, Key, PurgeOptions, RecordState};
use dedup_postgres::sqlx::{self, AssertSqlSafe};
use dedup_postgres::{PostgresConfig, PostgresStore, SqlSettings};

const MINUTE: i64 = 60_000;

fn config(table: &str) -> PostgresConfig {
    PostgresConfig {
        schema: common::SCHEMA.into(),
        sql: SqlSettings {
            table: table.into(),
            clock: None,
            max_connections: 2,
            ..Default::default()
        },
        ..PostgresConfig::default()
    }
}

async fn exec(pool: &sqlx::PgPool, sql: String) {
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(pool)
        .await
        .expect("fixture SQL");
}

/// A store that has not touched the database yet (no migrate), for fixtures.
async fn unmigrated(url: &str, table: &str) -> PostgresStore {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .expect("connect");
    exec(
        &pool,
        format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", common::SCHEMA),
    )
    .await;
    PostgresStore::from_pool(pool, config(table))
        .await
        .expect("store")
}

/// The version recorded for the store's table; `None` also when no versions table exists
/// yet (a fresh schema whose only migration so far was refused and rolled back).
async fn version_of(store: &PostgresStore) -> Option<i32> {
    let versions_table = format!("\"{}\".dedup_schema_versions", common::SCHEMA);
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&versions_table)
        .fetch_one(store.pool())
        .await
        .expect("look for the versions table");
    if !exists {
        return None;
    }
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM \"{}\".dedup_schema_versions WHERE table_name = $1",
        common::SCHEMA
    )))
    .bind(&store.config().table)
    .fetch_optional(store.pool())
    .await
    .expect("read version")
}

async fn indexes_of(store: &PostgresStore) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 \
         ORDER BY 1",
    )
    .bind(common::SCHEMA)
    .bind(&store.config().table)
    .fetch_all(store.pool())
    .await
    .expect("read indexes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_table_is_upgraded_with_its_records() {
    let url = url_or_skip!();
    let table = common::unique_table("upgrade_v1");
    let store = unmigrated(&url, &table).await;
    let t = store.table().to_owned();
    // The first release's layout, exactly as it created it (no claimed_at; two partial
    // purge indexes), with one record in each state.
    exec(
        store.pool(),
        format!(
            r#"CREATE TABLE {t} (
    consumer     text    NOT NULL,
    message_id   text    NOT NULL,
    token        uuid,
    fence        bigint  NOT NULL,
    attempt      integer NOT NULL,
    expires_at   bigint,
    processed_at bigint,
    outcome      bytea,
    fingerprint  text,
    PRIMARY KEY (consumer, message_id),
    CHECK (processed_at IS NOT NULL OR (token IS NOT NULL AND expires_at IS NOT NULL))
);
CREATE INDEX "{table}_completed_idx" ON {t} (processed_at) WHERE processed_at IS NOT NULL;
CREATE INDEX "{table}_expiring_idx" ON {t} (expires_at) WHERE processed_at IS NULL;
INSERT INTO {t} VALUES
  ('billing', 'done', gen_random_uuid(), 3, 3, NULL,
   (extract(epoch from now()) * 1000)::bigint - 120 * {MINUTE}, 'charged', NULL),
  ('billing', 'stuck', gen_random_uuid(), 2, 2,
   (extract(epoch from now()) * 1000)::bigint - 90 * {MINUTE}, NULL, NULL, 'fp'),
  ('billing', 'recent', gen_random_uuid(), 1, 1, NULL,
   (extract(epoch from now()) * 1000)::bigint, NULL, NULL);
"#
        ),
    )
    .await;
    assert_eq!(version_of(&store).await, None, "no version recorded yet");

    store.migrate().await.expect("upgrade");
    assert_eq!(version_of(&store).await, Some(5), "upgraded to version 5");
    assert_eq!(
        indexes_of(&store).await,
        vec![format!("{table}_claimed_idx"), format!("{table}_pkey")],
        "the partial indexes are replaced by the claimed_at index"
    );
    // A second migrate (another node starting) changes nothing.
    store.migrate().await.expect("migrate again");
    assert_eq!(version_of(&store).await, Some(5));
    assert_eq!(store.last_purge().await.unwrap(), None, "no purge ran yet");

    // The old records read, answer and purge as before.
    let done = Key::new("billing", "done").unwrap();
    let claim = store.claim(&done, &ClaimOptions::default()).await.unwrap();
    assert!(
        matches!(&claim, Claim::Completed { outcome: Some(o), .. } if o == b"charged"),
        "{claim:?}"
    );
    let stuck = Key::new("billing", "stuck").unwrap();
    let record = store.get(&stuck).await.unwrap().expect("stuck record");
    assert_eq!((record.fence, record.attempt), (2, 2));
    assert!(matches!(record.state, RecordState::InFlight { .. }));
    assert_eq!(
        record.first_claimed_at, None,
        "not known for rows written before v3"
    );
    assert_eq!(
        record.last_failure, None,
        "no failure kept for rows written before v4"
    );
    let report = store
        .purge(&PurgeOptions::older_than(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!(
        (report.completed, report.expired),
        (1, 1),
        "the backfilled claimed_at lets purge find both old records: {report:?}"
    );
    let run = store
        .last_purge()
        .await
        .unwrap()
        .expect("version 5 keeps the run");
    assert_eq!((run.removed, run.stopped_early), (2, false), "{run:?}");
    let recent = Key::new("billing", "recent").unwrap();
    assert!(store.get(&recent).await.unwrap().is_some(), "recent kept");
    let fresh = store
        .claim(
            &Key::new("billing", "new").unwrap(),
            &ClaimOptions::default(),
        )
        .await
        .unwrap();
    assert!(fresh.is_acquired(), "{fresh:?}");
    let new = store
        .get(&Key::new("billing", "new").unwrap())
        .await
        .unwrap()
        .expect("new record");
    assert!(new.first_claimed_at.is_some(), "{new:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_and_left_unchanged() {
    let url = url_or_skip!();
    let store = common::store(&url, "newer_schema", None).await;
    let key = Key::new("c", "kept").unwrap();
    assert!(
        store
            .claim(&key, &ClaimOptions::default())
            .await
            .unwrap()
            .is_acquired()
    );
    exec(
        store.pool(),
        format!(
            "UPDATE \"{}\".dedup_schema_versions SET version = 99 WHERE table_name = '{}'",
            common::SCHEMA,
            store.config().table
        ),
    )
    .await;
    let err = store.migrate().await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::SchemaTooNew {
                found: 99,
                known: 5,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade"), "{err}");
    let err = PostgresStore::connect_with(&url, config(&store.config().table))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::SchemaTooNew { .. }), "{err:?}");
    assert_eq!(version_of(&store).await, Some(99), "version untouched");
    assert!(
        store.get(&key).await.unwrap().is_some(),
        "records untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_table_is_refused_and_left_unchanged() {
    let url = url_or_skip!();
    let table = common::unique_table("foreign");
    let store = unmigrated(&url, &table).await;
    exec(
        store.pool(),
        format!("CREATE TABLE {} (id bigint PRIMARY KEY)", store.table()),
    )
    .await;
    let err = store.migrate().await.unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert!(err.to_string().contains("not a dedup table"), "{err}");
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns \
         WHERE table_schema = $1 AND table_name = $2",
    )
    .bind(common::SCHEMA)
    .bind(&table)
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(columns, vec!["id".to_owned()], "nothing added to the table");
    assert_eq!(version_of(&store).await, None, "no version recorded");
}
