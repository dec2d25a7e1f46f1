//! [`SqlDb`]: the few statements the shared layer runs itself, and a backend's statements
//! run with [`Param`]s bound, written once for every sqlx database whose connections and
//! pools execute queries (PostgreSQL, MySQL / MariaDB).

use futures::future::BoxFuture;
use sqlx::{
    ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Pool, Row, SqlSafeStr,
    SqlStr, Type,
};

/// A value the shared layer binds to a statement of a backend's ([`SqlDb::execute`],
/// [`SqlDb::fetch_all`], [`SqlDb::fetch_optional`]), in the statement's parameter order.
#[derive(Clone, Copy, Debug)]
pub enum Param<'a> {
    /// A 64-bit integer, or `NULL` (a store's "now": its injected clock's, or the server's).
    Int(Option<i64>),
    /// Text, or `NULL`.
    Text(Option<&'a str>),
    /// Bytes (a key compared byte for byte).
    Bytes(&'a [u8]),
    /// A boolean.
    Bool(bool),
}

/// A key's part (a consumer or message id) bound as text.
pub fn key_as_text(key: &str) -> Param<'_> {
    Param::Text(Some(key))
}

/// A key's part bound as its bytes (where key columns compare byte for byte).
pub fn key_as_bytes(key: &str) -> Param<'_> {
    Param::Bytes(key.as_bytes())
}

/// `statement` with `params` bound, in order.
fn bound<'a, DB>(
    statement: SqlStr,
    params: &[Param<'a>],
) -> sqlx::query::Query<'a, DB, <DB as Database>::Arguments>
where
    DB: Database,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Type<DB>,
{
    params
        .iter()
        .fold(sqlx::query(statement), |query, param| match *param {
            Param::Int(n) => query.bind(n),
            Param::Text(text) => query.bind(text),
            Param::Bytes(bytes) => query.bind(bytes),
            Param::Bool(flag) => query.bind(flag),
        })
}

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

    /// Run `statement` with `params` on `pool`; its result (how many rows it changed:
    /// [`SqlBackend::rows_affected`](crate::SqlBackend::rows_affected)).
    fn execute<'a>(
        pool: &'a Pool<Self>,
        statement: impl SqlSafeStr,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Self::QueryResult, sqlx::Error>>;

    /// The rows `statement` with `params` returns on `pool`.
    fn fetch_all<'a>(
        pool: &'a Pool<Self>,
        statement: impl SqlSafeStr,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Vec<Self::Row>, sqlx::Error>>;

    /// The one row `statement` with `params` returns on `pool` (none is
    /// [`sqlx::Error::RowNotFound`]).
    fn fetch_one<'a>(
        pool: &'a Pool<Self>,
        statement: impl SqlSafeStr,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Self::Row, sqlx::Error>>;

    /// The row `statement` with `params` returns on `pool`, if any.
    fn fetch_optional<'a>(
        pool: &'a Pool<Self>,
        statement: impl SqlSafeStr,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Option<Self::Row>, sqlx::Error>>;

    /// The integer in column `name` of `row` (`NULL` is an error).
    fn get_i64(row: &Self::Row, name: &str) -> Result<i64, sqlx::Error>;

    /// The integer in column `name` of `row` (`NULL` as `None`).
    fn get_opt_i64(row: &Self::Row, name: &str) -> Result<Option<i64>, sqlx::Error>;

    /// The text in column `name` of `row` (`NULL` as `None`).
    fn get_opt_text(row: &Self::Row, name: &str) -> Result<Option<String>, sqlx::Error>;

    /// The boolean in column `name` of `row` (`NULL` is an error).
    fn get_bool(row: &Self::Row, name: &str) -> Result<bool, sqlx::Error>;

    /// The version `statement` reads from the versions table for `table` (its one
    /// parameter), if a row holds one.
    fn read_version<'a>(
        conn: &'a mut Self::Connection,
        statement: String,
        table: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>>;

    /// Write `version` as `table`'s with `statement` (an upsert of the versions table's
    /// row; its parameters the table's name, then the version).
    fn write_version<'a>(
        conn: &'a mut Self::Connection,
        statement: String,
        table: &'a str,
        version: i64,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;
}

impl<DB> SqlDb for DB
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Type<DB>,
    (i64,): for<'r> FromRow<'r, DB::Row>,
    (i32,): for<'r> FromRow<'r, DB::Row>,
    for<'r> i64: Decode<'r, DB>,
    for<'r> String: Decode<'r, DB>,
    for<'r> bool: Decode<'r, DB>,
    i64: Type<DB>,
    String: Type<DB>,
    for<'n> &'n str: ColumnIndex<DB::Row>,
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

    fn execute<'a>(
        pool: &'a Pool<Self>,
        statement: impl SqlSafeStr,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Self::QueryResult, sqlx::Error>> {
        let query = bound(statement.into_sql_str(), params);
        Box::pin(query.execute(pool))
    }

    fn fetch_all<'a>(
        pool: &'a Pool<Self>,
        statement: impl SqlSafeStr,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Vec<Self::Row>, sqlx::Error>> {
        let query = bound(statement.into_sql_str(), params);
        Box::pin(query.fetch_all(pool))
    }

    fn fetch_one<'a>(
        pool: &'a Pool<Self>,
        statement: impl SqlSafeStr,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Self::Row, sqlx::Error>> {
        let query = bound(statement.into_sql_str(), params);
        Box::pin(query.fetch_one(pool))
    }

    fn fetch_optional<'a>(
        pool: &'a Pool<Self>,
        statement: impl SqlSafeStr,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Option<Self::Row>, sqlx::Error>> {
        let query = bound(statement.into_sql_str(), params);
        Box::pin(query.fetch_optional(pool))
    }

    fn get_i64(row: &Self::Row, name: &str) -> Result<i64, sqlx::Error> {
        row.try_get(name)
    }

    fn get_opt_i64(row: &Self::Row, name: &str) -> Result<Option<i64>, sqlx::Error> {
        row.try_get(name)
    }

    fn get_opt_text(row: &Self::Row, name: &str) -> Result<Option<String>, sqlx::Error> {
        row.try_get(name)
    }

    fn get_bool(row: &Self::Row, name: &str) -> Result<bool, sqlx::Error> {
        row.try_get(name)
    }

    fn read_version<'a>(
        conn: &'a mut Self::Connection,
        statement: String,
        table: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>> {
        Box::pin(async move {
            let version: Option<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(statement))
                .bind(table)
                .fetch_optional(conn)
                .await?;
            Ok(version.map(i64::from))
        })
    }

    fn write_version<'a>(
        conn: &'a mut Self::Connection,
        statement: String,
        table: &'a str,
        version: i64,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .bind(table)
                .bind(i32::try_from(version).unwrap_or(i32::MAX))
                .execute(conn)
                .await
                .map(drop)
        })
    }
}
