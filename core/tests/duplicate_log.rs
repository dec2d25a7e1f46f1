//! `InboxConfig::log_duplicates`: one WARN per delivery that did not run the handler, with
//! the message id only when allowed. A small capturing subscriber, for this thread only.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use dedup_core::{DuplicateLog, Handled, Inbox, InboxConfig, Key, MemoryStore};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// The WARN events seen: their fields (the message under `message`).
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<BTreeMap<String, String>>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl Subscriber for Warnings {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() == Level::WARN {
            let mut fields = BTreeMap::new();
            event.record(&mut Fields(&mut fields));
            self.0.lock().unwrap().push(fields);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

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
    warnings.0.lock().unwrap().clone()
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
