//! Retention on by default, on a real server: a `TxInbox` purges its old records in the
//! background without anyone starting a `Purger`, and a relay purges its old sent rows
//! (the store's manual clock ages them; a short period makes the purge run soon).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_core::outbox::{MemoryPublisher, OutboxMessage, OutboxStore, Relay, RelayConfig};
use dedup_core::{DedupStore, InboxConfig, Key, Retention};
use dedup_postgres::TxInbox;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// The default retention (7 days), looking every 100 ms instead of every 10 minutes.
fn soon() -> Option<Retention> {
    Some(Retention {
        every: Duration::from_millis(100),
        ..Retention::default()
    })
}

/// Wait up to 10 s for `done`.
async fn eventually<F: AsyncFnMut() -> bool>(mut done: F) -> bool {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn a_tx_inbox_purges_its_old_records_by_itself() {
    let url = url_or_skip!();
    let clock = common::manual_clock();
    let store = common::store(&url, "retention_tx", Some(clock.clone())).await;
    let inbox = TxInbox::new(store.clone()).with_config(InboxConfig {
        retention: soon(),
        ..InboxConfig::default()
    });
    let handle = async |id: &str| {
        let key = Key::new("billing", id).unwrap();
        inbox
            .handle(&key, None, |_conn, _lease| {
                Box::pin(async { Ok::<_, std::io::Error>(None) })
            })
            .await
            .expect("processed");
        key
    };
    let old = handle("old").await;
    clock.advance(8 * DAY);
    let recent = handle("recent").await;
    assert!(
        eventually(async || store.get(&old).await.unwrap().is_none()).await,
        "a record processed 8 days ago is purged"
    );
    assert!(store.get(&recent).await.unwrap().is_some());
}

#[tokio::test]
async fn a_relay_purges_its_old_sent_rows() {
    let url = url_or_skip!();
    let clock = common::manual_clock();
    let store = common::store(&url, "retention_relay", Some(clock.clone())).await;
    let outbox = store.outbox();
    let mut conn = store.pool().acquire().await.unwrap();
    outbox
        .enqueue(
            &mut conn,
            &[OutboxMessage::new("invoices", "i-1", b"{}".to_vec()).unwrap()],
        )
        .await
        .unwrap();
    drop(conn);
    let publisher = MemoryPublisher::new();
    let relay = Relay::new(Arc::new(outbox.clone()), Arc::new(publisher.clone())).with_config(
        RelayConfig::default()
            .poll_interval(Duration::from_millis(20))
            .retention(soon()),
    );
    let running = relay.start().expect("the relay starts");
    assert!(eventually(async || outbox.stats().await.unwrap().sent == 1).await);
    // Sent just now: kept through several purges.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(outbox.stats().await.unwrap().sent, 1);
    clock.advance(8 * DAY);
    assert!(
        eventually(async || outbox.stats().await.unwrap().sent == 0).await,
        "a row sent 8 days ago is purged"
    );
    running.stop().await;
    assert_eq!(publisher.message_ids(), ["i-1"]);
}
