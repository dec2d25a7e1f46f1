//! The kit's own reports: a panicking consumer, a consumer that never lets go of a
//! delivery, a consumer with no effect at all.

use dedup_core::BoxError;
use dedup_testkit::{Consumer, Cx, Kit, Mode, Schedule, Violation, lease};
use futures::future::BoxFuture;

#[test]
fn a_panicking_handler_is_reported_with_the_empty_schedule() {
    let f = Kit::new()
        .cases(8)
        .run(lease(|message, _lease, _fx| async move {
            panic!("cannot handle {}", message.name())
        }))
        .expect_err("a panic must be reported");
    assert!(
        f.violations
            .iter()
            .any(|v| matches!(v, Violation::Panicked { worker: 0, detail } if detail == "cannot handle m0")),
        "{f}"
    );
    assert_eq!(
        f.schedule,
        Schedule {
            messages: 1,
            workers: 1,
            steps: Vec::new()
        },
        "{f}"
    );
}

/// Gives every delivery back.
struct NackForever;

impl Consumer for NackForever {
    fn mode(&self) -> Mode {
        Mode::Lease
    }

    fn consume(&self, cx: Cx) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            cx.nack().await?;
            Ok(())
        })
    }
}

#[test]
fn a_consumer_that_never_acknowledges_is_reported_stuck() {
    let f = Kit::new()
        .cases(4)
        .run(NackForever)
        .expect_err("never acking must be reported");
    assert!(
        matches!(&f.violations[..], [Violation::Stuck { detail }] if detail.contains("not all acknowledged")),
        "{f}"
    );
    assert_eq!((f.schedule.messages, f.schedule.workers), (1, 1), "{f}");
    assert!(f.schedule.steps.is_empty(), "{f}");
}

#[test]
fn an_expected_effect_that_never_happens_is_lost() {
    let f = Kit::new()
        .cases(8)
        .expect_effect("email")
        .run(lease(|_message, _lease, _fx| async move { Ok(None) }))
        .expect_err("a missing effect must be reported");
    assert_eq!(
        f.violations,
        vec![Violation::EffectMissing {
            message: "m0".into(),
            effect: "email".into()
        }],
        "{f}"
    );
}

#[test]
fn a_bad_seed_or_consumer_name_is_a_typed_error() {
    for bad in ["", "12", &"g".repeat(64), &"0".repeat(63)] {
        let e = Kit::new().seed(bad).expect_err(bad);
        assert!(e.is_invalid_input(), "{bad:?}: {e}");
    }
    assert!(Kit::new().seed(&"0f".repeat(32)).is_ok());
    let e = Kit::new().consumer_name("").expect_err("empty");
    assert!(e.is_invalid_input(), "{e}");
    assert!(Kit::new().consumer_name("billing").is_ok());
}

/// An effects query that counts nothing.
fn no_counts(
    _ids: Vec<String>,
) -> futures::future::Ready<Result<std::collections::BTreeMap<String, usize>, BoxError>> {
    futures::future::ready(Ok(Default::default()))
}

#[test]
fn an_effect_name_registered_twice_is_a_typed_error() {
    let kit = Kit::new()
        .effects_query("invoice", no_counts)
        .expect("a first name");
    let e = kit
        .clone()
        .effects_query("invoice", no_counts)
        .expect_err("the same query name twice");
    assert!(e.is_invalid_input(), "{e}");
    assert!(e.to_string().contains("\"invoice\""), "{e}");
    // A ledger effect and a queried one of the same name: a violation could not say which.
    let e = Kit::new()
        .expect_effect("charge")
        .effects_query("charge", no_counts)
        .expect_err("a ledger effect's name");
    assert!(e.is_invalid_input(), "{e}");
    let other = kit.effects_query("event", no_counts);
    assert!(other.is_ok(), "another name is fine");
}

#[test]
#[should_panic(expected = "\"invoice\" is already an effects_query's name")]
fn expecting_a_queried_effect_in_the_ledger_panics() {
    let _ = Kit::new()
        .effects_query("invoice", no_counts)
        .expect("a first name")
        .expect_effect("invoice");
}
