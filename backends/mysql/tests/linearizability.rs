//! Recorded concurrent histories of `MySqlStore` (four handles, each its own pool, on
//! the server's clock with real expiry) are linearizable.
//! (The sqlx backends' shared test, `../../sql/tests/clauses/linearizability.rs`.)

mod common;

#[path = "../../sql/tests/clauses/linearizability.rs"]
mod shared;
