//! Parcel tracking: one `ParcelCreated` event consumed by two consumers, notification and
//! carrier booking. Idempotency is per consumer: each does its work once, independently,
//! and the carrier call (not idempotent) happens once even though the event is redelivered
//! (once after the carrier consumer crashed before its ack, once more by a publisher retry).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use clap::Parser;
use dedup_core::{Handled, Inbox, InboxConfig, Key};
use dedup_examples::report::{print_json, print_table};

/// Two consumers of one event, each processing it once.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Store URL (default: an SQLite file in a temporary folder).
    #[arg(long)]
    store: Option<String>,
}

#[derive(Default)]
struct World {
    notifications_sent: AtomicU32,
    carrier_bookings: AtomicU32,
}

#[derive(serde::Serialize)]
struct Row {
    consumer: &'static str,
    deliveries: u32,
    processed: u32,
    duplicates: u32,
    side_effects: u32,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let tmp = tempfile::tempdir()?;
    let url = dedup_examples::url_or_temp_sqlite(args.store, tmp.path(), "parcel.db");
    let store = dedup::open(&url).await?;
    let world = Arc::new(World::default());
    let event_id = format!("parcel-created-{}", uuid::Uuid::new_v4().simple());
    let config = InboxConfig {
        lease: Duration::from_millis(300),
        ..InboxConfig::default()
    };
    let inbox = Inbox::from_arc(Arc::clone(&store), config);

    // The broker's view: deliveries of the one event to each consumer's queue.
    // notification: delivered twice (publisher retry).
    // carrier-booking: delivered three times: the first worker books the courier and
    // commits, then dies before its ack; the broker redelivers; the publisher retry arrives.
    let mut rows = Vec::new();
    let (mut processed, mut duplicates) = (0, 0);
    for _ in 0..2 {
        let key = Key::new("notification", event_id.as_str())?;
        let w = &world;
        match inbox
            .handle(&key, None, |_lease| async move {
                w.notifications_sent.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Some(b"sms sent".to_vec()))
            })
            .await?
        {
            Handled::Processed { .. } => processed += 1,
            Handled::Duplicate { .. } => duplicates += 1,
            Handled::Busy { .. } => unreachable!("nothing else holds the key"),
            Handled::Failed { .. } | Handled::DeadLetter { .. } => {
                unreachable!("no attempt limit or stored failures are configured")
            }
        }
    }
    rows.push(Row {
        consumer: "notification",
        deliveries: 2,
        processed,
        duplicates,
        side_effects: world.notifications_sent.load(Ordering::SeqCst),
    });

    // carrier-booking: delivered three times. The first worker books the courier and
    // commits, then its process dies before the ack; the broker redelivers; then the
    // publisher's retry arrives. The two later deliveries run on two workers at once.
    let key = Key::new("carrier-booking", event_id.as_str())?;
    let book = |w: Arc<World>| {
        move |_lease| {
            let w = Arc::clone(&w);
            async move {
                // The carrier's API is not idempotent: every call books a courier.
                tokio::time::sleep(Duration::from_millis(50)).await;
                w.carrier_bookings.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Some(b"courier booked".to_vec()))
            }
        }
    };
    let first = inbox.handle(&key, None, book(Arc::clone(&world))).await?;
    let (mut processed, mut duplicates) = (0, 0);
    let mut count = |h: &Handled| match h {
        Handled::Processed { .. } => processed += 1,
        Handled::Duplicate { .. } => duplicates += 1,
        Handled::Busy { .. } => duplicates += 1,
        Handled::Failed { .. } | Handled::DeadLetter { .. } => {
            unreachable!("no attempt limit or stored failures are configured")
        }
    };
    count(&first);
    // ... crash before the ack: the broker redelivers, and the publisher retry arrives.
    let (again, retry) = tokio::join!(
        inbox.handle(&key, None, book(Arc::clone(&world))),
        inbox.handle(&key, None, book(Arc::clone(&world))),
    );
    count(&again?);
    count(&retry?);
    rows.push(Row {
        consumer: "carrier-booking",
        deliveries: 3,
        processed,
        duplicates,
        side_effects: world.carrier_bookings.load(Ordering::SeqCst),
    });

    let headers = [
        "consumer",
        "deliveries",
        "handler runs",
        "duplicates skipped",
        "side effects",
    ];
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let counts = [r.deliveries, r.processed, r.duplicates, r.side_effects];
            std::iter::once(r.consumer.to_string())
                .chain(counts.map(|n| n.to_string()))
                .collect()
        })
        .collect();
    print_table(&headers, &table);
    rows.iter().for_each(print_json);
    Ok(())
}
