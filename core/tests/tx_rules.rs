//! The transactional inbox engine's (`TxEngine`) small rules: its settings, the reserved
//! outcome bytes, and how it reads an error's source chain.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::layers::RetryPolicy;
use dedup_core::{DedupStore, Error, InboxConfig, MemoryStore, TxEngine};

fn engine() -> TxEngine {
    let store: Arc<dyn DedupStore> = Arc::new(MemoryStore::new());
    TxEngine::new(store, InboxConfig::default())
}

/// A driver's error the fake driver below classifies.
#[derive(Debug, thiserror::Error)]
#[error("driver said {0}")]
struct Driver(bool);

fn driver(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
    e.downcast_ref::<Driver>().map(|d| d.0)
}

#[test]
fn the_retry_policy_is_the_one_given() {
    let policy = RetryPolicy {
        max_retries: 7,
        initial_backoff: Duration::from_millis(3),
        max_backoff: Duration::from_millis(30),
    };
    assert_ne!(*engine().retry(), policy);
    assert_eq!(*engine().with_retry(policy).retry(), policy);
}

#[test]
fn its_debug_output_names_the_engine_and_its_settings() {
    let shown = format!("{:?}", engine().with_retry(RetryPolicy::NEVER));
    assert!(shown.starts_with("TxEngine {"), "{shown}");
    for field in ["config", "retry", "max_retries: 0", "observe"] {
        assert!(shown.contains(field), "{field} in {shown}");
    }
}

#[test]
fn an_outcome_with_the_reserved_bytes_is_refused() {
    let refused = TxEngine::check_outcome(Some(b"\0dedup:failed")).unwrap_err();
    assert!(refused.to_string().contains("reserved bytes"), "{refused}");
    TxEngine::check_outcome(Some(b"receipt-1")).unwrap();
    TxEngine::check_outcome(None).unwrap();
}

#[test]
fn only_an_error_the_database_asks_to_retry_runs_again() {
    let plain: dedup_core::BoxError = "card declined".into();
    assert!(
        !TxEngine::asks_for_retry(&*plain, driver),
        "no retryable error in the chain"
    );
    let fatal = Error::backend("fake", false, Driver(true));
    assert!(
        !TxEngine::asks_for_retry(&fatal, driver),
        "the first dedup error in the chain decides, not its source"
    );
    let retryable = Error::backend("fake", true, "connection reset");
    assert!(TxEngine::asks_for_retry(&retryable, driver));
    let refused: dedup_core::BoxError = Box::new(Driver(false));
    assert!(
        !TxEngine::asks_for_retry(&*refused, driver),
        "the driver says no"
    );
    let asked: dedup_core::BoxError = Box::new(Driver(true));
    assert!(
        TxEngine::asks_for_retry(&*asked, driver),
        "the driver says yes"
    );
}
