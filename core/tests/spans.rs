//! The Observed layer's `tracing` spans: one per operation with its fields, message ids only
//! when allowed. The relay's span per published row, with its trace fields. A capturing
//! subscriber, installed for this thread only.

use std::collections::BTreeMap;
use std::sync::Arc;

use dedup_core::layers::{ObserveOptions, Observed};
use dedup_core::outbox::{MemoryOutbox, MemoryPublisher, OutboxMessage, Relay};
use dedup_core::test_util::Capture;
use dedup_core::trace::CORRELATION_ID_HEADER;
use dedup_core::{ClaimOptions, DedupStore, Inbox, Key, MemoryStore};

/// A span as captured: its name and its fields' values.
type Captured = (String, BTreeMap<String, String>);

/// The spans `scenario` created, on a current-thread runtime with the capture installed.
fn spans_of<F: Future>(scenario: F) -> Vec<Captured> {
    let capture = Capture::default();
    let _guard = capture.install();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(scenario);
    let spans = capture.spans().into_iter();
    spans.map(|span| (span.name, span.fields)).collect()
}

fn field<'a>(span: &'a Captured, name: &str) -> Option<&'a str> {
    span.1.get(name).map(String::as_str)
}

#[test]
fn each_operation_has_a_span_with_backend_consumer_message_id_outcome_and_duration() {
    let spans = spans_of(async {
        let store = Observed::new(MemoryStore::new(), ObserveOptions::new("memory"));
        let k = Key::new("billing", "order-9").unwrap();
        let lease = store.claim(&k, &ClaimOptions::default()).await.unwrap();
        store
            .commit(&lease.into_lease().unwrap(), None)
            .await
            .unwrap();
        store.claim(&k, &ClaimOptions::default()).await.unwrap();
    });
    let ops: Vec<_> = spans.iter().filter(|s| s.0 == "dedup").collect();
    assert_eq!(ops.len(), 3, "{spans:?}");
    let outcomes: Vec<_> = ops.iter().map(|s| field(s, "outcome").unwrap()).collect();
    assert_eq!(outcomes, ["acquired", "ok", "completed"]);
    for span in &ops {
        assert_eq!(field(span, "backend"), Some("memory"));
        assert_eq!(field(span, "consumer"), Some("billing"));
        assert_eq!(field(span, "message_id"), Some("order-9"));
        let ms: f64 = field(span, "duration_ms").unwrap().parse().unwrap();
        assert!(ms >= 0.0);
    }
    assert_eq!(field(ops[0], "op"), Some("claim"));
    assert_eq!(field(ops[0], "attempt"), Some("1"));
}

#[test]
fn message_ids_can_be_kept_out_of_spans() {
    let spans = spans_of(async {
        let options = ObserveOptions::new("memory").without_message_ids();
        let inbox = Inbox::new(Observed::new(MemoryStore::new(), options));
        let k = Key::new("billing", "alice@example.com").unwrap();
        inbox
            .handle(&k, None, |_| async { Ok::<_, &str>(None) })
            .await
            .unwrap();
    });
    let inbox_span = spans.iter().find(|s| s.0 == "dedup_inbox");
    let inbox_span = inbox_span.unwrap_or_else(|| panic!("the Inbox's span: {spans:?}"));
    assert_eq!(field(inbox_span, "result"), Some("processed"));
    assert_eq!(field(inbox_span, "attempt"), Some("1"));
    let ops: Vec<_> = spans.iter().filter(|s| s.0 == "dedup").collect();
    assert_eq!(ops.len(), 2, "claim and commit: {spans:?}");
    for span in spans {
        assert!(
            !span.1.values().any(|v| v.contains("alice")),
            "no message id in {span:?}"
        );
        assert_eq!(field(&span, "consumer"), Some("billing"));
    }
}

#[test]
fn each_published_row_has_a_span_with_its_trace_fields() {
    let spans = spans_of(async {
        let outbox = MemoryOutbox::new();
        let message = OutboxMessage::new("orders", "m-1", b"{}".to_vec())
            .unwrap()
            .header(CORRELATION_ID_HEADER, "flow-7")
            .unwrap();
        outbox.enqueue(&[message]).unwrap();
        let relay = Relay::new(Arc::new(outbox), Arc::new(MemoryPublisher::new()));
        assert_eq!(relay.run_once().await.unwrap().sent, 1);
    });
    let publish = spans.iter().find(|s| s.0 == "dedup.outbox.publish");
    let publish = publish.unwrap_or_else(|| panic!("the row's span: {spans:?}"));
    assert_eq!(field(publish, "message_id"), Some("m-1"));
    assert_eq!(field(publish, "outcome"), Some("published"));
    assert_eq!(field(publish, "correlation_id"), Some("flow-7"));
    let trace_id = field(publish, "trace_id").unwrap_or_default();
    assert_eq!(trace_id.len(), 32, "a W3C trace id: {trace_id:?}");
}
