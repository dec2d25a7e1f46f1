//! What the scale mode asks of each backend's server beside the store: bytes on disk or in
//! memory, the scale store's (its table and indexes, or its keys) against the smallest raw
//! row holding the same keys, built from the store's own keys; and a rest after the
//! preload.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use crate::bench::{Names, Result};

/// Which of the bench's two stores of a backend a size is of.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Which {
    /// The scale store: the bench's purge store, on a manual clock, preloaded in batches.
    Scale,
    /// The store as an application opens it (its default clock), written one claim+commit
    /// at a time: what a consumer's records take.
    Default,
}

impl Which {
    /// The store's table.
    fn table(self, names: &Names) -> &str {
        match self {
            Which::Scale => &names.purge_table,
            Which::Default => &names.table,
        }
    }

    /// The store's Redis key prefix.
    #[cfg(feature = "redis")]
    fn redis_prefix(self, names: &Names) -> String {
        use crate::bench::redis::{PURGE_PART, STORE_PART};
        names.redis_prefix(match self {
            Which::Scale => PURGE_PART,
            Which::Default => STORE_PART,
        })
    }
}

/// Measures the bench's stores (by [`Which`]) against their raw minimum, and lets the
/// server settle.
pub(crate) trait Sizer: Send + Sync {
    /// `(store bytes, raw bytes)` for the records `which` store holds now; `None` where
    /// this backend cannot tell.
    fn sizes<'a>(
        &'a self,
        names: &'a Names,
        which: Which,
    ) -> BoxFuture<'a, Result<Option<(f64, f64)>>>;

    /// Write back what the preload left to write (dirty pages, the log), as a server that
    /// took its records over days has long done, so the stream measured next pays for a
    /// claim in a large table and not for the minutes of bulk load just before it. What
    /// it does and how long it took; `None` where nothing is waiting (Redis).
    fn settle(&self) -> BoxFuture<'_, Result<Option<(&'static str, Duration)>>> {
        Box::pin(async { Ok(None) })
    }
}

/// No figure for this store.
struct Unknown;

impl Sizer for Unknown {
    fn sizes<'a>(&'a self, _: &'a Names, _: Which) -> BoxFuture<'a, Result<Option<(f64, f64)>>> {
        Box::pin(async { Ok(None) })
    }
}

/// How long [`Sizer::settle`] waits at most for a server to write back.
const SETTLE_LIMIT: Duration = Duration::from_secs(300);

/// `what`, and the time since `started`.
fn settled(what: &'static str, started: Instant) -> Option<(&'static str, Duration)> {
    Some((what, started.elapsed()))
}

/// The sizer of the store `url` names.
pub(crate) fn open(url: &str) -> Box<dyn Sizer> {
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Box::new(postgres::PgSizer(url.to_owned()));
    }
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        return Box::new(mysql::MySqlSizer(url.to_owned()));
    }
    #[cfg(feature = "sqlite")]
    if let Some(path) = url.strip_prefix("sqlite:") {
        return Box::new(sqlite::SqliteSizer(
            path.trim_start_matches("//").to_owned(),
        ));
    }
    #[cfg(feature = "redis")]
    if url.starts_with("redis://") {
        return Box::new(redis::RedisSizer(url.to_owned()));
    }
    let _ = url;
    Box::new(Unknown)
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::time::{Duration, Instant};

    use dedup_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection};
    use futures::future::BoxFuture;

    use super::{Sizer, Which, settled};
    use crate::bench::{Names, Result};

    pub(super) struct PgSizer(pub(super) String);

    impl Sizer for PgSizer {
        fn sizes<'a>(
            &'a self,
            names: &'a Names,
            which: Which,
        ) -> BoxFuture<'a, Result<Option<(f64, f64)>>> {
            Box::pin(async move {
                let mut conn = PgConnection::connect(&self.0).await?;
                let table = which.table(names);
                let raw = format!("{table}_min");
                // Table, indexes and TOAST; for a partitioned table, of its partitions
                // (`pg_partition_tree` lists nothing for a plain table).
                let size = "SELECT coalesce( \
                              (SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(t)), \
                              pg_total_relation_size(t))::float8 \
                            FROM (SELECT format('%I.%I', 'public', $1::text)::regclass AS t) x";
                let (store,): (f64,) = sqlx::query_as(size)
                    .bind(table)
                    .fetch_one(&mut conn)
                    .await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "CREATE TABLE \"{raw}\" (consumer text NOT NULL, message_id text NOT NULL, \
                     PRIMARY KEY (consumer, message_id)); \
                     INSERT INTO \"{raw}\" SELECT consumer, message_id FROM \"{table}\""
                )))
                .execute(&mut conn)
                .await?;
                let (raw_size,): (f64,) =
                    sqlx::query_as(size).bind(&raw).fetch_one(&mut conn).await?;
                sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE \"{raw}\"")))
                    .execute(&mut conn)
                    .await?;
                Ok(Some((store, raw_size)))
            })
        }

        /// A `CHECKPOINT`: every dirty buffer written and synced.
        fn settle(&self) -> BoxFuture<'_, Result<Option<(&'static str, Duration)>>> {
            Box::pin(async move {
                let started = Instant::now();
                let mut conn = PgConnection::connect(&self.0).await?;
                sqlx::raw_sql("CHECKPOINT").execute(&mut conn).await?;
                Ok(settled("CHECKPOINT", started))
            })
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use std::time::{Duration, Instant};

    use dedup_mysql::sqlx::{self, AssertSqlSafe, Connection, MySqlConnection};
    use futures::future::BoxFuture;

    use super::{SETTLE_LIMIT, Sizer, Which, settled};
    use crate::bench::{Names, Result};

    pub(super) struct MySqlSizer(pub(super) String);

    /// Data and index bytes of `table` by InnoDB's statistics, refreshed first.
    async fn size(conn: &mut MySqlConnection, table: &str) -> Result<f64> {
        sqlx::raw_sql(AssertSqlSafe(format!("ANALYZE TABLE `{table}`")))
            .execute(&mut *conn)
            .await?;
        let (bytes,): (f64,) = sqlx::query_as(
            "SELECT CAST(data_length + index_length AS DOUBLE) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = ?",
        )
        .bind(table)
        .fetch_one(&mut *conn)
        .await?;
        Ok(bytes)
    }

    impl Sizer for MySqlSizer {
        fn sizes<'a>(
            &'a self,
            names: &'a Names,
            which: Which,
        ) -> BoxFuture<'a, Result<Option<(f64, f64)>>> {
            Box::pin(async move {
                let mut conn = MySqlConnection::connect(&self.0).await?;
                let table = which.table(names);
                let raw = format!("{table}_min");
                let store = size(&mut conn, table).await?;
                // The raw table gets the keys in the order the store got them
                // (`claimed_at`): InnoDB keeps a table in primary-key order, so keys
                // inserted in that order fill its pages whole, and random UUIDs, as a
                // consumer receives them, leave them partly empty. The store's table was
                // filled the second way, and so is the raw one.
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "CREATE TABLE `{raw}` (consumer VARBINARY(200) NOT NULL, \
                     message_id VARBINARY(255) NOT NULL, PRIMARY KEY (consumer, message_id)) \
                     ENGINE=InnoDB; \
                     INSERT INTO `{raw}` SELECT consumer, message_id FROM `{table}` \
                     ORDER BY claimed_at"
                )))
                .execute(&mut conn)
                .await?;
                let raw_size = size(&mut conn, &raw).await?;
                sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE `{raw}`")))
                    .execute(&mut conn)
                    .await?;
                Ok(Some((store, raw_size)))
            })
        }

        /// InnoDB's dirty pages written back: `innodb_max_dirty_pages_pct` set to 0 until
        /// at most 1 % of the pool's pages are dirty (or [`SETTLE_LIMIT`], which the
        /// answer then names), then put back.
        fn settle(&self) -> BoxFuture<'_, Result<Option<(&'static str, Duration)>>> {
            Box::pin(async move {
                let started = Instant::now();
                let mut conn = MySqlConnection::connect(&self.0).await?;
                let (pct,): (f64,) =
                    sqlx::query_as("SELECT CAST(@@innodb_max_dirty_pages_pct AS DOUBLE)")
                        .fetch_one(&mut conn)
                        .await?;
                sqlx::raw_sql("SET GLOBAL innodb_max_dirty_pages_pct = 0")
                    .execute(&mut conn)
                    .await?;
                let waited = async {
                    loop {
                        if started.elapsed() >= SETTLE_LIMIT {
                            return Ok("dirty pages over 1 % of the pool still, at the limit");
                        }
                        let (dirty, total): (f64, f64) = sqlx::query_as(
                            "SELECT CAST(SUM(IF(variable_name = 'INNODB_BUFFER_POOL_PAGES_DIRTY', \
                             variable_value, 0)) AS DOUBLE), \
                             CAST(SUM(IF(variable_name = 'INNODB_BUFFER_POOL_PAGES_TOTAL', \
                             variable_value, 0)) AS DOUBLE) \
                             FROM information_schema.global_status",
                        )
                        .fetch_one(&mut conn)
                        .await?;
                        if dirty <= total / 100.0 {
                            return Ok::<_, sqlx::Error>("dirty pages written back");
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                .await;
                sqlx::query(AssertSqlSafe(format!(
                    "SET GLOBAL innodb_max_dirty_pages_pct = {pct}"
                )))
                .execute(&mut conn)
                .await?;
                Ok(settled(waited?, started))
            })
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::time::{Duration, Instant};

    use dedup_sqlite::rusqlite::{Connection, params};
    use futures::future::BoxFuture;

    use super::{Sizer, Which, settled};
    use crate::bench::{Names, Result};

    pub(super) struct SqliteSizer(pub(super) String);

    /// Bytes of the pages of `table` and its indexes (the `dbstat` table).
    fn size(conn: &Connection, table: &str) -> Result<f64> {
        Ok(conn.query_row(
            "SELECT CAST(coalesce(sum(pgsize), 0) AS REAL) FROM dbstat \
             WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = ?1)",
            params![table],
            |r| r.get(0),
        )?)
    }

    impl Sizer for SqliteSizer {
        fn sizes<'a>(
            &'a self,
            names: &'a Names,
            which: Which,
        ) -> BoxFuture<'a, Result<Option<(f64, f64)>>> {
            let (path, table) = (self.0.clone(), which.table(names).to_owned());
            Box::pin(async move {
                tokio::task::spawn_blocking(move || {
                    let conn = Connection::open(&path)?;
                    conn.busy_timeout(std::time::Duration::from_secs(30))?;
                    let raw = format!("{table}_min");
                    let store = size(&conn, &table)?;
                    conn.execute_batch(&format!(
                        "CREATE TABLE \"{raw}\" (consumer TEXT NOT NULL, message_id TEXT NOT NULL, \
                         PRIMARY KEY (consumer, message_id)) WITHOUT ROWID; \
                         INSERT INTO \"{raw}\" SELECT consumer, message_id FROM \"{table}\";"
                    ))?;
                    let raw_size = size(&conn, &raw)?;
                    conn.execute_batch(&format!("DROP TABLE \"{raw}\""))?;
                    Ok(Some((store, raw_size)))
                })
                .await?
            })
        }

        /// A `wal_checkpoint(TRUNCATE)`: the log copied into the file, synced, emptied.
        fn settle(&self) -> BoxFuture<'_, Result<Option<(&'static str, Duration)>>> {
            let path = self.0.clone();
            Box::pin(async move {
                tokio::task::spawn_blocking(move || {
                    let started = Instant::now();
                    let conn = Connection::open(&path)?;
                    conn.busy_timeout(Duration::from_secs(30))?;
                    let busy: i64 =
                        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
                    if busy != 0 {
                        return Err("wal_checkpoint(TRUNCATE) was blocked by a reader".into());
                    }
                    Ok(settled("wal_checkpoint(TRUNCATE)", started))
                })
                .await?
            })
        }
    }
}

#[cfg(feature = "redis")]
mod redis {
    use dedup_redis::redis::{self, aio::MultiplexedConnection};
    use futures::future::BoxFuture;

    use super::{Sizer, Which};
    use crate::bench::{Names, Result};

    pub(super) struct RedisSizer(pub(super) String);

    /// Keys of the sample.
    const SAMPLE: usize = 2000;

    /// `MEMORY USAGE` of each key, summed.
    async fn usage(conn: &mut MultiplexedConnection, keys: &[String]) -> Result<f64> {
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0);
        }
        let sizes: Vec<Option<u64>> = pipe.query_async(conn).await?;
        Ok(sizes.into_iter().flatten().sum::<u64>() as f64)
    }

    impl Sizer for RedisSizer {
        /// Sampled: the mean of `SAMPLE` keys times the records held, for the store and
        /// for raw `SET key 1 PX` keys of the same length.
        fn sizes<'a>(
            &'a self,
            names: &'a Names,
            which: Which,
        ) -> BoxFuture<'a, Result<Option<(f64, f64)>>> {
            Box::pin(async move {
                let mut conn = redis::Client::open(self.0.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                let prefix = which.redis_prefix(names);
                let mut keys: Vec<String> = Vec::new();
                let mut cursor = 0u64;
                loop {
                    let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(format!("{prefix}*"))
                        .arg("COUNT")
                        .arg(10_000)
                        .query_async(&mut conn)
                        .await?;
                    keys.extend(found);
                    cursor = next;
                    if cursor == 0 || keys.len() >= SAMPLE {
                        break;
                    }
                }
                keys.truncate(SAMPLE);
                if keys.is_empty() {
                    return Ok(None);
                }
                let held: u64 = {
                    let mut n = 0u64;
                    let mut cursor = 0u64;
                    loop {
                        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(format!("{prefix}*"))
                            .arg("COUNT")
                            .arg(10_000)
                            .query_async(&mut conn)
                            .await?;
                        n += found.len() as u64;
                        cursor = next;
                        if cursor == 0 {
                            break n;
                        }
                    }
                };
                let store = usage(&mut conn, &keys).await?;
                // Same length: the prefix's first byte changed.
                let raw: Vec<String> = keys.iter().map(|k| format!("~{}", &k[1..])).collect();
                let mut pipe = redis::pipe();
                for key in &raw {
                    pipe.cmd("SET")
                        .arg(key)
                        .arg(1)
                        .arg("PX")
                        .arg(600_000)
                        .ignore();
                }
                pipe.query_async::<()>(&mut conn).await?;
                let raw_usage = usage(&mut conn, &raw).await?;
                let mut pipe = redis::pipe();
                for key in &raw {
                    pipe.cmd("DEL").arg(key).ignore();
                }
                pipe.query_async::<()>(&mut conn).await?;
                let per = |total: f64| total / keys.len() as f64 * held as f64;
                Ok(Some((per(store), per(raw_usage))))
            })
        }
    }
}
