//! Kept counts (opt-in: `Admin::enable_counts`, `dedup counts enable`): what PostgreSQL
//! adds to a store so the operator's counts stop reading every record, and how they are
//! read.
//!
//! Enabling adds, beside the records table `T`:
//! - `T_counts`, rows of differences per consumer (`dedup_sql::counts::KEPT`'s columns);
//!   the count of a consumer is the sum of its rows;
//! - three statement-level triggers (insert, update, delete) with transition tables, each
//!   appending one row per consumer whose counts the statement changed (none when they
//!   cancel out: a renewal, a release, a takeover), through `T_count_fn`, a `SECURITY
//!   DEFINER` function (consumers running as another role need no grant on `T_counts`);
//! - `T_fold_fn`, which folds the rows into one per consumer (run by a read that found
//!   more than `FOLD_AFTER` extra rows; every write only appends, so writers never wait
//!   on one counter row);
//! - `T_in_flight_idx`, a partial index of the in-flight rows on `(expires_at, consumer,
//!   message_id)` (byte order): the expired leases and the oldest live one (ties in key
//!   order) are read through it.
//!
//! What it costs the consumers: every writing statement runs the trigger (and the ones
//! that change a class append a row: a claim of a new key, a commit, a purge, a forget),
//! and the partial index makes commits, renewals and releases non-HOT updates (they change
//! `processed_at` or `expires_at`, columns of the index). Without kept counts the store has
//! none of it; disabling drops all of it.

use dedup_core::admin::ConsumerCounts;
use dedup_core::{Result, Timestamp};
use dedup_sql::counts::{self, any_change, class_counts, needs_fold, read_rows, sums};
use sqlx::{AssertSqlSafe, PgPool, Postgres, Transaction};

use crate::PostgresStore;
use crate::config::PostgresConfig;
use crate::ddl::{execute, index_name};
use crate::error::backend;
use crate::schema::lock_key;
use crate::statements::AdminSql;

/// What [`enable`] runs, under the migration lock, in one transaction. Placeholders:
/// `{table}` the records table, `{kept}` the counts table, `{count_fn}` / `{fold_fn}` the
/// functions (schema-qualified), `{*_trigger}` / `{index}` bare names, `{plus}` / `{minus}`
/// a row set's counts as differences, `{sums}` their sums, `{changed}` "some sum is not 0".
const ENABLE: &str = r#"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE;
CREATE TABLE {kept} (
    consumer      text   NOT NULL,
    in_flight     bigint NOT NULL,
    completed     bigint NOT NULL,
    failed        bigint NOT NULL,
    dead_lettered bigint NOT NULL
);
CREATE FUNCTION {count_fn}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {kept} SELECT consumer, {plus} FROM new_rows GROUP BY consumer;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO {kept} SELECT consumer, {minus} FROM old_rows GROUP BY consumer;
    ELSE
        INSERT INTO {kept} SELECT consumer, {sums} FROM (
            SELECT consumer, {plus} FROM new_rows GROUP BY consumer
            UNION ALL
            SELECT consumer, {minus} FROM old_rows GROUP BY consumer
        ) d GROUP BY consumer HAVING {changed};
    END IF;
    RETURN NULL;
END
$body$;
CREATE FUNCTION {fold_fn}() RETURNS void LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $body$
    WITH d AS (DELETE FROM {kept} RETURNING *)
    INSERT INTO {kept} SELECT consumer, {sums} FROM d GROUP BY consumer HAVING {changed};
$body$;
CREATE TRIGGER "{insert_trigger}" AFTER INSERT ON {table}
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {count_fn}();
CREATE TRIGGER "{update_trigger}" AFTER UPDATE ON {table}
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {count_fn}();
CREATE TRIGGER "{delete_trigger}" AFTER DELETE ON {table}
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {count_fn}();
CREATE INDEX "{index}" ON {table} (expires_at, consumer COLLATE "C", message_id COLLATE "C")
    WHERE processed_at IS NULL;
INSERT INTO {kept} SELECT consumer, {plus} FROM {table} GROUP BY consumer;
"#;

/// What [`disable`] runs: everything [`ENABLE`] created, dropped.
const DISABLE: &str = r#"DROP TRIGGER "{insert_trigger}" ON {table};
DROP TRIGGER "{update_trigger}" ON {table};
DROP TRIGGER "{delete_trigger}" ON {table};
DROP FUNCTION {count_fn}();
DROP FUNCTION {fold_fn}();
DROP TABLE {kept};
DROP INDEX "{schema}"."{index}";
"#;

/// The counts table of `config`'s store, quoted and schema-qualified.
fn kept_table(config: &PostgresConfig) -> String {
    format!(
        "\"{}\".\"{}\"",
        config.schema,
        index_name(&config.table, "counts")
    )
}

/// `template` for `config`'s store, its placeholders (see [`ENABLE`]) filled in.
fn render(template: &str, config: &PostgresConfig) -> String {
    let (schema, table) = (&config.schema, &config.table);
    let function = |suffix: &str| format!("\"{schema}\".\"{}\"", index_name(table, suffix));
    [
        ("{table}", config.qualified_table()),
        ("{kept}", kept_table(config)),
        ("{count_fn}", function("count_fn")),
        ("{fold_fn}", function("fold_fn")),
        ("{insert_trigger}", index_name(table, "counts_ins")),
        ("{update_trigger}", index_name(table, "counts_upd")),
        ("{delete_trigger}", index_name(table, "counts_del")),
        ("{index}", index_name(table, "in_flight_idx")),
        ("{schema}", schema.clone()),
        ("{plus}", class_counts::<AdminSql>("")),
        ("{minus}", class_counts::<AdminSql>("-")),
        ("{sums}", sums::<AdminSql>()),
        ("{changed}", any_change()),
    ]
    .iter()
    .fold(template.to_owned(), |sql, (name, value)| {
        sql.replace(name, value)
    })
}

/// Whether `config`'s store keeps counts (its counts table exists), on `conn`.
async fn exists_on<'c, E>(conn: E, config: &PostgresConfig) -> Result<bool>
where
    E: sqlx::Executor<'c, Database = Postgres>,
{
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(kept_table(config))
        .fetch_one(conn)
        .await
        .map_err(backend)
}

/// Whether `store` keeps counts.
pub(crate) async fn kept(store: &PostgresStore) -> Result<bool> {
    exists_on(store.pool(), store.config()).await
}

/// Run `template` (after checking the counts table is `present`) under the migration lock
/// in one transaction; `Ok(false)` when the table's presence says there is nothing to do.
async fn change(
    pool: &PgPool,
    config: &PostgresConfig,
    present: bool,
    template: &str,
) -> Result<bool> {
    let mut tx: Transaction<'_, Postgres> = pool.begin().await.map_err(backend)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock_key(&config.schema))
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    if exists_on(&mut *tx, config).await? != present {
        return Ok(false);
    }
    execute(&mut tx, render(template, config)).await?;
    tx.commit().await.map_err(backend)?;
    Ok(true)
}

/// Start keeping counts: see the module's docs. Writers wait while the starting counts are
/// computed (the table is locked against writes for the transaction).
pub(crate) async fn enable(store: &PostgresStore) -> Result<bool> {
    change(store.pool(), store.config(), false, ENABLE).await
}

/// Stop keeping counts: drop what [`enable`] created.
pub(crate) async fn disable(store: &PostgresStore) -> Result<bool> {
    change(store.pool(), store.config(), true, DISABLE).await
}

/// The kept counts per consumer at `now` (at most `limit` consumers, in byte order), in one
/// statement; folds the rows of differences afterwards when there are many.
pub(crate) async fn read(
    store: &PostgresStore,
    now: Timestamp,
    limit: Option<usize>,
) -> Result<Vec<ConsumerCounts>> {
    let config = store.config();
    let sql = counts::read_sql::<AdminSql>(&kept_table(config), store.table(), "$1", limit);
    // Unnamed, so planned for this "now": a generic plan could not tell that few in-flight
    // rows are expired, and scan them all.
    let rows = sqlx::query(AssertSqlSafe(sql))
        .persistent(false)
        .bind(now.as_millis())
        .fetch_all(store.pool())
        .await
        .map_err(backend)?;
    let consumer =
        |row: &sqlx::postgres::PgRow| sqlx::Row::try_get(row, "consumer").map_err(backend);
    let (consumers, deltas) = read_rows::<Postgres>(&rows, now, consumer, backend)?;
    if needs_fold(deltas, consumers.len()) {
        let fold = format!(
            "SELECT \"{}\".\"{}\"()",
            config.schema,
            index_name(&config.table, "fold_fn")
        );
        sqlx::query(AssertSqlSafe(fold))
            .execute(store.pool())
            .await
            .map_err(backend)?;
    }
    Ok(consumers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled_in() {
        let config = PostgresConfig {
            schema: "s".into(),
            sql: dedup_sql::SqlSettings {
                table: "a".repeat(63),
                ..Default::default()
            },
            ..PostgresConfig::default()
        };
        for template in [ENABLE, DISABLE] {
            let sql = render(template, &config);
            assert!(!sql.contains(['{', '}']), "a placeholder left in:\n{sql}");
            assert!(sql.contains(&config.qualified_table()), "{sql}");
        }
    }
}
