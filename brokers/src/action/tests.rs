//! The retry log line records the handler's error chain as a string, so a formatter
//! escapes its control characters instead of writing them to the terminal raw.

use std::sync::{Arc, Mutex};

use dedup_core::{BoxError, Inbox, MemoryStore};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

use super::{Counters, decide};
use crate::{Action, ConsumerConfig, Delivery, with_inbox};

/// An error quoting what a terminal obeys: clear the screen, set the title, a line break.
const CAUSE: &str = "bad payload \u{1b}[2J\u{1b}]0;pwned\u{7}\nsecond line";

/// How each event's `error` field was recorded: `str` (a formatter quotes and escapes it)
/// or `debug` (a `%` field: a formatter writes its `Display` as it is).
#[derive(Clone, Default)]
struct Errors(Arc<Mutex<Vec<(&'static str, String)>>>);

struct Error<'a>(&'a mut Vec<(&'static str, String)>);

impl Visit for Error<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "error" {
            self.0.push(("str", value.to_owned()));
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "error" {
            self.0.push(("debug", format!("{value:?}")));
        }
    }
}

impl Subscriber for Errors {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        event.record(&mut Error(&mut self.0.lock().unwrap()));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn a_handlers_error_is_logged_as_a_string() {
    let errors = Errors::default();
    let _guard = tracing::subscriber::set_default(errors.clone());
    let action = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let handler = with_inbox(Inbox::new(MemoryStore::new()), |_lease, _delivery| async {
                Err::<Option<Vec<u8>>, BoxError>(CAUSE.into())
            });
            let delivery = Delivery {
                message_id: Some("m-1".into()),
                payload: Default::default(),
                headers: Vec::new(),
                published_at: None,
                redelivered: false,
                broker_ref: "orders/0/1".into(),
            };
            let config = ConsumerConfig::default();
            decide(&handler, "parser", &delivery, &config, &Counters::default()).await
        });
    assert!(matches!(action, Action::Retry { .. }), "{action:?}");
    let logged = errors.0.lock().unwrap().clone();
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0].0, "str", "{logged:?}");
    assert!(logged[0].1.ends_with(CAUSE), "{logged:?}");
}
