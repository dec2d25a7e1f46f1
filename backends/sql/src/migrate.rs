//! The migration runner: an append-only list of versioned migrations applied in order
//! under a lock, each table's version recorded in a versions table. The version decision
//! (which migrations run, what an unrecorded table is, what is too new) is written here
//! once; a backend supplies the lock, the versions table and the DDL ([`Migrations`]).

use std::ops::DerefMut;

use async_trait::async_trait;
use dedup_core::{Error, Result};
use sqlx::Database;

/// The connection a [`Migrations`]' statements run on.
pub type MigrationConn<M> = <<M as Migrations>::Db as Database>::Connection;

/// One table's migrations on one backend: the list, and how the backend locks, records
/// versions and runs DDL.
///
/// Migration `n` (1-based) brings a table from version `n - 1` to `n`; a missing table is
/// created by running them all, in order. Never edit a released migration: a new layout is
/// one more entry at the end.
#[async_trait]
pub trait Migrations: Sync {
    /// The sqlx database.
    type Db: Database;

    /// A connection holding the migration lock ([`lock`](Self::lock)).
    type Locked: DerefMut<Target = MigrationConn<Self>> + Send;

    /// Whether the required columns ([`RECORD_COLUMNS`] and
    /// [`more_required_columns`](Self::more_required_columns)) are compared ignoring ASCII
    /// case (MySQL's column names are case-insensitive, PostgreSQL's quoted ones are not).
    const CASE_INSENSITIVE_COLUMNS: bool;

    /// The table, as errors name it (quoted, qualified).
    fn table(&self) -> String;

    /// The migrations, in order, with the backend's placeholders.
    fn migrations(&self) -> &'static [&'static str];

    /// `migration` ready to run: its placeholders filled in for this table.
    fn render(&self, migration: &str) -> String;

    /// The columns this backend's every layout has had besides [`RECORD_COLUMNS`]: a table
    /// lacking one is someone else's. None by default.
    fn more_required_columns(&self) -> &'static [&'static str] {
        &[]
    }

    /// The version of an existing table without a recorded version, told by its
    /// `columns` (which include every required one).
    fn adopted_version(&self, columns: &[String]) -> i64;

    /// A connection holding the lock that makes concurrent migrators take turns.
    async fn lock(&self) -> Result<Self::Locked>;

    /// Under the lock, before reading the version: create the versions table (and what
    /// holds it) when missing.
    async fn prepare(&self, conn: &mut MigrationConn<Self>) -> Result<()>;

    /// The version recorded for the table, if any.
    async fn recorded_version(&self, conn: &mut MigrationConn<Self>) -> Result<Option<i64>>;

    /// For [`check`], writing nothing: the recorded version when the versions table
    /// exists and may be read, else `None` (the columns tell then).
    async fn readable_version(&self, conn: &mut MigrationConn<Self>) -> Result<Option<i64>>;

    /// The table's column names; empty when it does not exist.
    async fn columns(&self, conn: &mut MigrationConn<Self>) -> Result<Vec<String>>;

    /// Run one rendered migration.
    async fn apply(&self, conn: &mut MigrationConn<Self>, ddl: String) -> Result<()>;

    /// Record `version` as the table's.
    async fn record_version(&self, conn: &mut MigrationConn<Self>, version: i64) -> Result<()>;

    /// Under the same lock, after the table is current: what else migrates with it (the
    /// outbox's table). Nothing by default.
    async fn after(&self, _conn: &mut MigrationConn<Self>) -> Result<()> {
        Ok(())
    }

    /// Release the lock, ending the migration with `result` (commit it or not).
    async fn unlock(&self, locked: Self::Locked, result: Result<()>) -> Result<()>;
}

/// The columns every layout of a records table has had, on every sqlx backend: a table
/// lacking one is someone else's.
pub const RECORD_COLUMNS: [&str; 9] = [
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

/// The schema version this build creates and understands: the number of migrations.
pub fn current_version(migrations: &[&str]) -> i64 {
    i64::try_from(migrations.len()).unwrap_or(i64::MAX)
}

/// Create or upgrade the table under the backend's lock: the migrations after the table's
/// version run in order (a missing table, version 0, gets them all; an older one the ones it
/// lacks, its records kept); a table without a version row is adopted by its columns; a
/// newer one is refused with [`Error::SchemaTooNew`] and nothing changes.
pub async fn migrate<M: Migrations>(migrations: &M) -> Result<()> {
    let mut locked = migrations.lock().await?;
    let result = migrate_locked(migrations, &mut locked).await;
    migrations.unlock(locked, result).await
}

async fn migrate_locked<M: Migrations>(m: &M, conn: &mut MigrationConn<M>) -> Result<()> {
    m.prepare(conn).await?;
    let recorded = m.recorded_version(conn).await?;
    let found = match recorded {
        Some(version) => version,
        None => unrecorded_version(m, conn).await?,
    };
    for migration in pending(m.migrations(), found, &m.table())? {
        m.apply(conn, m.render(migration)).await?;
    }
    let current = current_version(m.migrations());
    if recorded != Some(current) {
        m.record_version(conn, current).await?;
    }
    m.after(conn).await
}

/// The migrations a document (a backend's README, which shows its schema) does not show
/// exactly as they run, each as `migration N:` and its DDL, `render` filling in the
/// placeholders for the default configuration. For the backends' tests that keep their
/// README true.
pub fn unshown(doc: &str, migrations: &[&str], render: impl Fn(&str) -> String) -> Vec<String> {
    migrations
        .iter()
        .enumerate()
        .map(|(i, migration)| (i + 1, render(migration)))
        .filter(|(_, ddl)| !doc.contains(ddl.as_str()))
        .map(|(n, ddl)| format!("migration {n}:\n{ddl}"))
        .collect()
}

/// What a store's `connect` does once its pool is open: `migrate` when the configuration
/// says so, else `check` (writing nothing); the error says which of the two failed.
pub async fn migrate_or_check(
    migrate: bool,
    run: impl Future<Output = Result<()>>,
    check: impl Future<Output = Result<()>>,
) -> Result<()> {
    if migrate {
        run.await.map_err(|e| e.during("migrating the schema"))
    } else {
        check.await.map_err(|e| e.during("checking the schema"))
    }
}

/// The migrations a table at version `found` still lacks; [`Error::SchemaTooNew`] for a
/// version this build does not know.
pub fn pending<'m>(
    migrations: &'m [&'static str],
    found: i64,
    table: &str,
) -> Result<&'m [&'static str]> {
    usize::try_from(found)
        .ok()
        .and_then(|done| migrations.get(done..))
        .ok_or_else(|| Error::SchemaTooNew {
            table: table.to_owned(),
            found,
            known: current_version(migrations),
        })
}

/// Check, writing nothing, that the table is at the current version: for stores opened
/// without migrating. A missing or older table is [`Error::SchemaNotMigrated`], a newer one
/// [`Error::SchemaTooNew`]. The version is read from the versions table when it exists and
/// may be read, else told by the table's columns.
pub async fn check<M: Migrations>(m: &M, conn: &mut MigrationConn<M>) -> Result<()> {
    let found = match m.readable_version(conn).await? {
        Some(version) => version,
        None => unrecorded_version(m, conn).await?,
    };
    expect_version(m.table(), found, current_version(m.migrations()))
}

/// `table` found at version `found` where this build expects `current`: a missing (0) or
/// older table is [`Error::SchemaNotMigrated`], a newer one [`Error::SchemaTooNew`].
pub fn expect_version(table: String, found: i64, current: i64) -> Result<()> {
    match found.cmp(&current) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Less => Err(Error::SchemaNotMigrated {
            table,
            found,
            expected: current,
        }),
        std::cmp::Ordering::Greater => Err(Error::SchemaTooNew {
            table,
            found,
            known: current,
        }),
    }
}

/// The version of a table without a recorded version: 0 when it does not exist, else told
/// by its columns ([`Migrations::adopted_version`]). A table that lacks a required column
/// is someone else's: refused, and nothing is changed.
async fn unrecorded_version<M: Migrations>(m: &M, conn: &mut MigrationConn<M>) -> Result<i64> {
    let columns = m.columns(conn).await?;
    if columns.is_empty() {
        return Ok(0);
    }
    let same = |have: &String, want: &str| {
        if M::CASE_INSENSITIVE_COLUMNS {
            have.eq_ignore_ascii_case(want)
        } else {
            have == want
        }
    };
    if let Some(missing) = RECORD_COLUMNS
        .iter()
        .chain(m.more_required_columns())
        .find(|c| !columns.iter().any(|have| same(have, c)))
    {
        return Err(Error::invalid(
            "table",
            format!(
                "{} exists but is not a dedup table (it has no column {missing}); configure \
                 another table name",
                m.table()
            ),
        ));
    }
    Ok(m.adopted_version(&columns))
}

#[cfg(test)]
mod tests {
    use super::*;

    const THREE: &[&str] = &["one", "two", "three"];

    #[test]
    fn unshown_names_each_migration_missing_from_the_doc() {
        let doc = "create one; and three";
        let render = |m: &str| format!("create {m}");
        assert_eq!(
            unshown(doc, THREE, render),
            ["migration 2:\ncreate two", "migration 3:\ncreate three"]
        );
        assert!(unshown("create one create two create three", THREE, render).is_empty());
    }

    #[test]
    fn pending_runs_what_the_table_lacks() {
        assert_eq!(pending(THREE, 0, "t").unwrap(), THREE);
        assert_eq!(pending(THREE, 2, "t").unwrap(), &["three"]);
        assert!(pending(THREE, 3, "t").unwrap().is_empty());
        assert_eq!(current_version(THREE), 3);
    }

    #[test]
    fn a_table_is_expected_at_the_current_version() {
        assert!(expect_version("t".into(), 3, 3).is_ok());
        assert!(matches!(
            expect_version("t".into(), 0, 3),
            Err(Error::SchemaNotMigrated {
                found: 0,
                expected: 3,
                ..
            })
        ));
        assert!(matches!(
            expect_version("t".into(), 4, 3),
            Err(Error::SchemaTooNew {
                found: 4,
                known: 3,
                ..
            })
        ));
    }

    #[test]
    fn a_newer_or_negative_version_is_refused() {
        for found in [4, -1] {
            match pending(THREE, found, "\"s\".\"t\"") {
                Err(Error::SchemaTooNew {
                    table,
                    found: f,
                    known,
                }) => {
                    assert_eq!((table.as_str(), f, known), ("\"s\".\"t\"", found, 3));
                }
                other => panic!("{found}: {other:?}"),
            }
        }
    }
}
