//! The inbox's failure log lines record the cause as a string value, so a formatter escapes
//! its control characters (a payload's escape sequence quoted by a parse error) instead of
//! writing them to the terminal raw.

use dedup_core::test_util::Capture;
use dedup_core::{BoxError, FailurePolicy, Handled, Inbox, InboxConfig, Key, MemoryStore};

/// A cause holding what a terminal obeys: clear the screen, set the title, a line break.
const CAUSE: &str = "bad payload \u{1b}[2J\u{1b}]0;pwned\u{7}\nsecond line";

/// The `cause` fields logged while `config`'s inbox handles one failing delivery twice.
///
/// Each as `(how, value)`: how it was recorded, `str` (a formatter quotes and escapes it)
/// or `debug` (a `%` field: a formatter writes its `Display` as it is).
fn causes_logged(config: InboxConfig) -> Vec<(&'static str, String)> {
    let capture = Capture::default();
    let guard = capture.install();
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
    drop(guard);
    let events = capture.events().into_iter();
    let causes = events.filter_map(|e| {
        let how = if e.is_string("cause") { "str" } else { "debug" };
        e.field("cause").map(|cause| (how, cause.to_owned()))
    });
    causes.collect()
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
