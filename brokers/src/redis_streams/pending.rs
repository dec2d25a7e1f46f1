//! [`StreamPending`]: one stream entry, and how it is acked, left pending or
//! dead-lettered.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use redis::Value;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamId;

use super::errors::classify;
use super::{DEAD_ENTRY_ID_FIELD, MESSAGE_ID_FIELD, PAYLOAD_FIELD, dead_stream};
use crate::{Action, BrokerError, DEAD_LETTER_REASON, Delivery, Pending, Shutdown};

/// The stream and the consumer group, shared by the consumer and its deliveries.
#[derive(Debug)]
pub(super) struct Names {
    pub(super) stream: String,
    pub(super) group: String,
}

/// One stream entry, read or reclaimed, and the connection that acks it.
#[derive(Debug)]
pub struct StreamPending {
    delivery: Delivery,
    entry: StreamId,
    names: Arc<Names>,
    acks: MultiplexedConnection,
}

impl StreamPending {
    pub(super) fn new(
        entry: StreamId,
        reclaimed: bool,
        names: Arc<Names>,
        acks: MultiplexedConnection,
    ) -> Self {
        StreamPending {
            delivery: delivery(&entry, reclaimed),
            entry,
            names,
            acks,
        }
    }
}

#[async_trait]
impl Pending for StreamPending {
    fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    async fn settle(mut self, action: Action, _shutdown: &Shutdown) -> Result<(), BrokerError> {
        let (stream, group, id) = (&self.names.stream, &self.names.group, &self.entry.id);
        let settled: redis::RedisResult<()> = match action {
            Action::Ack => {
                redis::cmd("XACK")
                    .arg(stream)
                    .arg(group)
                    .arg(id)
                    .query_async(&mut self.acks)
                    .await
            }
            // Stays pending: reclaimed once idle for `claim_idle`.
            Action::Retry { .. } => Ok(()),
            Action::DeadLetter { reason, headers } => {
                let mut add = redis::cmd("XADD");
                add.arg(dead_stream(stream)).arg("*");
                for (field, value) in &self.entry.map {
                    if headers.iter().any(|(n, _)| n == field) {
                        continue;
                    }
                    if let Some(bytes) = bytes_of(value) {
                        add.arg(field).arg(bytes);
                    }
                }
                add.arg(DEAD_LETTER_REASON)
                    .arg(&reason)
                    .arg(DEAD_ENTRY_ID_FIELD)
                    .arg(id);
                for (field, value) in &headers {
                    add.arg(field).arg(value);
                }
                redis::pipe()
                    .atomic()
                    .add_command(add)
                    .ignore()
                    .cmd("XACK")
                    .arg(stream)
                    .arg(group)
                    .arg(id)
                    .ignore()
                    .query_async(&mut self.acks)
                    .await
            }
        };
        // On an error the entry is left pending: reclaimed later.
        settled.map_err(|e| classify(format!("settling stream entry {id}"), e))
    }
}

/// A bulk or simple string's bytes.
pub(super) fn bytes_of(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn delivery(entry: &StreamId, reclaimed: bool) -> Delivery {
    let text = |v: &Value| bytes_of(v).map(|b| String::from_utf8_lossy(b).into_owned());
    let millis = entry
        .id
        .split_once('-')
        .and_then(|(ms, _)| ms.parse::<u64>().ok());
    Delivery {
        message_id: entry.map.get(MESSAGE_ID_FIELD).and_then(text),
        payload: entry
            .map
            .get(PAYLOAD_FIELD)
            .and_then(bytes_of)
            .map(|b| b.to_vec().into())
            .unwrap_or_default(),
        headers: entry
            .map
            .iter()
            .filter(|(f, _)| *f != MESSAGE_ID_FIELD && *f != PAYLOAD_FIELD)
            .filter_map(|(f, v)| Some((f.clone(), text(v)?)))
            .collect(),
        published_at: millis.map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
        redelivered: reclaimed,
        broker_ref: entry.id.clone(),
    }
}
