//! The scripted workload of the `metrics` program: an inbox on the observed store meets
//! new orders, redeliveries, a crashed worker's lease taken over, a poison message
//! dead-lettered and a declined card stored as a failure, so every metric moves.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::layers::Observed;
use dedup_core::{
    BoxError, ClaimOptions, DedupStore, FailurePolicy, Handled, Inbox, InboxConfig, Key,
};

/// What a processed order stores for its duplicates (as JSON).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Receipt {
    order: usize,
    charged_cents: u64,
}

/// What the workload's deliveries came to.
#[derive(Debug, Default, serde::Serialize)]
pub struct Tally {
    /// Deliveries whose handler ran and completed.
    pub processed: usize,
    /// Deliveries answered with the stored receipt.
    pub duplicates: usize,
    /// Keys taken over after a lease ran out (from the layer's counts).
    pub takeovers: u64,
    /// Deliveries told to dead-letter.
    pub dead_lettered: usize,
    /// Deliveries answered with a stored failure.
    pub failed: usize,
}

/// Run the workload on `store` with a lease of `lease`: `orders` new orders, then the
/// first `redeliveries` of them delivered again, then the crash, poison and decline cases.
pub async fn run(
    store: &Arc<Observed<Arc<dyn DedupStore>>>,
    lease: Duration,
    orders: usize,
    redeliveries: usize,
) -> Result<Tally, BoxError> {
    // A consumer name of its own per run, so a shared server store starts empty.
    let consumer = format!(
        "billing-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let key = |id: &str| Key::new(consumer.as_str(), id);
    let config = InboxConfig {
        lease,
        ..InboxConfig::default()
    };
    let inbox = Inbox::from_arc(store.clone(), config.clone());
    let mut tally = Tally::default();

    // New orders, then some of them redelivered: duplicates get the receipt back.
    let deliveries = (0..orders).chain(0..redeliveries.min(orders));
    for order in deliveries {
        let charge = |_lease| async move {
            Ok::<_, std::io::Error>(Receipt {
                order,
                charged_cents: 4999,
            })
        };
        match inbox
            .handle_json(&key(&format!("order-{order}"))?, None, charge)
            .await?
        {
            Handled::Processed { .. } => tally.processed += 1,
            Handled::Duplicate { .. } => tally.duplicates += 1,
            other => return Err(format!("order {order}: unexpected {other:?}").into()),
        }
    }

    // A worker claimed an order and crashed: its short lease runs out and the redelivery
    // takes the key over (attempt 2).
    let crashed = key("order-crashed")?;
    store
        .claim(&crashed, &ClaimOptions::lease(Duration::from_millis(200)))
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let handled = inbox
        .handle(&crashed, None, |_| async { Ok::<_, std::io::Error>(None) })
        .await?;
    if matches!(&handled, Handled::Processed { lease, .. } if lease.attempt == 2) {
        tally.processed += 1;
    }

    // A poison message: at most 2 attempts, then every delivery is told to dead-letter.
    let poison = Inbox::from_arc(
        store.clone(),
        InboxConfig {
            max_attempts: Some(2),
            ..config.clone()
        },
    );
    let malformed = key("order-malformed")?;
    for _ in 0..4 {
        let parse = |_| async { Err::<Option<Vec<u8>>, _>("malformed payload: no amount") };
        if let Ok(Handled::DeadLetter { .. }) = poison.handle(&malformed, None, parse).await {
            tally.dead_lettered += 1;
        }
    }

    // A declined card is a final answer: stored, and replayed to the redelivery.
    let stored = Inbox::from_arc(
        store.clone(),
        InboxConfig {
            failures: FailurePolicy::Store,
            ..config
        },
    );
    let declined = key("order-declined")?;
    for _ in 0..2 {
        let charge = |_| async { Err::<Option<Vec<u8>>, _>("card declined") };
        if let Handled::Failed { .. } = stored.handle(&declined, None, charge).await? {
            tally.failed += 1;
        }
    }
    tally.takeovers = store.counts().takeovers;
    Ok(tally)
}
