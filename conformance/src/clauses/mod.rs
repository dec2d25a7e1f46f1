//! The clauses: each a public generic async fn that panics when the store breaks the
//! contract. Grouped by topic; all re-exported here so `suite!` can name them.

mod claim;

pub use claim::*;
