//! The inbox's failure log lines record the cause as a string value, so a formatter escapes
//! its control characters (a payload's escape sequence quoted by a parse error) instead of
//! writing them to the terminal raw.

use std::sync::{Arc, Mutex};

use dedup_core::{BoxError, FailurePolicy, Handled, Inbox, InboxConfig, Key, MemoryStore};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// A cause holding what a terminal obeys: clear the screen, set the title, a line break.
const CAUSE: &str = "bad payload \u{1b}[2J\u{1b}]0;pwned\u{7}\nsecond line";

/// How each event's `cause` field was recorded: `str` (a formatter quotes and escapes it)
/// or `debug` (a `%` field: a formatter writes its `Display` as it is).
#[derive(Clone, Default)]
struct Causes(Arc<Mutex<Vec<(&'static str, String)>>>);

struct Cause<'a>(&'a mut Vec<(&'static str, String)>);

impl Visit for Cause<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "cause" {
            self.0.push(("str", value.to_owned()));
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "cause" {
            self.0.push(("debug", format!("{value:?}")));
        }
    }
}

impl Subscriber for Causes {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        event.record(&mut Cause(&mut self.0.lock().unwrap()));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// The `cause` fields logged while `config`'s inbox handles one failing delivery twice.
fn causes_logged(config: InboxConfig) -> Vec<(&'static str, String)> {
    let causes = Causes::default();
    let _guard = tracing::subscriber::set_default(causes.clone());
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let inbox = Inbox::new(MemoryStore::new()).with_config(config);
            let key = Key::new("parser", "m-1").unwrap();
            for _ in 0..2 {
                let handled = inbox
                    .handle(&key, None, |_lease| async {
                        Err::<Option<Vec<u8>>, BoxError>(CAUSE.into())
                    })
                    .await;
                if let Ok(Handled::Processed { .. }) = handled {
                    panic!("the handler always fails");
                }
            }
        });
    causes.0.lock().unwrap().clone()
}

#[test]
fn a_stored_failures_cause_is_logged_as_a_string() {
    let logged = causes_logged(InboxConfig {
        failures: FailurePolicy::Store,
        ..InboxConfig::default()
    });
    assert_eq!(logged, vec![("str", CAUSE.to_owned())]);
}

#[test]
fn a_dead_letters_cause_is_logged_as_a_string() {
    let logged = causes_logged(InboxConfig {
        max_attempts: Some(1),
        ..InboxConfig::default()
    });
    assert!(
        !logged.is_empty(),
        "a failed attempt and a dead letter are logged"
    );
    for (how, cause) in &logged {
        assert_eq!((*how, cause.as_str()), ("str", CAUSE), "{logged:?}");
    }
}
