//! The retry log line records the handler's error chain as a string, so a formatter
//! escapes its control characters instead of writing them to the terminal raw.

use dedup_core::test_util::Capture;
use dedup_core::{BoxError, Inbox, MemoryStore};

use super::{Counters, decide};
use crate::{Action, ConsumerConfig, Delivery, with_inbox};

/// An error quoting what a terminal obeys: clear the screen, set the title, a line break.
const CAUSE: &str = "bad payload \u{1b}[2J\u{1b}]0;pwned\u{7}\nsecond line";

#[test]
fn a_handlers_error_is_logged_as_a_string() {
    let capture = Capture::default();
    let _guard = capture.install();
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
    // How each event's `error` field was recorded: `str` (a formatter quotes and escapes
    // it) or `debug` (a `%` field: a formatter writes its `Display` as it is).
    let logged: Vec<_> = (capture.events().into_iter())
        .filter_map(|e| {
            let how = if e.is_string("error") { "str" } else { "debug" };
            e.field("error").map(|error| (how, error.to_owned()))
        })
        .collect();
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0].0, "str", "{logged:?}");
    assert!(logged[0].1.ends_with(CAUSE), "{logged:?}");
}
