//! Retention on by default: an inbox set up with the defaults purges its store in the
//! background (records older than 7 days, every 10 minutes), without anyone starting a
//! `Purger`; turned off it does not; the purge starts once per inbox, not per call, and
//! stops when the last clone is dropped; an outbox relay purges its sent rows. Tokio's
//! paused clock runs the 10-minute periods at once; the store's manual clock ages the
//! records.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::outbox::{MemoryOutbox, MemoryPublisher, OutboxMessage, OutboxStore, Relay};
use dedup_core::{DedupStore, Inbox, InboxConfig, Key, ManualClock, MemoryStore, Retention};

const DAY: Duration = Duration::from_secs(24 * 3600);
const HOUR: Duration = Duration::from_secs(3600);

async fn processed(inbox: &Inbox<MemoryStore>, id: &str) -> Key {
    let key = Key::new("billing", id).unwrap();
    inbox
        .handle(&key, None, |_| async { Ok::<_, std::io::Error>(None) })
        .await
        .expect("processed");
    key
}

/// The record of `key` in `store`, if not purged.
async fn kept(store: &MemoryStore, key: &Key) -> bool {
    store.get(key).await.expect("get").is_some()
}

fn tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test(start_paused = true)]
async fn a_default_inbox_purges_records_older_than_seven_days_by_itself() {
    let clock = Arc::new(ManualClock::starting_now());
    let inbox = Inbox::new(MemoryStore::with_clock(clock.clone()));
    assert_eq!(inbox.config().retention, Some(Retention::default()));
    let old = processed(&inbox, "old").await;
    clock.advance(8 * DAY);
    let recent = processed(&inbox, "recent").await;
    tokio::time::sleep(HOUR).await;
    assert!(!kept(inbox.store(), &old).await, "8 days old: purged");
    assert!(kept(inbox.store(), &recent).await, "just processed: kept");
}

#[tokio::test(start_paused = true)]
async fn turned_off_the_records_stay() {
    let clock = Arc::new(ManualClock::starting_now());
    let inbox = Inbox::new(MemoryStore::with_clock(clock.clone())).with_config(InboxConfig {
        retention: None,
        ..InboxConfig::default()
    });
    let old = processed(&inbox, "old").await;
    clock.advance(30 * DAY);
    processed(&inbox, "recent").await;
    tokio::time::sleep(24 * HOUR).await;
    assert!(kept(inbox.store(), &old).await, "no retention: kept");
}

#[tokio::test(start_paused = true)]
async fn a_tuned_retention_keeps_records_as_long_as_asked() {
    let clock = Arc::new(ManualClock::starting_now());
    let inbox = Inbox::new(MemoryStore::with_clock(clock.clone())).with_config(InboxConfig {
        retention: Some(Retention {
            keep: 30 * DAY,
            every: Duration::from_secs(60),
        }),
        ..InboxConfig::default()
    });
    let old = processed(&inbox, "old").await;
    clock.advance(8 * DAY);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(kept(inbox.store(), &old).await, "8 of 30 days: kept");
    clock.advance(23 * DAY);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(!kept(inbox.store(), &old).await, "31 of 30 days: purged");
}

#[tokio::test(start_paused = true)]
async fn one_purge_per_inbox_started_by_the_first_delivery_and_stopped_with_the_last_clone() {
    let clock = Arc::new(ManualClock::starting_now());
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let before = tasks();
    let inbox = Inbox::from_arc(Arc::clone(&store), InboxConfig::default());
    assert_eq!(tasks(), before, "nothing runs before the first delivery");
    let clone = inbox.clone();
    let mut keys = Vec::new();
    for i in 0..20 {
        let on = if i % 2 == 0 { &inbox } else { &clone };
        keys.push(processed(on, &format!("m{i}")).await);
    }
    assert_eq!(tasks(), before + 1, "one purge for the inbox and its clone");
    drop(inbox);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(tasks(), before + 1, "a clone still runs it");
    drop(clone);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(tasks(), before, "the last clone dropped: stopped");
    clock.advance(8 * DAY);
    tokio::time::sleep(24 * HOUR).await;
    for key in &keys {
        assert!(kept(&store, key).await, "no inbox left, nothing purges");
    }
}

#[test]
fn an_inbox_needs_no_runtime_until_it_handles_a_delivery() {
    let inbox = Inbox::new(MemoryStore::new());
    let clone = inbox.clone();
    drop(inbox);
    drop(clone);
}

#[tokio::test(start_paused = true)]
async fn a_default_relay_purges_its_sent_rows() {
    let clock = Arc::new(ManualClock::starting_now());
    let outbox = MemoryOutbox::with_clock(clock.clone());
    let publisher = MemoryPublisher::new();
    outbox
        .enqueue(&[OutboxMessage::new("invoices", "i-1", b"{}".to_vec()).unwrap()])
        .unwrap();
    let relay = Relay::new(Arc::new(outbox.clone()), Arc::new(publisher.clone()));
    assert_eq!(relay.config().retention, Some(Retention::default()));
    let handle = relay.start().expect("the relay starts");
    while publisher.message_ids().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(outbox.stats().await.unwrap().sent, 1);
    clock.advance(8 * DAY);
    tokio::time::sleep(HOUR).await;
    assert_eq!(
        outbox.stats().await.unwrap().sent,
        0,
        "sent 8 days ago: purged"
    );
    handle.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_relay_without_retention_keeps_its_sent_rows() {
    let clock = Arc::new(ManualClock::starting_now());
    let outbox = MemoryOutbox::with_clock(clock.clone());
    let publisher = MemoryPublisher::new();
    outbox
        .enqueue(&[OutboxMessage::new("invoices", "i-1", b"{}".to_vec()).unwrap()])
        .unwrap();
    let handle = Relay::new(Arc::new(outbox.clone()), Arc::new(publisher.clone()))
        .with_config(dedup_core::outbox::RelayConfig::default().retention(None))
        .start()
        .expect("the relay starts");
    while publisher.message_ids().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    clock.advance(30 * DAY);
    tokio::time::sleep(24 * HOUR).await;
    assert_eq!(outbox.stats().await.unwrap().sent, 1, "no retention: kept");
    handle.stop().await;
}
