//! The schema: one table and one index for purge, as an append-only list of versioned
//! migrations applied in order under a per-schema advisory lock, each table's version
//! recorded beside it in `dedup_schema_versions`.

use dedup_core::{Error, Result};
use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use crate::config::PostgresConfig;
use crate::error::backend;

/// PostgreSQL's identifier limit, in bytes (longer names are silently truncated, which
/// could make two of our index names collide).
const MAX_IDENTIFIER: usize = 63;

/// FNV-1a, 64 bits: a stable hash (unlike std's hasher, it never changes between Rust
/// releases), for names and lock keys that must be the same on every node and version.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The advisory lock key that serialises migrations of one schema across nodes.
fn lock_key(schema: &str) -> i64 {
    i64::from_ne_bytes(fnv1a(format!("dedup-postgres migrate {schema}").as_bytes()).to_ne_bytes())
}

/// `<table>_<suffix>`, or, when that is longer than PostgreSQL allows, a truncated table
/// name plus a hash of the full one (so different long tables never share index names).
pub(crate) fn index_name(table: &str, suffix: &str) -> String {
    let name = format!("{table}_{suffix}");
    if name.len() <= MAX_IDENTIFIER {
        return name;
    }
    let hash = format!("{:016x}", fnv1a(table.as_bytes()));
    // Tables are ASCII (validated), so byte slicing is safe.
    let keep = MAX_IDENTIFIER - hash.len() - suffix.len() - 2;
    format!("{}_{hash}_{suffix}", &table[..keep])
}

/// Migration `n` (1-based) brings a table from version `n - 1` to `n`; a missing table is
/// created by running them all, in order. Never edit a released migration: a new layout is
/// one more entry at the end. The README shows them as [`migrate`] runs them for the default
/// config.
///
/// Placeholders, filled in by [`render`]: `{table}` the quoted, schema-qualified table,
/// `{schema}` the schema's name, `{<name>_idx}` the index name
/// [`index_name`]`(table, "<name>_idx")`.
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
    // epoch), written by the inserting claim and never updated; NULL for older rows.
    r#"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS first_claimed_at bigint;
"#,
    // 4: the latest released failure's cause (`Record::last_failure`: the encoded
    // `dedup_core::Failure`, at most 4 KiB), written by `release_failed` only; NULL for
    // older rows.
    r#"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS last_failure bytea;
"#,
];

/// The schema version this build creates and understands: the number of [`MIGRATIONS`].
pub(crate) const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

/// `migration` for `config`'s table, its placeholders (see [`MIGRATIONS`]) filled in. An
/// unknown placeholder is left as it is (a unit test checks there is none).
fn render(migration: &str, config: &PostgresConfig) -> String {
    render_table(migration, &config.schema, &config.table)
}

/// [`render`] for any of the store's tables: `table` in `schema`.
pub(crate) fn render_table(migration: &str, schema: &str, table: &str) -> String {
    let qualified = format!("\"{schema}\".\"{table}\"");
    let mut out = String::with_capacity(migration.len() + 64);
    let mut rest = migration;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(len) = rest[open..].find('}') else {
            break;
        };
        let placeholder = &rest[open..=open + len];
        match &placeholder[1..len] {
            "table" => out.push_str(&qualified),
            "schema" => out.push_str(schema),
            index if index.ends_with("_idx") => out.push_str(&index_name(table, index)),
            _ => out.push_str(placeholder),
        }
        rest = &rest[open + len + 1..];
    }
    out.push_str(rest);
    out
}

/// The table recording each store table's schema version, one per PostgreSQL schema.
pub const VERSIONS_TABLE: &str = "dedup_schema_versions";

/// The DDL of the versions table (idempotent).
fn versions_ddl(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{schema}\".{VERSIONS_TABLE} (\n    \
         table_name text PRIMARY KEY,\n    \
         version    integer NOT NULL\n);\n"
    )
}

/// Create or upgrade the store's table, in one transaction under an advisory lock per
/// schema: `CREATE ... IF NOT EXISTS` alone can still fail when two nodes race (a unique
/// violation on the catalog), so concurrent migrators take turns instead.
///
/// The table's version is kept in `"schema".dedup_schema_versions`. The [`MIGRATIONS`]
/// after the table's version run in order: a missing table (version 0) gets them all, an
/// older one the ones it lacks, its records kept; a table without a version row is adopted
/// as version 1 or 2 by its columns (tables created before versions were recorded); a newer
/// one is refused with [`Error::SchemaTooNew`] and nothing changes.
pub(crate) async fn migrate(pool: &PgPool, config: &PostgresConfig) -> Result<()> {
    config.validate()?;
    let mut tx = pool.begin().await.map_err(backend)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock_key(&config.schema))
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    // CREATE SCHEMA IF NOT EXISTS checks the CREATE privilege on the database even when
    // the schema exists: skip it for existing schemas so a restricted role can migrate.
    let schema_exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(&config.schema)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
    let mut setup = String::new();
    if !schema_exists {
        setup.push_str(&format!(
            "CREATE SCHEMA IF NOT EXISTS \"{}\";\n",
            config.schema
        ));
    }
    setup.push_str(&versions_ddl(&config.schema));
    execute(&mut tx, setup).await?;

    let recorded = recorded_version(&mut tx, config).await?;
    let found = match recorded {
        Some(version) => version,
        None => unrecorded_version(&mut tx, config).await?,
    };
    let pending = usize::try_from(found)
        .ok()
        .and_then(|done| MIGRATIONS.get(done..))
        .ok_or_else(|| Error::SchemaTooNew {
            table: config.qualified_table(),
            found,
            known: CURRENT_VERSION,
        })?;
    for migration in pending {
        execute(&mut tx, render(migration, config)).await?;
    }
    if recorded != Some(CURRENT_VERSION) {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{}\".{VERSIONS_TABLE} (table_name, version) VALUES ($1, $2) \
             ON CONFLICT (table_name) DO UPDATE SET version = excluded.version",
            config.schema
        )))
        .bind(&config.table)
        .bind(i32::try_from(CURRENT_VERSION).unwrap_or(i32::MAX))
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    }
    // One entry point for both tables: the outbox's, under the same lock.
    crate::outbox_schema::migrate_in(&mut tx, config).await?;
    tx.commit().await.map_err(backend)
}

/// Check, writing nothing, that the store's table is at [`CURRENT_VERSION`]: for stores
/// opened without migrating. A missing or older table is [`Error::SchemaNotMigrated`], a
/// newer one [`Error::SchemaTooNew`]. The version is read from the versions table when it
/// exists and the role may read it, else told by the table's columns.
pub(crate) async fn check(pool: &PgPool, config: &PostgresConfig) -> Result<()> {
    let mut conn = pool.acquire().await.map_err(backend)?;
    let versions_readable: Option<bool> = sqlx::query_scalar(
        "SELECT has_table_privilege(c.oid, 'SELECT') FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2",
    )
    .bind(&config.schema)
    .bind(VERSIONS_TABLE)
    .fetch_optional(&mut *conn)
    .await
    .map_err(backend)?;
    let recorded = match versions_readable {
        Some(true) => recorded_version(&mut conn, config).await?,
        _ => None,
    };
    let found = match recorded {
        Some(version) => version,
        None => unrecorded_version(&mut conn, config).await?,
    };
    match found.cmp(&CURRENT_VERSION) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Less => Err(Error::SchemaNotMigrated {
            table: config.qualified_table(),
            found,
            expected: CURRENT_VERSION,
        }),
        std::cmp::Ordering::Greater => Err(Error::SchemaTooNew {
            table: config.qualified_table(),
            found,
            known: CURRENT_VERSION,
        }),
    }
}

/// Run DDL whose names were validated (ASCII letters, digits, '_'), so safe to splice.
pub(crate) async fn execute(tx: &mut PgConnection, ddl: String) -> Result<()> {
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    Ok(())
}

/// The version recorded for the store's table, if any.
async fn recorded_version(tx: &mut PgConnection, config: &PostgresConfig) -> Result<Option<i64>> {
    recorded_version_of(tx, &config.schema, &config.table).await
}

/// The version recorded for `table` in `schema`, if any.
pub(crate) async fn recorded_version_of(
    tx: &mut PgConnection,
    schema: &str,
    table: &str,
) -> Result<Option<i64>> {
    let version: Option<i32> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM \"{}\".{VERSIONS_TABLE} WHERE table_name = $1",
        schema
    )))
    .bind(table)
    .fetch_optional(&mut *tx)
    .await
    .map_err(backend)?;
    Ok(version.map(i64::from))
}

/// The columns every dedup-postgres layout has had (version 1 and later).
const V1_COLUMNS: [&str; 9] = [
    "consumer",
    "message_id",
    "token",
    "fence",
    "attempt",
    "expires_at",
    "processed_at",
    "outcome",
    "fingerprint",
];

/// The version of a table without a recorded version: 0 when it does not exist, else
/// told by its columns (version 2 added `claimed_at`). A table that lacks the columns of
/// every layout is someone else's: refused, and nothing is changed.
async fn unrecorded_version(tx: &mut PgConnection, config: &PostgresConfig) -> Result<i64> {
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns \
         WHERE table_schema = $1 AND table_name = $2",
    )
    .bind(&config.schema)
    .bind(&config.table)
    .fetch_all(&mut *tx)
    .await
    .map_err(backend)?;
    if columns.is_empty() {
        return Ok(0);
    }
    if let Some(missing) = V1_COLUMNS
        .iter()
        .find(|c| !columns.iter().any(|have| have == *c))
    {
        return Err(Error::invalid(
            "table",
            format!(
                "{} exists but is not a dedup table (it has no column {missing}); configure \
                 another table name",
                config.qualified_table()
            ),
        ));
    }
    Ok(if columns.iter().any(|c| c == "claimed_at") {
        2
    } else {
        1
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_names_fit_and_stay_distinct() {
        assert_eq!(
            index_name("dedup_inbox", "claimed_idx"),
            "dedup_inbox_claimed_idx"
        );
        let a = "a".repeat(63);
        let b = format!("{}b", "a".repeat(62));
        for suffix in ["claimed_idx", "pkey"] {
            let (na, nb) = (index_name(&a, suffix), index_name(&b, suffix));
            assert!(na.len() <= MAX_IDENTIFIER && nb.len() <= MAX_IDENTIFIER);
            assert_ne!(na, nb);
            assert!(na.ends_with(suffix));
        }
        assert_ne!(index_name(&a, "claimed_idx"), index_name(&a, "pkey"));
    }

    #[test]
    fn readme_shows_the_schema() {
        let readme = include_str!("../README.md");
        for (n, migration) in MIGRATIONS.iter().enumerate() {
            let ddl = render(migration, &PostgresConfig::default());
            assert!(
                readme.contains(&ddl),
                "README.md must show migration {} exactly as migrate() runs it:\n{ddl}",
                n + 1
            );
        }
    }

    #[test]
    fn migrations_render_every_placeholder() {
        let config = PostgresConfig {
            schema: "s".into(),
            table: "a".repeat(63),
            ..PostgresConfig::default()
        };
        for migration in MIGRATIONS {
            let sql = render(migration, &config);
            assert!(!sql.contains(['{', '}']), "a placeholder left in:\n{sql}");
            assert!(sql.contains(&config.qualified_table()), "{sql}");
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
