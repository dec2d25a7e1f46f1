//! The schema: one table and one index for purge, created idempotently.

use dedup_core::Result;
use sqlx::{AssertSqlSafe, PgPool};

use crate::config::PostgresConfig;
use crate::error::backend;

/// PostgreSQL's identifier limit, in bytes (longer names are silently truncated, which
/// could make two of our index names collide).
const MAX_IDENTIFIER: usize = 63;

/// FNV-1a, 64 bits: a stable hash (unlike std's hasher, it never changes between Rust
/// releases), for names and lock keys that must be the same on every node and version.
fn fnv1a(bytes: &[u8]) -> u64 {
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

/// The DDL of the table and its indexes (idempotent: `IF NOT EXISTS`). Shown in the README.
pub(crate) fn ddl(config: &PostgresConfig) -> String {
    let table = config.qualified_table();
    let claimed_idx = index_name(&config.table, "claimed_idx");
    format!(
        r#"CREATE TABLE IF NOT EXISTS {table} (
    consumer     text    NOT NULL,
    message_id   text    NOT NULL,
    token        uuid,             -- the lease's token; once completed, the committing token
    fence        bigint  NOT NULL, -- +1 each time the key changes hands
    attempt      integer NOT NULL,
    claimed_at   bigint  NOT NULL, -- ms since the Unix epoch; set by claims only (purge index)
    expires_at   bigint,           -- ms since the Unix epoch; in flight only
    processed_at bigint,           -- ms since the Unix epoch; NULL while in flight
    outcome      bytea,
    fingerprint  text,
    PRIMARY KEY (consumer, message_id),
    CHECK (processed_at IS NOT NULL OR (token IS NOT NULL AND expires_at IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS "{claimed_idx}" ON {table} (claimed_at);
"#
    )
}

/// Create the schema (when missing), the table and its indexes, in one transaction under an
/// advisory lock per schema: `CREATE ... IF NOT EXISTS` alone can still fail when two nodes
/// race (a unique violation on the catalog), so concurrent migrators take turns instead.
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
    let mut ddl = String::new();
    if !schema_exists {
        ddl.push_str(&format!(
            "CREATE SCHEMA IF NOT EXISTS \"{}\";\n",
            config.schema
        ));
    }
    ddl.push_str(&self::ddl(config));
    // Safe to splice: the names were validated above (ASCII letters, digits, '_').
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    tx.commit().await.map_err(backend)
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
        let ddl = ddl(&PostgresConfig::default());
        assert!(
            readme.contains(&ddl),
            "README.md must show the DDL exactly as migrate() runs it:\n{ddl}"
        );
    }

    #[test]
    fn lock_keys_differ_per_schema() {
        assert_ne!(lock_key("public"), lock_key("other"));
        assert_eq!(lock_key("public"), lock_key("public"));
    }
}
