//! Messages with payloads from a generator, malformed ones included: a consumer that
//! panics on a malformed payload, one that processes it as if it were good, and one that
//! stores a passing outage as the message's final failure are caught; one that stores a
//! failure for exactly the poison payloads passes.

use dedup_core::{BoxError, FailurePolicy, InboxConfig, Transient};
use dedup_testkit::proptest::prelude::*;
use dedup_testkit::{Effects, Failure, Kit, Report, Violation, lease};

/// A good payload: `order:` and a number.
fn parse(payload: &[u8]) -> Result<u32, BoxError> {
    let text = std::str::from_utf8(payload)?;
    let number = text.strip_prefix("order:").ok_or("no \"order:\" prefix")?;
    Ok(number.parse()?)
}

/// Good orders, and bytes that are almost never one.
fn payloads() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (0u32..1000).prop_map(|n| format!("order:{n}").into_bytes()),
        proptest::collection::vec(any::<u8>(), 0..12),
    ]
}

/// The kit: payloads drawn from [`payloads`], poison where they do not parse, every good
/// message shipped; failures stored as final.
fn kit() -> Kit {
    Kit::new()
        .cases(128)
        .payloads(payloads())
        .poison(|payload| parse(payload).is_err())
        .expect_effect("ship")
        .inbox_config(InboxConfig {
            failures: FailurePolicy::Store,
            ..InboxConfig::default()
        })
}

/// Ship the order, an outage of the shipper marked transient (`transient`) so the delivery
/// is tried again instead of stored as failed.
async fn ship(fx: &Effects, transient: bool) -> Result<Option<Vec<u8>>, BoxError> {
    match fx.call("ship").await {
        Ok(()) => Ok(Some(b"shipped".to_vec())),
        Err(e) if transient => Err(Box::new(Transient::new(e))),
        Err(e) => Err(Box::new(e)),
    }
}

fn right() -> Result<Report, Box<Failure>> {
    kit().run(lease(|message, _lease, fx| async move {
        parse(message.payload())?;
        ship(&fx, true).await
    }))
}

#[test]
fn a_consumer_that_stores_a_failure_for_poison_passes() {
    let report = right().unwrap_or_else(|f| panic!("{f}"));
    assert!(report.poison_messages > 0, "{report:?}");
}

#[test]
fn a_consumer_that_panics_on_a_malformed_payload_is_caught() {
    let f = kit()
        .run(lease(|message, _lease, fx| async move {
            let _order = parse(message.payload()).expect("a well-formed order");
            ship(&fx, true).await
        }))
        .expect_err("the panic must be caught");
    assert!(
        matches!(&f.violations[..], [Violation::Panicked { detail, .. }] if detail.contains("a well-formed order")),
        "{f}"
    );
    // The printed failure shows the poison payload.
    assert_eq!(f.poison, [true], "{f}");
    assert!(parse(&f.payloads[0]).is_err(), "{f}");
    assert!(f.to_string().contains("m0's payload: b\""), "{f}");
}

#[test]
fn a_consumer_that_processes_a_malformed_payload_is_caught() {
    let f = kit()
        .run(lease(|message, _lease, fx| async move {
            match parse(message.payload()) {
                Ok(_) => ship(&fx, true).await,
                // Skipped, but as a success: the poison is not kept as a failure.
                Err(_) => Ok(None),
            }
        }))
        .expect_err("processing poison must be caught");
    assert_eq!(
        f.violations,
        vec![Violation::PoisonProcessed {
            message: "m0".into()
        }],
        "{f}"
    );
}

#[test]
fn a_consumer_that_stores_an_outage_as_final_is_caught_losing_a_good_message() {
    let f = kit()
        .run(lease(|message, _lease, fx| async move {
            parse(message.payload())?;
            ship(&fx, false).await
        }))
        .expect_err("a stored outage must be caught");
    assert!(
        matches!(&f.violations[..], [Violation::Rejected { message, verdict }, Violation::EffectMissing { .. }] if message == "m0" && verdict.contains("failure injected by the test kit")),
        "{f}"
    );
    assert_eq!(f.poison, [false], "{f}");
    assert_eq!(f.schedule.failures(), 1, "{f}");
}
