//! Writes a few records into an SQLite store, so the `dedup` commands have something to
//! show: `cargo run -p dedup-cli --example seed -- /tmp/dedup.db`, then
//! `dedup --store sqlite:/tmp/dedup.db stats`.
//!
//! Three `billing` records were completed and one lease ran out nine days ago (by an
//! injected clock); the rest is recent: a completed charge, a live lease, a key on its third
//! attempt, and one `shipping` record.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::{ClaimOptions, Clock, DedupStore, Key, Lease, ManualClock, SystemClock};
use dedup_sqlite::{SqliteConfig, SqliteStore};

async fn acquire(store: &SqliteStore, consumer: &str, id: &str, lease: Duration) -> Lease {
    let key = Key::new(consumer, id).expect("key");
    store
        .claim(&key, &ClaimOptions::lease(lease))
        .await
        .expect("claim")
        .into_lease()
        .expect("a fresh key is acquired")
}

#[tokio::main]
async fn main() -> dedup_core::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/tmp/dedup.db".into());
    let past = Arc::new(ManualClock::new(
        SystemClock
            .now()
            .saturating_sub(Duration::from_secs(9 * 86_400)),
    ));
    let old = SqliteStore::open_with(
        &path,
        SqliteConfig {
            clock: Some(past.clone()),
            ..SqliteConfig::default()
        },
    )
    .await?;
    for id in ["order-1001", "order-1002", "order-1003"] {
        let lease = acquire(&old, "billing", id, Duration::from_secs(30)).await;
        old.commit(&lease, Some(b"charged")).await?;
        past.advance(Duration::from_secs(90));
    }
    acquire(&old, "billing", "order-1004", Duration::from_secs(30)).await;

    let store = SqliteStore::open(&path).await?;
    let lease = acquire(&store, "billing", "order-2001", Duration::from_secs(30)).await;
    store.commit(&lease, Some(b"charged 42.00 EUR")).await?;
    let lease = acquire(&store, "billing", "order-2002", Duration::from_secs(30)).await;
    store.commit(&lease, Some(&[0x08, 0x96, 0x01])).await?;
    acquire(&store, "billing", "order-2003", Duration::from_secs(300)).await;
    for _ in 0..2 {
        let lease = acquire(&store, "billing", "order-2004", Duration::from_secs(30)).await;
        store.release(&lease).await?;
    }
    acquire(&store, "billing", "order-2004", Duration::from_secs(600)).await;
    let lease = acquire(&store, "shipping", "order-2001", Duration::from_secs(30)).await;
    store.commit(&lease, None).await?;
    println!("seeded {path}");
    Ok(())
}
