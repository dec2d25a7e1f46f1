//! Several purgers and many claimers at once on 200 000 records (four handles, each its
//! own pool): no deadlock, each record removed once, no live lease removed.
//! (The sqlx backends' shared test, `../../sql/tests/clauses/purgers.rs`.)

mod common;

#[path = "../../sql/tests/clauses/purgers.rs"]
mod shared;
