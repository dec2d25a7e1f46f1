//! Retention on by default, on a real file: a lease-mode `Inbox` over an `SqliteStore`
//! purges its old records in the background without anyone starting a `Purger` (the
//! store's manual clock ages them; a short period makes the purge run soon).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_core::{DedupStore, Inbox, InboxConfig, Key, ManualClock, Retention};
use dedup_sqlite::{SqliteConfig, SqliteStore};

const DAY: Duration = Duration::from_secs(24 * 3600);

async fn inbox(
    dir: &tempfile::TempDir,
    retention: Option<Retention>,
) -> (Inbox<SqliteStore>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::starting_now());
    let store = SqliteStore::open_with(
        dir.path().join("inbox.db"),
        SqliteConfig {
            clock: Some(clock.clone()),
            ..SqliteConfig::default()
        },
    )
    .await
    .expect("open");
    let config = InboxConfig {
        retention,
        ..InboxConfig::default()
    };
    (Inbox::new(store).with_config(config), clock)
}

async fn processed(inbox: &Inbox<SqliteStore>, id: &str) -> Key {
    let key = Key::new("billing", id).unwrap();
    inbox
        .handle(&key, None, |_| async { Ok::<_, std::io::Error>(None) })
        .await
        .expect("processed");
    key
}

#[tokio::test]
async fn an_inbox_purges_its_old_records_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Retention {
        every: Duration::from_millis(100),
        ..Retention::default()
    };
    let (inbox, clock) = inbox(&dir, Some(retention)).await;
    let old = processed(&inbox, "old").await;
    clock.advance(8 * DAY);
    let recent = processed(&inbox, "recent").await;
    let started = Instant::now();
    while inbox.store().get(&old).await.unwrap().is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a record processed 8 days ago is purged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(inbox.store().get(&recent).await.unwrap().is_some());
}
