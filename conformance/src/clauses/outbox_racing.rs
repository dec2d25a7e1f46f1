//! Relays racing: several nodes taking rows of a few ordering keys at once never hold two
//! rows of one key, take each key's rows in id order, and send every row once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::outbox::{commit, msg, setup};
use crate::outbox::OutboxFactory;

/// Four nodes (four handles on one outbox: four pools on a server) take rows of four
/// ordering keys, three at a time, "publish" for a few milliseconds and mark them sent.
/// Each notes, per row, when its take returned and when it began marking: both lie inside
/// the row's real hold, so two such spans of one key that overlap mean two live holds on
/// the key at once. Per key the rows must also be taken in id order, and every row must be
/// sent exactly once. (Holds are an hour on the context's clock, which does not move: no
/// hold runs out.)
pub async fn outbox_racing_relays_never_hold_two_rows_of_one_key<F: OutboxFactory>(factory: &F) {
    const KEYS: usize = 4;
    const PER_KEY: usize = 25;
    let (ctx, outbox) = setup(factory, "outbox_racing").await;
    let mut messages = Vec::new();
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            messages.push(
                msg("orders", &format!("m-{k}-{i}"))
                    .ordering_key(format!("key-{k}"))
                    .expect("valid key"),
            );
        }
    }
    // Several transactions, so the ids of one key are spread among the others'.
    for chunk in messages.chunks(10) {
        commit(&outbox, chunk).await;
    }
    let started = Instant::now();
    type Span = (String, i64, Duration, Duration);
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let mut relays = Vec::new();
    for node in 0..4u64 {
        let store = factory.open(&ctx).await.store;
        let spans = Arc::clone(&spans);
        relays.push(tokio::spawn(async move {
            let mut idle = 0;
            while idle < 20 {
                let held = store
                    .take(3, Duration::from_secs(3600))
                    .await
                    .expect("take");
                let taken_at = started.elapsed();
                if held.rows.is_empty() {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                idle = 0;
                // "Publishing": long enough for the others to try the same keys.
                tokio::time::sleep(Duration::from_millis(2 + node)).await;
                let marking_at = started.elapsed();
                let ids: Vec<i64> = held.rows.iter().map(|row| row.id).collect();
                let mut marked = store.mark_sent(&held.token, &ids).await.expect("mark");
                marked.sort_unstable();
                let mut expected = ids.clone();
                expected.sort_unstable();
                assert_eq!(marked, expected, "a live hold's marks all apply");
                let mut spans = spans.lock().expect("spans");
                for row in &held.rows {
                    let key = row.ordering_key.clone().expect("every row has a key");
                    spans.push((key, row.id, taken_at, marking_at));
                }
            }
        }));
    }
    for relay in relays {
        relay.await.expect("relay task");
    }
    let spans = spans.lock().expect("spans").clone();
    assert_eq!(spans.len(), KEYS * PER_KEY, "every row sent exactly once");
    let mut by_key: HashMap<String, Vec<(i64, Duration, Duration)>> = HashMap::new();
    for (key, id, from, to) in spans {
        by_key.entry(key).or_default().push((id, from, to));
    }
    for (key, mut rows) in by_key {
        rows.sort_by_key(|(_, from, _)| *from);
        for pair in rows.windows(2) {
            let ((a, _, a_end), (b, b_start, _)) = (pair[0], pair[1]);
            assert!(a < b, "{key}: row {b} taken after row {a}, out of id order");
            assert!(
                a_end <= b_start,
                "{key}: rows {a} and {b} were held at once ({a_end:?} > {b_start:?})"
            );
        }
    }
    let stats = outbox.store.stats().await.expect("stats");
    assert_eq!(
        (stats.sent, stats.pending, stats.held),
        ((KEYS * PER_KEY) as u64, 0, 0),
        "every row sent, none left"
    );
}
