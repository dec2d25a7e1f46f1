//! [`SqlDb`]: the few statements the shared layer runs itself, written once for every sqlx
//! database whose connections and pools execute queries (PostgreSQL, MySQL / MariaDB).

use futures::future::BoxFuture;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

/// A sqlx database the shared layer can run its own statements on. Implemented for every
/// database whose connections execute queries and that binds and decodes `i64`; a backend
/// names its database in [`SqlBackend::Db`](crate::SqlBackend::Db) and gets these.
pub trait SqlDb: Database {
    /// Run `statement` (fixed text, no parameters: a savepoint statement) on `conn`.
    fn run<'a>(
        conn: &'a mut Self::Connection,
        statement: &'static str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;

    /// The one integer `statement` selects with one parameter, `param`, bound (a store's
    /// "now" in ms: its injected clock's, or `NULL` for the server's).
    fn select_i64<'a>(
        pool: &'a Pool<Self>,
        statement: String,
        param: Option<i64>,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>>;
}

impl<DB> SqlDb for DB
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    (i64,): for<'r> FromRow<'r, DB::Row>,
    DB::Arguments: IntoArguments<DB>,
{
    fn run<'a>(
        conn: &'a mut Self::Connection,
        statement: &'static str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move { sqlx::query(statement).execute(conn).await.map(drop) })
    }

    fn select_i64<'a>(
        pool: &'a Pool<Self>,
        statement: String,
        param: Option<i64>,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_scalar(sqlx::AssertSqlSafe(statement))
                .bind(param)
                .fetch_one(pool)
                .await
        })
    }
}
