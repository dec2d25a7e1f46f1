//! Typed outcomes (`serde` feature): a handler's value is stored as JSON and a duplicate
//! gets it back decoded.
#![cfg(feature = "serde")]

mod support;

use dedup_core::{ClaimOptions, DedupStore, Handled, Inbox, InboxError, Key, RecordState};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Invoice {
    number: u64,
    amount_cents: i64,
    lines: Vec<String>,
}

#[tokio::test(start_paused = true)]
async fn a_typed_outcome_round_trips_through_the_store() {
    let inbox = Inbox::new(support::tokio_store());
    let key = Key::new("billing", "order-7").unwrap();
    let invoice = Invoice {
        number: 7,
        amount_cents: 1999,
        lines: vec!["book".into(), "pen \u{e9}".into()],
    };
    let issue = |_| async { Ok::<_, std::io::Error>(invoice.clone()) };
    let first = inbox.handle_json(&key, None, issue).await.unwrap();
    assert!(matches!(&first, Handled::Processed { outcome, .. } if *outcome == invoice));
    let second = inbox
        .handle_json::<Invoice, _, _, _>(&key, None, issue)
        .await
        .unwrap();
    assert!(second.is_replay());
    assert!(matches!(second, Handled::Duplicate { outcome, .. } if outcome == invoice));
    // Stored as JSON, readable in the store.
    let record = inbox.store().get(&key).await.unwrap().unwrap();
    let RecordState::Completed {
        outcome: Some(bytes),
        ..
    } = record.state
    else {
        panic!("{record:?}")
    };
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()["amount_cents"],
        1999
    );
}

#[tokio::test(start_paused = true)]
async fn an_outcome_of_another_type_is_a_decode_error() {
    let inbox = Inbox::new(support::tokio_store());
    let key = Key::new("billing", "raw").unwrap();
    let lease = inbox
        .store()
        .claim(&key, &ClaimOptions::default())
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    inbox
        .store()
        .commit(&lease, Some(b"not json"))
        .await
        .unwrap();
    let err = inbox
        .handle_json(&key, None, |_| async { Ok::<_, std::io::Error>(1u32) })
        .await
        .unwrap_err();
    assert!(matches!(err, InboxError::Outcome { .. }), "{err:?}");
    // A key completed without an outcome decodes as null.
    let none = Key::new("billing", "none").unwrap();
    let lease = inbox
        .store()
        .claim(&none, &ClaimOptions::default())
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    inbox.store().commit(&lease, None).await.unwrap();
    let handled = inbox
        .handle_json(&none, None, |_| async {
            Ok::<_, std::io::Error>(Some(1u32))
        })
        .await
        .unwrap();
    assert!(matches!(handled, Handled::Duplicate { outcome: None, .. }));
}
