//! What the outbox measures have in common: the message a bench producer writes, the
//! enqueue row every backend reports, and the poison-tolerant mutex lock.

use std::sync::{Mutex, MutexGuard};

use dedup_core::outbox::OutboxMessage;
use serde_json::{Map, json};

use crate::bench::driver::Run;
use crate::bench::{Result, Row, row};

/// The message a bench producer writes.
pub(super) fn message(destination: &str, id: String) -> Result<OutboxMessage> {
    Ok(OutboxMessage::new(
        destination,
        id,
        br#"{"order_id":"o-1","item":"book","amount":100}"#.to_vec(),
    )?
    .header("type", "OrderPlaced")?)
}

pub(super) fn enqueue_row(
    backend: &'static str,
    c: usize,
    n: usize,
    runs: &[Run],
    setup: &str,
) -> Row {
    let (with, alone) = (&runs[0], &runs[1]);
    let mut details = Map::new();
    details.insert("library_msgs_per_s".into(), json!(with.throughput(n)));
    details.insert("insert_alone_msgs_per_s".into(), json!(alone.throughput(n)));
    details.insert("messages".into(), json!(n));
    details.insert("setup".into(), json!(setup));
    row(
        backend,
        "outbox_enqueue_vs_insert_alone",
        c,
        "msgs/s",
        (with.throughput(n), alone.throughput(n)),
        details,
    )
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
