//! The kit's stores on SQLite, PostgreSQL and MySQL / MariaDB
//! ([`Setup::sqlite`](crate::Setup::sqlite), [`Setup::postgres`](crate::Setup::postgres),
//! [`Setup::mysql`](crate::Setup::mysql)): opened on the kit's tables and clock, with a
//! cleanup that drops every table the store created (and their rows in the schema
//! versions table and the purge runs table) after the run.
//!
//! On SQLite and PostgreSQL the versions table itself is dropped only when the kit
//! created it: right after the store opened it held no row but the kit's two, and it is
//! empty once they are gone. The purge runs table (created by the same migrations) goes
//! with it, when no other table's last purge is kept in it. On MySQL / MariaDB both stay.

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use dedup_core::Error;
    use dedup_sqlite::rusqlite::{self, Connection, OptionalExtension, params};
    use dedup_sqlite::{PURGE_RUNS_TABLE, SCHEMA_VERSIONS_TABLE, SqliteConfig, SqliteStore};

    use crate::Setup;

    impl Setup {
        /// Open the SQLite database at `path` (your service's file, or a copy) with
        /// `config`, on the kit's tables and clock: `config.table`, `config.outbox_table`
        /// and `config.clock` are replaced, the rest is kept. Unless the tables are
        /// [named](crate::Kit::named_tables), they are dropped after the run.
        #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
        pub async fn sqlite(
            &self,
            path: impl AsRef<Path>,
            config: SqliteConfig,
        ) -> Result<SqliteStore, Error> {
            let path = path.as_ref().to_path_buf();
            let (inbox, outbox) = (
                self.inbox_table().to_owned(),
                self.outbox_table().to_owned(),
            );
            let store = SqliteStore::open_with(
                &path,
                SqliteConfig {
                    table: inbox.clone(),
                    outbox_table: Some(outbox.clone()),
                    clock: Some(self.clock()),
                    ..config
                },
            )
            .await?;
            if self.owns_tables() {
                let read = versions_table_is_ours(&path, &inbox, &outbox);
                let ours = *read.as_ref().unwrap_or(&false);
                self.on_cleanup(move || async move {
                    if let Err(e) = drop_tables(&path, &inbox, &outbox, ours) {
                        eprintln!(
                            "dedup-testkit: could not drop the kit's tables {inbox:?} and {outbox:?} in {}: {e}; drop them by hand",
                            path.display()
                        );
                    }
                });
                read.map_err(|e| {
                    Error::backend("sqlite", false, e).during("reading the schema versions")
                })?;
            }
            Ok(store)
        }
    }

    fn connect(path: &PathBuf) -> rusqlite::Result<Connection> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(10))?;
        Ok(conn)
    }

    /// Whether the versions table holds no row but the kit's (so the kit created it).
    fn versions_table_is_ours(path: &PathBuf, inbox: &str, outbox: &str) -> rusqlite::Result<bool> {
        let others: i64 = connect(path)?.query_row(
            &format!(
                "SELECT count(*) FROM \"{SCHEMA_VERSIONS_TABLE}\" WHERE table_name NOT IN (?1, ?2)"
            ),
            params![inbox, outbox],
            |r| r.get(0),
        )?;
        Ok(others == 0)
    }

    fn drop_tables(
        path: &PathBuf,
        inbox: &str,
        outbox: &str,
        versions_ours: bool,
    ) -> rusqlite::Result<()> {
        let mut conn = connect(path)?;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch(&format!(
            "DROP TABLE IF EXISTS \"{inbox}\"; DROP TABLE IF EXISTS \"{outbox}\";"
        ))?;
        // The purge runs table goes only with the versions table (the same migrations made
        // both): another store that recorded its version meanwhile needs it.
        let dropped = forget(&tx, SCHEMA_VERSIONS_TABLE, inbox, outbox, versions_ours)?;
        forget(&tx, PURGE_RUNS_TABLE, inbox, outbox, dropped)?;
        tx.commit()
    }

    /// Delete the rows of `inbox` and `outbox` from the shared `table` (when it exists), and
    /// drop it if `drop_if_empty` and no row is left. Whether it was dropped.
    fn forget(
        tx: &Connection,
        table: &str,
        inbox: &str,
        outbox: &str,
        drop_if_empty: bool,
    ) -> rusqlite::Result<bool> {
        let exists: Option<i64> = tx
            .query_row(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get(0),
            )
            .optional()?;
        if exists.is_none() {
            return Ok(false);
        }
        tx.execute(
            &format!("DELETE FROM \"{table}\" WHERE table_name IN (?1, ?2)"),
            params![inbox, outbox],
        )?;
        let left: i64 = tx.query_row(&format!("SELECT count(*) FROM \"{table}\""), [], |r| {
            r.get(0)
        })?;
        if drop_if_empty && left == 0 {
            tx.execute_batch(&format!("DROP TABLE \"{table}\""))?;
            return Ok(true);
        }
        Ok(false)
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use dedup_core::Error;
    use dedup_postgres::sqlx::{self, AssertSqlSafe, PgConnection, PgPool};
    use dedup_postgres::{
        PURGE_RUNS_TABLE, PostgresConfig, PostgresStore, SCHEMA_VERSIONS_TABLE, SqlSettings,
    };

    use crate::Setup;

    impl Setup {
        /// Connect to the PostgreSQL database at `url` (your service's, or a copy) with
        /// `config`, on the kit's tables (in `config.schema`) and clock: `config.table`,
        /// `config.outbox_table` and `config.clock` are replaced, the rest is kept. Unless
        /// the tables are [named](crate::Kit::named_tables), they are dropped after the run.
        #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
        pub async fn postgres(
            &self,
            url: &str,
            config: PostgresConfig,
        ) -> Result<PostgresStore, Error> {
            let (inbox, outbox) = (
                self.inbox_table().to_owned(),
                self.outbox_table().to_owned(),
            );
            let store = PostgresStore::connect_with(
                url,
                PostgresConfig {
                    sql: SqlSettings {
                        table: inbox.clone(),
                        outbox_table: Some(outbox.clone()),
                        clock: Some(self.clock()),
                        ..config.sql
                    },
                    ..config
                },
            )
            .await?;
            if self.owns_tables() {
                let pool = store.pool().clone();
                let schema = store.config().schema.clone();
                let read = versions_table_is_ours(&pool, &schema, &inbox, &outbox).await;
                let ours = *read.as_ref().unwrap_or(&false);
                self.on_cleanup(move || async move {
                    if let Err(e) = drop_tables(&pool, &schema, &inbox, &outbox, ours).await {
                        eprintln!(
                            "dedup-testkit: could not drop the kit's tables \"{schema}\".{inbox:?} and {outbox:?}: {e}; drop them by hand"
                        );
                    }
                    pool.close().await;
                });
                read.map_err(|e| {
                    Error::backend("postgres", false, e).during("reading the schema versions")
                })?;
            }
            Ok(store)
        }
    }

    /// Whether the versions table holds no row but the kit's (so the kit created it).
    async fn versions_table_is_ours(
        pool: &PgPool,
        schema: &str,
        inbox: &str,
        outbox: &str,
    ) -> Result<bool, sqlx::Error> {
        let others: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{schema}\".{SCHEMA_VERSIONS_TABLE} WHERE table_name NOT IN ($1, $2)"
        )))
        .bind(inbox)
        .bind(outbox)
        .fetch_one(pool)
        .await?;
        Ok(others == 0)
    }

    async fn drop_tables(
        pool: &PgPool,
        schema: &str,
        inbox: &str,
        outbox: &str,
        versions_ours: bool,
    ) -> Result<(), sqlx::Error> {
        let versions = format!("\"{schema}\".{SCHEMA_VERSIONS_TABLE}");
        let runs = format!("\"{schema}\".{PURGE_RUNS_TABLE}");
        let mut tx = pool.begin().await?;
        sqlx::query(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS \"{schema}\".\"{inbox}\", \"{schema}\".\"{outbox}\""
        )))
        .execute(&mut *tx)
        .await?;
        // The purge runs table goes only with the versions table (the same migrations made
        // both): another store that recorded its version meanwhile needs it.
        let dropped = forget(&mut tx, &versions, inbox, outbox, versions_ours).await?;
        forget(&mut tx, &runs, inbox, outbox, dropped).await?;
        tx.commit().await
    }

    /// Delete the rows of `inbox` and `outbox` from the shared `table` (schema-qualified),
    /// and drop it if `drop_if_empty` and no row is left. Whether it was dropped.
    async fn forget(
        tx: &mut PgConnection,
        table: &str,
        inbox: &str,
        outbox: &str,
        drop_if_empty: bool,
    ) -> Result<bool, sqlx::Error> {
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE table_name IN ($1, $2)"
        )))
        .bind(inbox)
        .bind(outbox)
        .execute(&mut *tx)
        .await?;
        if !drop_if_empty {
            return Ok(false);
        }
        // Under the lock, no other node records a table between the count and the drop.
        sqlx::query(AssertSqlSafe(format!(
            "LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
        )))
        .execute(&mut *tx)
        .await?;
        let left: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(&mut *tx)
            .await?;
        if left > 0 {
            return Ok(false);
        }
        sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(&mut *tx)
            .await?;
        Ok(true)
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use dedup_core::Error;
    use dedup_mysql::sqlx::{self, AssertSqlSafe, MySqlPool};
    use dedup_mysql::{
        MySqlConfig, MySqlStore, PURGE_RUNS_TABLE, SCHEMA_VERSIONS_TABLE, SqlSettings,
    };

    use crate::Setup;

    impl Setup {
        /// Connect to the MySQL / MariaDB database at `url` (your service's, or a copy)
        /// with `config`, on the kit's tables and clock: `config.table`,
        /// `config.outbox_table` and `config.clock` are replaced, the rest is kept. Unless
        /// the tables are [named](crate::Kit::named_tables), every table the store created
        /// (its records, its outbox and the outbox's ordering keys:
        /// [`MySqlConfig::table_names`]) and their rows in the versions and purge runs
        /// tables are dropped after the run. Those two tables stay: MySQL commits DDL at
        /// once, so dropping them could race another node's migration recording its row.
        pub async fn mysql(&self, url: &str, config: MySqlConfig) -> Result<MySqlStore, Error> {
            let store = MySqlStore::connect_with(
                url,
                MySqlConfig::from(SqlSettings {
                    table: self.inbox_table().to_owned(),
                    outbox_table: Some(self.outbox_table().to_owned()),
                    clock: Some(self.clock()),
                    ..config.sql
                }),
            )
            .await?;
            if self.owns_tables() {
                let pool = store.pool().clone();
                let tables = store.config().table_names();
                self.on_cleanup(move || async move {
                    if let Err(e) = drop_tables(&pool, &tables).await {
                        eprintln!(
                            "dedup-testkit: could not drop the kit's tables {tables:?}: {e}; drop them by hand"
                        );
                    }
                    pool.close().await;
                });
            }
            Ok(store)
        }
    }

    /// Drop the kit's tables, then their versions and purge runs rows (each statement
    /// commits on its own).
    async fn drop_tables(pool: &MySqlPool, tables: &[String]) -> Result<(), sqlx::Error> {
        for table in tables {
            sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS `{table}`")))
                .execute(pool)
                .await?;
        }
        let marks = vec!["?"; tables.len()].join(", ");
        for shared in [SCHEMA_VERSIONS_TABLE, PURGE_RUNS_TABLE] {
            let mut delete = sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM {shared} WHERE table_name IN ({marks})"
            )));
            for table in tables {
                delete = delete.bind(table);
            }
            delete.execute(pool).await?;
        }
        Ok(())
    }
}
