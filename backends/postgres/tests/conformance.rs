//! The conformance suite (lease-mode and transactional clauses, the model-based test)
//! against the real PostgreSQL of `DEDUP_POSTGRES_URL`, through the sqlx backends' shared
//! factory (`../../sql/tests/clauses/factory.rs`).

mod common;

use dedup_postgres::sqlx::{self, Postgres};
use dedup_postgres::{PostgresStore, TxInbox};

type Store = PostgresStore;
type Db = Postgres;

#[path = "../../sql/tests/clauses/factory.rs"]
mod factory;
use factory::{SqlFactory, seed_id};

#[path = "common/conflict.rs"]
mod conflict_steps;
use conflict_steps::{before_conflict, conflict};

dedup_conformance::suite!(SqlFactory);
dedup_conformance::transactional_suite!(SqlFactory);
dedup_conformance::tx_inbox_suite!(SqlFactory);
dedup_conformance::admin_suite!(SqlFactory);
