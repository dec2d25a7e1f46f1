//! An effects query over an SQLite file, for the tests on SQLite (`billing.rs`,
//! `effects.rs` include it: `mod sqlite_counts;`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dedup_core::BoxError;
use dedup_sqlite::rusqlite::{Connection, params_from_iter};

/// A connection to `db` that waits for the writer rather than failing at once.
pub fn connect(db: &Path) -> Result<Connection, BoxError> {
    let conn = Connection::open(db)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(conn)
}

/// The effects query that counts, per order id (the message id), the rows of `table` in
/// `db` that `filter` (an SQL condition, or `TRUE`) keeps.
pub fn count(
    db: PathBuf,
    table: &'static str,
    filter: String,
) -> impl Fn(Vec<String>) -> futures::future::Ready<Result<BTreeMap<String, usize>, BoxError>>
+ Send
+ Sync
+ 'static {
    move |ids: Vec<String>| {
        futures::future::ready((|| {
            let conn = connect(&db)?;
            let marks = vec!["?"; ids.len()].join(", ");
            let mut stmt = conn.prepare(&format!(
                "SELECT order_id, count(*) FROM {table} WHERE ({filter}) AND order_id IN ({marks}) GROUP BY order_id"
            ))?;
            let rows = stmt.query_map(params_from_iter(ids.iter()), |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as usize))
            })?;
            Ok(rows.collect::<Result<BTreeMap<_, _>, _>>()?)
        })())
    }
}
