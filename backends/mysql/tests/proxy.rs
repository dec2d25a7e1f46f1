//! `MySqlStore` through a proxy that cuts its connections at random moments (before a
//! statement reaches the server, after it did and before its reply, mid-reply): every
//! call returns `Ok` or a retryable error, retries converge, and the invariants hold.
//! (The sqlx backends' shared test, `../../sql/tests/clauses/proxy.rs`.)

mod common;

#[path = "../../sql/tests/clauses/proxy.rs"]
mod shared;
