//! `InboxConfig::log_duplicates`: one WARN per delivery that did not run the handler, with
//! the message id only when allowed. A small capturing subscriber, for this thread only.

mod support;

use std::collections::BTreeMap;

use dedup_core::{DuplicateLog, Handled, Inbox, InboxConfig, Key, MemoryStore};
use support::warnings::Warnings;

/// Process one message, deliver it twice more, and return the warnings logged.
fn warnings_with(log: DuplicateLog) -> Vec<BTreeMap<String, String>> {
    let warnings = Warnings::default();
    let _guard = tracing::subscriber::set_default(warnings.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let inbox = Inbox::new(MemoryStore::new()).with_config(InboxConfig {
            log_duplicates: log,
            ..InboxConfig::default()
        });
        let key = Key::new("emails", "welcome-ada@example.com").unwrap();
        for _ in 0..3 {
            let handled = inbox
                .handle(&key, None, |_| async { Ok::<_, &str>(None) })
                .await
                .unwrap();
            assert!(handled.is_settled());
        }
        let again = inbox
            .handle(&key, None, |_| async { Ok::<_, &str>(None) })
            .await
            .unwrap();
        assert!(matches!(again, Handled::Duplicate { .. }));
    });
    warnings.seen()
}

#[test]
fn off_by_default_logs_nothing() {
    assert_eq!(InboxConfig::default().log_duplicates, DuplicateLog::Off);
    assert!(warnings_with(DuplicateLog::Off).is_empty());
}

#[test]
fn each_duplicate_is_one_warning_with_the_consumer_and_without_the_id_when_kept_out() {
    let seen = warnings_with(DuplicateLog::WithoutMessageIds);
    assert_eq!(seen.len(), 3, "{seen:?}");
    for fields in &seen {
        assert_eq!(fields["message"], "duplicate suppressed");
        assert_eq!(fields["consumer"], "emails");
        assert_eq!(fields["result"], "duplicate");
        assert!(!fields.contains_key("message_id"), "{fields:?}");
    }
}

#[test]
fn with_message_ids_the_warning_names_the_message() {
    let seen = warnings_with(DuplicateLog::WithMessageIds);
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        seen.iter()
            .all(|f| f["message_id"] == "welcome-ada@example.com")
    );
}
