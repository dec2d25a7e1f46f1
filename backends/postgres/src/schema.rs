//! The schema: one table and one index for purge, as an append-only list of versioned
//! migrations applied in order under a per-schema advisory lock, each table's version
//! recorded beside it in `dedup_schema_versions`. The runner and the version decision are
//! [`dedup_sql::migrate`]'s; this file supplies PostgreSQL's lock, versions table and DDL.

use async_trait::async_trait;
use dedup_core::Result;
use dedup_sql::migrate::Migrations;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use crate::config::PostgresConfig;
use crate::ddl::{
    VERSIONS_TABLE, execute, fnv1a, record_version_of, recorded_version_of, render_table,
    versions_ddl,
};
use crate::error::backend;

/// The advisory lock key that serialises migrations of one schema across nodes.
pub(crate) fn lock_key(schema: &str) -> i64 {
    i64::from_ne_bytes(fnv1a(format!("dedup-postgres migrate {schema}").as_bytes()).to_ne_bytes())
}

/// Migration `n` (1-based) brings a table from version `n - 1` to `n`; a missing table is
/// created by running them all, in order. Never edit a released migration: a new layout is
/// one more entry at the end. The README shows them as
/// [`PostgresStore::migrate`](crate::PostgresStore::migrate) runs them for the default config.
///
/// Placeholders, filled in by [`render_table`]: `{table}` the quoted, schema-qualified
/// table, `{schema}` the schema's name, `{<name>_idx}` an index name.
const MIGRATIONS: &[&str] = &[
    // 1: the first release's layout: the records table and two partial purge indexes.
    r#"CREATE TABLE IF NOT EXISTS {table} (
    consumer     text    NOT NULL,
    message_id   text    NOT NULL,
    token        uuid,             -- the lease's token; once completed, the committing token
    fence        bigint  NOT NULL, -- +1 each time the key changes hands
    attempt      integer NOT NULL,
    expires_at   bigint,           -- ms since the Unix epoch; in flight only
    processed_at bigint,           -- ms since the Unix epoch; NULL while in flight
    outcome      bytea,
    fingerprint  text,
    PRIMARY KEY (consumer, message_id),
    CHECK (processed_at IS NOT NULL OR (token IS NOT NULL AND expires_at IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS "{completed_idx}"
    ON {table} (processed_at) WHERE processed_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS "{expiring_idx}"
    ON {table} (expires_at) WHERE processed_at IS NULL;
"#,
    // 2: one purge index instead of two, on `claimed_at` (ms since the Unix epoch; set by
    // claims only), backfilled with the earliest time the row carries so purge's
    // `claimed_at < cutoff` bound never skips a purgeable row. Commit, renew and release no
    // longer change an indexed column (HOT updates).
    r#"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS claimed_at bigint;
UPDATE {table} SET claimed_at = LEAST(expires_at, processed_at) WHERE claimed_at IS NULL;
ALTER TABLE {table} ALTER COLUMN claimed_at SET NOT NULL;
CREATE INDEX IF NOT EXISTS "{claimed_idx}" ON {table} (claimed_at);
DROP INDEX IF EXISTS "{schema}"."{completed_idx}";
DROP INDEX IF EXISTS "{schema}"."{expiring_idx}";
"#,
    // 3: when the key was first claimed (`Record::first_claimed_at`, ms since the Unix
    // epoch); NULL for older rows. Written by takeovers only: a key claimed once reads
    // its first claim from `claimed_at` (see `statements::first_claim`).
    r#"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS first_claimed_at bigint;
"#,
    // 4: the latest released failure's cause (`Record::last_failure`: the encoded
    // `dedup_core::Failure`, at most 4 KiB), written by `release_failed` only; NULL for
    // older rows.
    r#"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS last_failure bytea;
"#,
    // 5: the last purge run of each records table in the schema (`Admin::last_purge`), one
    // row per table, replaced by every purge that finishes; a table created anew starts
    // without one (a row left by a dropped table of that name is removed).
    r#"CREATE TABLE IF NOT EXISTS "{schema}".dedup_purge_runs (
    table_name    text    PRIMARY KEY,  -- a records table in this schema
    finished_at   bigint  NOT NULL,     -- ms since the Unix epoch, by the store's clock
    removed       bigint  NOT NULL,
    took_ms       bigint  NOT NULL,
    stopped_early boolean NOT NULL
);
DELETE FROM "{schema}".dedup_purge_runs WHERE table_name = '{table_name}';
"#,
];

/// `migration` for `config`'s table, its placeholders (see [`MIGRATIONS`]) filled in.
fn render(migration: &str, config: &PostgresConfig) -> String {
    render_table(migration, &config.schema, &config.table)
}

/// The records table's migrations on PostgreSQL (run by [`dedup_sql::store::migrate`] and
/// [`dedup_sql::store::check`]): the table (then the outbox's) created or upgraded in one
/// transaction under an advisory lock per schema. `CREATE ... IF NOT EXISTS` alone can
/// still fail when two nodes race (a unique violation on the catalog), so concurrent
/// migrators take turns instead. The table's version is kept in
/// `"schema".dedup_schema_versions`; a table without a version row is adopted as version 1
/// or 2 by its columns (tables created before versions were recorded).
pub struct Inbox<'a> {
    pool: &'a PgPool,
    config: &'a PostgresConfig,
}

impl<'a> Inbox<'a> {
    /// The migrations of `config`'s table (validated) over `pool`.
    pub(crate) fn new(pool: &'a PgPool, config: &'a PostgresConfig) -> Self {
        Inbox { pool, config }
    }
}

#[async_trait]
impl Migrations for Inbox<'_> {
    type Db = Postgres;
    type Locked = Transaction<'static, Postgres>;
    const CASE_INSENSITIVE_COLUMNS: bool = false;

    fn table(&self) -> String {
        self.config.qualified_table()
    }

    fn migrations(&self) -> &'static [&'static str] {
        match self.config.partitions {
            Some(_) => crate::ring::schema::MIGRATIONS,
            None => MIGRATIONS,
        }
    }

    fn render(&self, migration: &str) -> String {
        match &self.config.partitions {
            Some(partitions) => crate::ring::schema::render(migration, self.config, partitions),
            None => render(migration, self.config),
        }
    }

    /// Version 2 added `claimed_at`.
    fn adopted_version(&self, columns: &[String]) -> i64 {
        if columns.iter().any(|c| c == "claimed_at") {
            2
        } else {
            1
        }
    }

    async fn lock(&self) -> Result<Self::Locked> {
        let mut tx = self.pool.begin().await.map_err(backend)?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(lock_key(&self.config.schema))
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        Ok(tx)
    }

    async fn prepare(&self, tx: &mut PgConnection) -> Result<()> {
        let schema = &self.config.schema;
        // CREATE SCHEMA IF NOT EXISTS checks the CREATE privilege on the database even
        // when the schema exists: skip it for existing schemas so a restricted role can
        // migrate.
        let schema_exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(schema)
                .fetch_one(&mut *tx)
                .await
                .map_err(backend)?;
        let mut setup = String::new();
        if !schema_exists {
            setup.push_str(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\";\n"));
        }
        setup.push_str(&versions_ddl(schema));
        execute(tx, setup).await
    }

    async fn recorded_version(&self, tx: &mut PgConnection) -> Result<Option<i64>> {
        crate::ring::schema::check_layout(tx, self.config).await?;
        recorded_version_of(tx, &self.config.schema, &self.config.table).await
    }

    async fn readable_version(&self, conn: &mut PgConnection) -> Result<Option<i64>> {
        let versions_readable: Option<bool> = sqlx::query_scalar(
            "SELECT has_table_privilege(c.oid, 'SELECT') FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
        )
        .bind(&self.config.schema)
        .bind(VERSIONS_TABLE)
        .fetch_optional(&mut *conn)
        .await
        .map_err(backend)?;
        crate::ring::schema::check_layout(conn, self.config).await?;
        match versions_readable {
            Some(true) => self.recorded_version(conn).await,
            _ => Ok(None),
        }
    }

    async fn columns(&self, tx: &mut PgConnection) -> Result<Vec<String>> {
        sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name = $2",
        )
        .bind(&self.config.schema)
        .bind(&self.config.table)
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)
    }

    async fn apply(&self, tx: &mut PgConnection, ddl: String) -> Result<()> {
        execute(tx, ddl).await
    }

    async fn record_version(&self, tx: &mut PgConnection, version: i64) -> Result<()> {
        record_version_of(tx, &self.config.schema, &self.config.table, version).await
    }

    /// One entry point for both tables: the outbox's, under the same lock.
    async fn after(&self, tx: &mut PgConnection) -> Result<()> {
        crate::outbox_schema::migrate_in(tx, self.config).await
    }

    async fn unlock(&self, tx: Self::Locked, result: Result<()>) -> Result<()> {
        result?;
        tx.commit().await.map_err(backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ddl::index_name;

    #[test]
    fn readme_shows_the_schema() {
        let config = PostgresConfig::default();
        let rendered = |m: &str| render(m, &config);
        let unshown =
            dedup_sql::migrate::unshown(include_str!("../README.md"), MIGRATIONS, rendered);
        assert!(
            unshown.is_empty(),
            "README.md must show every migration exactly as migrate() runs it:\n{}",
            unshown.join("\n")
        );
    }

    #[test]
    fn migrations_render_every_placeholder() {
        let config = PostgresConfig {
            schema: "s".into(),
            sql: dedup_sql::SqlSettings {
                table: "a".repeat(63),
                ..Default::default()
            },
            ..PostgresConfig::default()
        };
        for migration in MIGRATIONS {
            let sql = render(migration, &config);
            assert!(!sql.contains(['{', '}']), "a placeholder left in:\n{sql}");
            // Every migration changes the table, or (5) the purge runs kept for it.
            let purge_runs = format!("'{}'", config.table);
            assert!(
                sql.contains(&config.qualified_table()) || sql.contains(&purge_runs),
                "{sql}"
            );
        }
        let v2 = render(MIGRATIONS[1], &config);
        assert!(
            v2.contains(&format!(
                "\"s\".\"{}\"",
                index_name(&config.table, "completed_idx")
            )),
            "{v2}"
        );
        assert!(
            v2.contains(&index_name(&config.table, "claimed_idx")),
            "{v2}"
        );
    }

    #[test]
    fn lock_keys_differ_per_schema() {
        assert_ne!(lock_key("public"), lock_key("other"));
        assert_eq!(lock_key("public"), lock_key("public"));
    }
}
