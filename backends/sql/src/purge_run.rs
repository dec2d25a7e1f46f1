//! The last purge run of a records table, kept in the purge runs table beside it
//! ([`PURGE_RUNS_TABLE`](crate::config::PURGE_RUNS_TABLE)): the write after every purge
//! that finishes and the read behind `Admin::last_purge`, the same on every sqlx backend.
//! The statements (the upsert's syntax, the table's schema) are each backend's.

use dedup_core::{PurgeReport, PurgeRun, Result, Timestamp};
use sqlx::SqlSafeStr;

use crate::error::SqlBackend;
use crate::query::{Param, SqlDb};
use crate::store::SqlStore;

/// Keep `report` as the store's records table's last run with `upsert` (one statement that
/// replaces the table's row in the purge runs table), its finish stamped with the
/// store's "now". The statement's parameters, in order: now (`NULL`: the server's clock),
/// the records table's name, how many rows the run removed, how long it took in ms, whether
/// it stopped early.
pub async fn record_run<S: SqlStore>(
    store: &S,
    upsert: impl SqlSafeStr,
    report: &PurgeReport,
) -> Result<()> {
    // The statement's clock gives the finish time; the run gives the rest.
    let run = PurgeRun::of(report, Timestamp::from_millis(0));
    let config = store.store_config();
    let params = [
        Param::Int(config.now_param()),
        Param::Text(Some(&config.table)),
        Param::Int(Some(i64::try_from(run.removed).unwrap_or(i64::MAX))),
        Param::Int(Some(run.took_ms())),
        Param::Bool(run.stopped_early),
    ];
    <Db<S>>::execute(store.store_pool(), upsert, &params)
        .await
        .map_err(S::Backend::error)?;
    Ok(())
}

/// The store's records table's last run, read by `select`, whose one parameter is the
/// records table's name and whose columns are `finished_at`, `removed`, `took_ms` and
/// `stopped_early` (`None`: no purge of this table finished since it was created).
pub async fn last_run<S: SqlStore>(store: &S, select: impl SqlSafeStr) -> Result<Option<PurgeRun>> {
    let params = [Param::Text(Some(&store.store_config().table))];
    let row = <Db<S>>::fetch_optional(store.store_pool(), select, &params)
        .await
        .map_err(S::Backend::error)?;
    row.map(|row| decode_run::<Db<S>>(&row).map_err(S::Backend::error))
        .transpose()
}

/// The database of a store's backend.
type Db<S> = <<S as SqlStore>::Backend as SqlBackend>::Db;

/// The run in a row of the purge runs table.
fn decode_run<DB: SqlDb>(row: &DB::Row) -> std::result::Result<PurgeRun, sqlx::Error> {
    Ok(PurgeRun::from_stored(
        DB::get_i64(row, "finished_at")?,
        DB::get_i64(row, "removed")?,
        DB::get_i64(row, "took_ms")?,
        DB::get_bool(row, "stopped_early")?,
    ))
}
