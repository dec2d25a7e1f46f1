//! `TxInbox::handle_in` on PostgreSQL: the transactional inbox inside the caller's own
//! transaction, under a savepoint. The clauses are shared by the sqlx backends
//! (`backends/sql/tests/clauses/tx_inbox_in.rs`).

mod common;

use dedup_postgres::TxInbox;

#[path = "../../sql/tests/clauses/tx_inbox_in.rs"]
mod clauses;
