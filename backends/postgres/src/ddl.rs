//! What both tables' migrations use (the records table's in [`crate::schema`], the
//! outbox's in `outbox_schema`): stable names, placeholder rendering, the versions table
//! and running DDL.

use dedup_core::Result;
use dedup_sql::SqlDb;
use sqlx::{AssertSqlSafe, PgConnection, Postgres};

use crate::error::backend;

/// PostgreSQL's identifier limit, in bytes (longer names are silently truncated, which
/// could make two of our index names collide).
pub(crate) const MAX_IDENTIFIER: usize = 63;

/// The table recording each store table's schema version, one per PostgreSQL schema.
pub const VERSIONS_TABLE: &str = "dedup_schema_versions";

/// FNV-1a, 64 bits: a stable hash (unlike std's hasher, it never changes between Rust
/// releases), for names and lock keys that must be the same on every node and version.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
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

/// A migration for `table` in `schema`, its placeholders filled in: `{table}` the quoted,
/// schema-qualified table, `{table_name}` the table's bare name (validated: letters, digits
/// and `_`, so safe inside a string literal), `{schema}` the schema's name, `{<name>_idx}` the index name
/// [`index_name`]`(table, "<name>_idx")`. An unknown placeholder is left as it is (unit
/// tests check there is none).
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
            "table_name" => out.push_str(table),
            "schema" => out.push_str(schema),
            index if index.ends_with("_idx") => out.push_str(&index_name(table, index)),
            _ => out.push_str(placeholder),
        }
        rest = &rest[open + len + 1..];
    }
    out.push_str(rest);
    out
}

/// The DDL of the versions table (idempotent).
pub(crate) fn versions_ddl(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{schema}\".{VERSIONS_TABLE} (\n    \
         table_name text PRIMARY KEY,\n    \
         version    integer NOT NULL\n);\n"
    )
}

/// Run DDL whose names were validated (ASCII letters, digits, '_'), so safe to splice.
pub(crate) async fn execute(tx: &mut PgConnection, ddl: String) -> Result<()> {
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    Ok(())
}

/// The version recorded for `table` in `schema`, if any.
pub(crate) async fn recorded_version_of(
    tx: &mut PgConnection,
    schema: &str,
    table: &str,
) -> Result<Option<i64>> {
    let read = format!("SELECT version FROM \"{schema}\".{VERSIONS_TABLE} WHERE table_name = $1");
    Postgres::read_version(tx, read, table)
        .await
        .map_err(backend)
}

/// Record `version` as the version of `table` in `schema`'s versions table.
pub(crate) async fn record_version_of(
    tx: &mut PgConnection,
    schema: &str,
    table: &str,
    version: i64,
) -> Result<()> {
    let write = format!(
        "INSERT INTO \"{schema}\".{VERSIONS_TABLE} (table_name, version) VALUES ($1, $2) \
         ON CONFLICT (table_name) DO UPDATE SET version = excluded.version"
    );
    Postgres::write_version(tx, write, table, version)
        .await
        .map_err(backend)
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
}
