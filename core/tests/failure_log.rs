//! A poison message's cause, kept and shown: each failed attempt logs the consumer, the
//! message id, the attempt and the cause chain, keeps the cause on the record (readable
//! with `get`), and the dead letter keeps the last one, in its log line, its `Handled` and
//! its record.

mod support;

use dedup_core::{
    Admin, DedupStore, Handled, Inbox, InboxConfig, InboxError, Key, MemoryStore, Status,
};
use support::warnings::Warnings;

#[derive(Debug, thiserror::Error)]
#[error("invoice payload is not valid JSON")]
struct Malformed(#[source] std::num::ParseIntError);

fn malformed() -> Malformed {
    Malformed("x".parse::<u32>().unwrap_err())
}

#[test]
fn a_poison_message_cause_is_logged_kept_and_dead_lettered_with_it() {
    let warnings = Warnings::default();
    let _guard = tracing::subscriber::set_default(warnings.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = std::sync::Arc::new(MemoryStore::new());
    runtime.block_on(async {
        let inbox = Inbox::from_arc(
            std::sync::Arc::clone(&store),
            InboxConfig {
                max_attempts: Some(2),
                ..InboxConfig::default()
            },
        )
        .with_worker("billing-7");
        let key = Key::new("orders", "poison-1").unwrap();
        let fail = |_| async { Err::<Option<Vec<u8>>, _>(malformed()) };
        for attempt in 1..=2u32 {
            let err = inbox.handle(&key, None, fail).await.unwrap_err();
            let InboxError::Handler { failure, .. } = &err else {
                panic!("{err:?}")
            };
            assert_eq!(failure.attempt, attempt);
            assert!(
                err.to_string().contains(&format!("at attempt {attempt}")),
                "{err}"
            );
            // The released record keeps the cause.
            let record = store.get(&key).await.unwrap().unwrap();
            let kept = record
                .last_failure
                .expect("the cause is kept on the record");
            assert_eq!(kept.kind, "handler");
            assert_eq!(kept.attempt, attempt);
            assert_eq!(kept.worker.as_deref(), Some("billing-7"));
            assert_eq!(
                kept.chain,
                [
                    "invoice payload is not valid JSON",
                    "invalid digit found in string"
                ]
            );
        }
        let handled = inbox.handle(&key, None, fail).await.unwrap();
        let Handled::DeadLetter {
            attempts: 2,
            replay: false,
            cause: Some(cause),
        } = &handled
        else {
            panic!("{handled:?}")
        };
        assert_eq!(cause.attempt, 2);
        let record = store.get(&key).await.unwrap().unwrap();
        assert_eq!(record.failure().as_ref(), Some(cause));
        let now = store.now().await.unwrap();
        assert_eq!(Status::of(&record, now), Status::DeadLettered);
        let stats = store.stats(10).await.unwrap();
        assert_eq!(
            (stats.dead_lettered, stats.completed),
            (1, 0),
            "a dead letter is never counted as processed"
        );
    });
    let seen = warnings.seen();
    let failed: Vec<_> = seen
        .iter()
        .filter(|f| f["message"].contains("attempt failed"))
        .collect();
    assert_eq!(failed.len(), 2, "{seen:?}");
    for (fields, attempt) in failed.iter().zip(["1", "2"]) {
        assert_eq!(fields["consumer"], "orders");
        assert_eq!(fields["message_id"], "poison-1");
        assert_eq!(fields["attempt"], attempt);
        assert_eq!(fields["kind"], "handler");
        assert_eq!(
            fields["cause"],
            "invoice payload is not valid JSON: invalid digit found in string"
        );
        assert!(
            fields["message"].contains("released for a retry"),
            "{fields:?}"
        );
    }
    let dead: Vec<_> = seen
        .iter()
        .filter(|f| f["message"].contains("dead-lettered"))
        .collect();
    assert_eq!(dead.len(), 1, "{seen:?}");
    assert_eq!(dead[0]["message_id"], "poison-1");
    assert_eq!(dead[0]["attempts"], "2");
    assert_eq!(dead[0]["attempt"], "3");
    assert!(dead[0]["cause"].contains("invalid digit"), "{:?}", dead[0]);
}
