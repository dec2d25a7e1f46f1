//! `TxInbox::handle_in` on PostgreSQL: the transactional inbox inside the caller's own
//! transaction, under a savepoint. The clauses are shared by the sqlx backends
//! (`backends/sql/tests/clauses/tx_inbox_in.rs`). Also what a `TxInbox` answers about
//! itself on PostgreSQL.

mod common;

use std::time::Duration;

use dedup_core::InboxConfig;
use dedup_postgres::TxInbox;

#[path = "../../sql/tests/clauses/tx_inbox_in.rs"]
mod clauses;

/// PostgreSQL's attempt-counting claim does not wait for its log flush unless asked.
#[tokio::test]
async fn the_inbox_answers_its_configuration_claims_and_transactions() {
    let Some(url) = common::url() else { return };
    let store = common::store(&url, "tx_inbox_self", None).await;
    let inbox = TxInbox::new(store.clone());
    assert!(!inbox.durable_claims());
    assert!(inbox.clone().with_durable_claims().durable_claims());

    let config = InboxConfig {
        lease: Duration::from_secs(7),
        max_attempts: Some(4),
        ..InboxConfig::default()
    };
    assert_eq!(inbox.clone().with_config(config.clone()).config(), &config);

    let shown = format!("{inbox:?}");
    assert!(
        shown.starts_with("TxInbox { store: PostgresStore"),
        "{shown}"
    );
    let end = r#"durable_claims: false, begin: "the store's pool" }"#;
    assert!(shown.ends_with(end), "{shown}");
    let yours = format!("{:?}", inbox.with_begin(store.pool().clone()));
    assert!(yours.ends_with(r#"begin: "yours" }"#), "{yours}");
}
