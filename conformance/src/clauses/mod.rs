//! The clauses: each a public generic async fn that panics, with a message naming the
//! broken rule, when the store breaks the contract. Grouped by topic; all re-exported here
//! so `suite!` can name them, and listed by [`lease_clauses`] / [`transactional_clauses`].

mod admin;
mod batch;
mod claim;
mod commit;
mod concurrency;
mod failure;
mod fingerprint_outcome;
mod hostile;
mod kept_counts;
mod outbox;
mod outbox_operations;
mod outbox_racing;
mod persistence;
mod purge;
mod purge_run;
mod purger;
mod release_renew;
mod transactional;
mod tx_inbox;
mod validation;

pub use crate::model::model_based_histories_match_memory_store;
pub use crate::support::LEASE;
pub use admin::*;
pub use batch::*;
pub use claim::*;
pub use commit::*;
pub use concurrency::*;
pub use failure::*;
pub use fingerprint_outcome::*;
pub use hostile::*;
pub use kept_counts::*;
pub use outbox::*;
pub use outbox_operations::*;
pub use outbox_racing::*;
pub use persistence::*;
pub use purge::*;
pub use purge_run::*;
pub use purger::*;
pub use release_renew::*;
pub use transactional::*;
pub use tx_inbox::*;
pub use validation::*;

use futures::future::BoxFuture;

use crate::outbox::OutboxFactory;
use crate::{StoreFactory, TransactionalFactory, TxInboxFactory};

/// One clause, by name, runnable against a factory (see [`lease_clauses`]).
pub struct Clause<F> {
    /// The clause's function name.
    pub name: &'static str,
    /// Runs the clause; it panics when the store breaks the contract.
    pub run: for<'a> fn(&'a F) -> BoxFuture<'a, ()>,
}

impl<F> std::fmt::Debug for Clause<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Every clause `suite!` runs, in the same order: for running the suite some other way
/// (the crate's own broken-store tests do).
pub fn lease_clauses<F: StoreFactory>() -> Vec<Clause<F>> {
    crate::__lease_clause_names!(list)
}

/// Every clause `admin_suite!` runs, in the same order.
pub fn admin_clauses<F: StoreFactory>() -> Vec<Clause<F>>
where
    F::Store: dedup_core::Admin,
{
    crate::__admin_clause_names!(list)
}

/// Every clause `transactional_suite!` runs, in the same order.
pub fn transactional_clauses<F: TransactionalFactory>() -> Vec<Clause<F>> {
    crate::__transactional_clause_names!(list)
}

/// Every clause `tx_inbox_suite!` runs, in the same order.
pub fn tx_inbox_clauses<F: TxInboxFactory>() -> Vec<Clause<F>> {
    crate::__tx_inbox_clause_names!(list)
}

/// Every outbox clause, for running by hand (as `conformance/tests/broken_outbox.rs` does).
pub fn outbox_clauses<F: OutboxFactory>() -> Vec<Clause<F>> {
    crate::__outbox_clause_names!(list)
}

#[cfg(test)]
mod tests {
    /// Every public clause fn in the sources is listed (so `suite!` runs it), exactly once.
    #[test]
    fn every_clause_is_listed_once() {
        let sources = [
            include_str!("admin.rs"),
            include_str!("batch.rs"),
            include_str!("claim.rs"),
            include_str!("commit.rs"),
            include_str!("concurrency.rs"),
            include_str!("failure.rs"),
            include_str!("fingerprint_outcome.rs"),
            include_str!("hostile.rs"),
            include_str!("outbox.rs"),
            include_str!("outbox_operations.rs"),
            include_str!("outbox_racing.rs"),
            include_str!("persistence.rs"),
            include_str!("purge.rs"),
            include_str!("purge_run.rs"),
            include_str!("purger.rs"),
            include_str!("release_renew.rs"),
            include_str!("transactional.rs"),
            include_str!("tx_inbox.rs"),
            include_str!("validation.rs"),
            include_str!("../model.rs"),
        ];
        let mut defined: Vec<&str> = sources
            .iter()
            .flat_map(|s| s.lines())
            .filter_map(|l| l.strip_prefix("pub async fn "))
            .filter_map(|l| l.split('<').next())
            // The model test's runners, not clauses.
            .filter(|name| !name.starts_with("check_histories"))
            .collect();
        let lease: &[&str] = &crate::__lease_clause_names!(names);
        let transactional: &[&str] = &crate::__transactional_clause_names!(names);
        let admin: &[&str] = &crate::__admin_clause_names!(names);
        let tx_inbox: &[&str] = &crate::__tx_inbox_clause_names!(names);
        let outbox: &[&str] = &crate::__outbox_clause_names!(names);
        let mut listed: Vec<&str> = [lease, transactional, admin, tx_inbox, outbox].concat();
        defined.sort_unstable();
        listed.sort_unstable();
        assert_eq!(defined, listed);
    }
}
