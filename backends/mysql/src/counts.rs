//! Kept counts (opt-in: `Admin::enable_counts`, `dedup counts enable`): what MySQL /
//! MariaDB adds to a store so the operator's counts stop reading every record, and how they
//! are read.
//!
//! Enabling adds, beside the records table `T`:
//! - `T_counts`, rows of differences keyed by consumer and connection
//!   (`dedup_sql::counts::KEPT`'s columns); the count of a consumer is the sum of its rows;
//! - three row triggers (insert, update, delete), each adding the record's class change to
//!   the row of its consumer and of the writing connection (`CONNECTION_ID()`), an upsert.
//!   An update that changes no class (a renewal, a release, a takeover) writes nothing.
//!   Each connection writes its own row, so a writer never waits on another's counter row,
//!   even inside a long transaction of the caller's;
//! - `in_flight_idx` on `T (expires_at, processed_at)`: completed records have no
//!   `expires_at`, so the expired leases and the oldest live one are read through its
//!   range, without the completed records.
//!
//! Connections come and go (a pool replaces each after its lifetime), so rows pile up
//! slowly. A read that finds more than `FOLD_AFTER` rows beyond one per consumer folds the
//! rows no transaction holds into one row per consumer (connection 0, which no connection
//! has). It skips the rows a writer holds (`SKIP LOCKED`), so it never waits on one.
//!
//! What it costs the consumers: a claim of a new key, a commit, a purged or forgotten
//! record each upsert a counts row in the same statement, and claims, commits, renewals
//! and releases write the new index. Without kept counts the store has none of it;
//! disabling drops all of it.

use std::collections::BTreeMap;

use dedup_core::admin::ConsumerCounts;
use dedup_core::backend::{DEAD_LETTER_PREFIX_HEX, FAILED_PREFIX_HEX};
use dedup_core::{Result, Timestamp};
use dedup_sql::counts::{self, CountsDialect, KEPT, class_counts, needs_fold, read_rows};
use dedup_sql::migrate::Migrations;
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, MySql, MySqlConnection, Row};

use crate::MySqlStore;
use crate::admin::Dialect;
use crate::config::{MySqlConfig, suffixed_name};
use crate::error::backend;
use crate::schema::Inbox;
use crate::statements::BEGIN;

/// The index enabling adds to the records table.
const INDEX: &str = "in_flight_idx";

/// The connection of the rows a fold writes (no connection has id 0).
const FOLDED: i64 = 0;

impl CountsDialect for Dialect {
    fn bigint(expr: &str) -> String {
        format!("CAST({expr} AS SIGNED)")
    }

    fn byte_order(column: &str) -> String {
        // VARBINARY: compared byte for byte already.
        column.to_owned()
    }
}

/// The names enabling creates for one records table (bare, not quoted).
struct Names {
    kept: String,
    triggers: [String; 3],
}

impl Names {
    fn of(config: &MySqlConfig) -> Self {
        let name = |suffix: &str| suffixed_name(&config.table, suffix);
        Names {
            kept: name("_counts"),
            triggers: [
                name("_counts_ins"),
                name("_counts_upd"),
                name("_counts_del"),
            ],
        }
    }
}

/// The class (an index into [`KEPT`]) of the record `row` (`NEW` or `OLD`), as SQL. The
/// same classes as the shared status conditions: in flight while `processed_at` is NULL,
/// then failed or dead-lettered by the outcome's prefix, else processed.
fn class_of(row: &str) -> String {
    let prefix = |hex: &str| format!("LEFT({row}.outcome, {}) = X'{hex}'", hex.len() / 2);
    format!(
        "(CASE WHEN {row}.processed_at IS NULL THEN 0 WHEN {} THEN 2 WHEN {} THEN 3 ELSE 1 END)",
        prefix(FAILED_PREFIX_HEX),
        prefix(DEAD_LETTER_PREFIX_HEX),
    )
}

/// One statement adding (`sign` `""`) or taking away (`"-"`) the record `row`'s class in
/// the row of its consumer and of this connection.
fn upsert(kept: &str, row: &str, sign: &str) -> String {
    let class = class_of(row);
    let values: Vec<String> = (0..KEPT.len())
        .map(|i| format!("{sign}({class} = {i})"))
        .collect();
    let add: Vec<String> = KEPT
        .iter()
        .map(|c| format!("{c} = {c} + VALUES({c})"))
        .collect();
    format!(
        "INSERT INTO `{kept}` VALUES ({row}.consumer, CONNECTION_ID(), {}) \
         ON DUPLICATE KEY UPDATE {}",
        values.join(", "),
        add.join(", ")
    )
}

/// The counts table's DDL.
fn create_table(kept: &str) -> String {
    let columns: Vec<String> = KEPT
        .iter()
        .map(|c| format!("{c} BIGINT NOT NULL"))
        .collect();
    format!(
        "CREATE TABLE `{kept}` (consumer VARBINARY(200) NOT NULL, conn BIGINT NOT NULL, {}, \
         PRIMARY KEY (consumer, conn)) ENGINE = InnoDB",
        columns.join(", ")
    )
}

/// The three triggers' DDL (insert, update, delete), in [`Names::triggers`]' order.
fn create_triggers(names: &Names, table: &str) -> [String; 3] {
    let kept = &names.kept;
    let [ins, upd, del] = &names.triggers;
    [
        format!(
            "CREATE TRIGGER `{ins}` AFTER INSERT ON {table} FOR EACH ROW {}",
            upsert(kept, "NEW", "")
        ),
        format!(
            "CREATE TRIGGER `{upd}` AFTER UPDATE ON {table} FOR EACH ROW BEGIN \
             IF {} <> {} OR OLD.consumer <> NEW.consumer THEN {}; {}; END IF; END",
            class_of("OLD"),
            class_of("NEW"),
            upsert(kept, "OLD", "-"),
            upsert(kept, "NEW", ""),
        ),
        format!(
            "CREATE TRIGGER `{del}` AFTER DELETE ON {table} FOR EACH ROW {}",
            upsert(kept, "OLD", "-")
        ),
    ]
}

/// What of kept counts a store has: the counts table, how many of the triggers, the index.
#[derive(Debug, PartialEq, Eq)]
struct Present {
    table: bool,
    triggers: i64,
    index: bool,
}

impl Present {
    /// Everything: the store keeps counts.
    fn all(&self) -> bool {
        self.table && self.triggers == 3 && self.index
    }

    /// Nothing: the store keeps none, and has nothing left of an interrupted change.
    fn none(&self) -> bool {
        !self.table && self.triggers == 0 && !self.index
    }
}

/// What of kept counts `config`'s store has, read from the catalog on `conn`.
async fn present<'c, E>(conn: E, config: &MySqlConfig) -> Result<Present>
where
    E: sqlx::Executor<'c, Database = MySql>,
{
    let names = Names::of(config);
    let row = sqlx::query(
        "SELECT CAST((SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = ?) AS SIGNED) AS kept, \
         CAST((SELECT COUNT(*) FROM information_schema.triggers \
             WHERE trigger_schema = DATABASE() AND event_object_table = ? \
             AND trigger_name IN (?, ?, ?)) AS SIGNED) AS triggers, \
         CAST((SELECT COUNT(*) FROM information_schema.statistics \
             WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ?) \
             AS SIGNED) AS idx",
    )
    .bind(&names.kept)
    .bind(&config.table)
    .bind(&names.triggers[0])
    .bind(&names.triggers[1])
    .bind(&names.triggers[2])
    .bind(&config.table)
    .bind(INDEX)
    .fetch_one(conn)
    .await
    .map_err(backend)?;
    let get = |name: &str| row.try_get::<i64, _>(name).map_err(backend);
    Ok(Present {
        table: get("kept")? > 0,
        triggers: get("triggers")?,
        index: get("idx")? > 0,
    })
}

/// Whether `store` keeps counts: its counts table, triggers and index all exist.
pub(crate) async fn kept(store: &MySqlStore) -> Result<bool> {
    Ok(present(store.pool(), store.config()).await?.all())
}

/// Run each of `statements` on `conn`, in order, stopping at the first error.
async fn run(conn: &mut MySqlConnection, statements: &[String]) -> Result<()> {
    for statement in statements {
        sqlx::raw_sql(AssertSqlSafe(statement.clone()))
            .execute(&mut *conn)
            .await
            .map_err(backend)?;
    }
    Ok(())
}

/// Drop whatever of kept counts `config`'s store has: the triggers first, so no writer
/// writes the counts table once it is gone.
async fn drop_all(conn: &mut MySqlConnection, config: &MySqlConfig) -> Result<()> {
    let names = Names::of(config);
    let mut statements: Vec<String> = names
        .triggers
        .iter()
        .map(|t| format!("DROP TRIGGER IF EXISTS `{t}`"))
        .collect();
    statements.push(format!("DROP TABLE IF EXISTS `{}`", names.kept));
    run(conn, &statements).await?;
    if present(&mut *conn, config).await?.index {
        let table = config.quoted_table();
        run(conn, &[format!("ALTER TABLE {table} DROP INDEX {INDEX}")]).await?;
    }
    Ok(())
}

/// Add kept counts to `config`'s store, which has none. The index is built first, while
/// writers go on (an online `ALTER TABLE`). Then the records table is locked against
/// writes (`LOCK TABLES ... WRITE`) while the starting counts are computed and the
/// triggers created, so no write is missed or counted twice.
async fn build(conn: &mut MySqlConnection, config: &MySqlConfig) -> Result<()> {
    let names = Names::of(config);
    let table = config.quoted_table();
    let kept = &names.kept;
    run(
        conn,
        &[
            format!("ALTER TABLE {table} ADD INDEX {INDEX} (expires_at, processed_at)"),
            create_table(kept),
            format!("LOCK TABLES {table} WRITE, `{kept}` WRITE"),
        ],
    )
    .await?;
    let mut locked = vec![format!(
        "INSERT INTO `{kept}` SELECT consumer, {FOLDED}, {} FROM {table} GROUP BY consumer",
        class_counts::<Dialect>("")
    )];
    locked.extend(create_triggers(&names, &table));
    let built = run(conn, &locked).await;
    let unlocked = run(conn, &["UNLOCK TABLES".to_owned()]).await;
    built.and(unlocked)
}

/// Run `change` on a connection holding the migration lock, unless what the store has
/// already is `done`; `Ok(false)` then, nothing changed.
async fn change(store: &MySqlStore, done: fn(&Present) -> bool, enable: bool) -> Result<bool> {
    let migrations = Inbox::new(store.pool(), store.config());
    let mut locked = migrations.lock().await?;
    let result = async {
        let config = store.config();
        let found = present(&mut *locked, config).await?;
        if done(&found) {
            return Ok(false);
        }
        // What an interrupted change left goes first.
        drop_all(&mut locked, config).await?;
        if enable && let Err(e) = build(&mut locked, config).await {
            // Leave nothing half built: the error is the build's.
            let _ = drop_all(&mut locked, config).await;
            return Err(e);
        }
        Ok(true)
    }
    .await;
    let changed = result.as_ref().ok().copied();
    migrations
        .unlock(locked, result.map(drop))
        .await
        .map(|()| changed.unwrap_or(false))
}

/// Start keeping counts: see the module's docs. Writers wait while the starting counts are
/// computed.
pub(crate) async fn enable(store: &MySqlStore) -> Result<bool> {
    change(store, Present::all, true).await
}

/// Stop keeping counts: drop what [`enable`] created.
pub(crate) async fn disable(store: &MySqlStore) -> Result<bool> {
    change(store, Present::none, false).await
}

/// The counts table of `store`, quoted.
fn kept_table(store: &MySqlStore) -> String {
    format!("`{}`", Names::of(store.config()).kept)
}

/// The kept counts per consumer at `now` (at most `limit` consumers, in byte order), in one
/// statement; folds the rows of differences afterwards when there are many.
pub(crate) async fn read(
    store: &MySqlStore,
    now: Timestamp,
    limit: Option<usize>,
) -> Result<Vec<ConsumerCounts>> {
    let sql = counts::read_sql::<Dialect>(&kept_table(store), store.table(), "?", limit);
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(now.as_millis())
        .fetch_all(store.pool())
        .await
        .map_err(backend)?;
    let consumer = |row: &MySqlRow| Ok(crate::decode::text(row, "consumer")?.unwrap_or_default());
    let (consumers, deltas) = read_rows::<MySql>(&rows, now, consumer, backend)?;
    if needs_fold(deltas, consumers.len()) {
        fold(store).await?;
    }
    Ok(consumers)
}

/// Rows folded per statement.
const FOLD_CHUNK: usize = 500;

/// Fold the rows of differences no transaction holds into one row per consumer
/// (connection [`FOLDED`]), in one transaction.
async fn fold(store: &MySqlStore) -> Result<()> {
    let kept = kept_table(store);
    let mut tx = store.pool().begin_with(BEGIN).await.map_err(backend)?;
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT consumer, conn, {} FROM {kept} WHERE conn <> {FOLDED} FOR UPDATE SKIP LOCKED",
        KEPT.join(", ")
    )))
    .fetch_all(&mut *tx)
    .await
    .map_err(backend)?;
    let mut sums: BTreeMap<Vec<u8>, [i64; 4]> = BTreeMap::new();
    let mut taken = Vec::with_capacity(rows.len());
    for row in &rows {
        let consumer: Vec<u8> = row.try_get("consumer").map_err(backend)?;
        let conn: i64 = row.try_get("conn").map_err(backend)?;
        let sum = sums.entry(consumer.clone()).or_default();
        for (i, class) in KEPT.iter().enumerate() {
            sum[i] += row.try_get::<i64, _>(*class).map_err(backend)?;
        }
        taken.push((consumer, conn));
    }
    for chunk in taken.chunks(FOLD_CHUNK) {
        let sql = format!(
            "DELETE FROM {kept} WHERE (consumer, conn) IN ({})",
            vec!["(?, ?)"; chunk.len()].join(", ")
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (consumer, conn) in chunk {
            query = query.bind(consumer.as_slice()).bind(*conn);
        }
        query.execute(&mut *tx).await.map_err(backend)?;
    }
    let sums: Vec<_> = sums.into_iter().filter(|(_, s)| s != &[0; 4]).collect();
    for chunk in sums.chunks(FOLD_CHUNK) {
        let add: Vec<String> = KEPT
            .iter()
            .map(|c| format!("{c} = {c} + VALUES({c})"))
            .collect();
        let sql = format!(
            "INSERT INTO {kept} VALUES {} ON DUPLICATE KEY UPDATE {}",
            vec!["(?, ?, ?, ?, ?, ?)"; chunk.len()].join(", "),
            add.join(", ")
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (consumer, sum) in chunk {
            query = query.bind(consumer.as_slice()).bind(FOLDED);
            for n in sum {
                query = query.bind(*n);
            }
        }
        query.execute(&mut *tx).await.map_err(backend)?;
    }
    tx.commit().await.map_err(backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_table_names_give_names_mysql_takes() {
        let config = MySqlConfig::from(dedup_sql::SqlSettings {
            table: "a".repeat(64),
            ..Default::default()
        });
        let names = Names::of(&config);
        for name in names.triggers.iter().chain([&names.kept]) {
            assert!(name.len() <= 64, "{name}");
        }
        assert_eq!(
            Names::of(&MySqlConfig::default()).triggers[1],
            "dedup_inbox_counts_upd"
        );
    }

    #[test]
    fn the_update_trigger_writes_only_when_the_class_changes() {
        let [_, upd, _] = create_triggers(&Names::of(&MySqlConfig::default()), "`t`");
        assert!(upd.contains("IF (CASE WHEN OLD.processed_at"), "{upd}");
        assert_eq!(upd.matches("INSERT INTO `dedup_inbox_counts`").count(), 2);
        assert!(
            upd.contains("VALUES (OLD.consumer, CONNECTION_ID(), -("),
            "{upd}"
        );
    }
}
