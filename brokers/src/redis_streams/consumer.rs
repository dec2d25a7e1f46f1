//! [`StreamConsumer`]: a consumer group's entries through a [`Handle`].

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use redis::aio::MultiplexedConnection;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply};
use redis::{AsyncConnectionConfig, Value};

use super::{DEAD_ENTRY_ID_FIELD, MESSAGE_ID_FIELD, PAYLOAD_FIELD, dead_stream};
use crate::action::{Counters, decide};
use crate::in_flight::InFlight;
use crate::{
    Action, BrokerError, ConsumerConfig, ConsumerStats, DEAD_LETTER_REASON, Delivery, Handle,
    Shutdown,
};

/// Consumes a stream as member `worker` of consumer group `group` (created at the
/// stream's start, with the stream, if missing). The consumer name of the inbox keys is the
/// group by default; the message id is the entry's `message_id` field; the broker timestamp
/// is the entry id's millisecond part.
///
/// Each round it first reclaims (`XAUTOCLAIM`) entries pending longer than
/// [`claim_idle`](Self::claim_idle) with any member of the group (a dead worker's, or its
/// own retries), then reads new ones (`XREADGROUP ... >`), never more than its free
/// in-flight slots. Actions: ack is `XACK`; a retry leaves the entry pending, so the
/// redelivery comes after `claim_idle` whatever delay was asked; a dead letter is
/// `XADD <stream>:dead` (the entry's fields plus the reason and the entry id) and `XACK`
/// in one `MULTI`.
#[derive(Debug)]
pub struct StreamConsumer {
    client: redis::Client,
    stream: String,
    group: String,
    worker: String,
    config: ConsumerConfig,
    claim_idle: Duration,
    block: Duration,
}

impl StreamConsumer {
    /// A consumer of `stream` in `group` as `worker` (a name unique among the group's
    /// live members, e.g. host and process id). Reclaims after 30 s idle by default.
    pub fn new(
        client: redis::Client,
        stream: impl Into<String>,
        group: impl Into<String>,
        worker: impl Into<String>,
        config: ConsumerConfig,
    ) -> Self {
        StreamConsumer {
            client,
            stream: stream.into(),
            group: group.into(),
            worker: worker.into(),
            config,
            claim_idle: Duration::from_secs(30),
            block: Duration::from_millis(200),
        }
    }

    /// Reclaim entries pending at least this long: longer than a handler runs, or a busy
    /// entry is taken from a live worker (harmless, the inbox answers `Busy`, but wasted).
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.claim_idle = idle;
        self
    }

    /// Consume until `shutdown` fires (then: stop reading, let started handlers finish and
    /// settle; nothing is held unstarted) or Redis fails (an error, after the started
    /// handlers settled). Returns the counts of what happened.
    pub async fn run<H: Handle>(
        self,
        handler: H,
        shutdown: Shutdown,
    ) -> Result<ConsumerStats, BrokerError> {
        self.config.check()?;
        if self.claim_idle.is_zero() {
            return Err(BrokerError::Config("claim_idle must be above zero".into()));
        }
        let reads_config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(self.block + Duration::from_secs(5)));
        let mut reads = self
            .client
            .get_multiplexed_async_connection_with_config(&reads_config)
            .await
            .map_err(|e| BrokerError::broker("connecting to Redis", e))?;
        let acks = self
            .client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| BrokerError::broker("connecting to Redis", e))?;
        let created: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.stream)
            .arg(&self.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut reads)
            .await;
        if let Err(e) = created
            && e.code() != Some("BUSYGROUP")
        {
            return Err(BrokerError::broker("XGROUP CREATE", e));
        }
        let shared = Arc::new(Shared {
            consumer: self.config.consumer_name(&self.group).to_owned(),
            stream: self.stream.clone(),
            group: self.group.clone(),
            config: self.config.clone(),
            handler,
            counters: Counters::default(),
            acks,
        });
        let mut in_flight = InFlight::new(self.config.in_flight);
        let mut cursor = "0-0".to_owned();
        let mut last_claim: Option<Instant> = None;
        let mut failure = None;
        loop {
            let mut permits = in_flight.slots(&shutdown).await;
            if permits.is_empty() {
                break;
            }
            // Reclaimed entries start at once, before the (blocking) read of new ones.
            if last_claim.is_none_or(|t| t.elapsed() >= self.claim_idle / 2) {
                last_claim = Some(Instant::now());
                let reply: redis::RedisResult<StreamAutoClaimReply> = redis::cmd("XAUTOCLAIM")
                    .arg(&self.stream)
                    .arg(&self.group)
                    .arg(&self.worker)
                    .arg(self.claim_idle.as_millis() as u64)
                    .arg(&cursor)
                    .arg("COUNT")
                    .arg(permits.len())
                    .query_async(&mut reads)
                    .await;
                match reply {
                    Ok(reply) => {
                        cursor = reply.next_stream_id;
                        for entry in reply.claimed {
                            let Some(permit) = permits.pop() else { break };
                            let shared = Arc::clone(&shared);
                            in_flight
                                .start(permit, async move { shared.settle(entry, true).await })
                                .await;
                        }
                    }
                    Err(e) => {
                        failure = Some(BrokerError::broker("XAUTOCLAIM", e));
                        break;
                    }
                }
            }
            if permits.is_empty() {
                continue;
            }
            let opts = StreamReadOptions::default()
                .group(&self.group, &self.worker)
                .count(permits.len())
                .block(self.block.as_millis() as usize);
            let keys = [self.stream.as_str()];
            // Not cancelled on shutdown: Redis may already have handed entries over (they
            // would stay pending for this worker until reclaimed). The read returns within
            // `block`, and what it got is handled.
            let read = redis::AsyncCommands::xread_options::<_, _, Option<StreamReadReply>>(
                &mut reads,
                &keys,
                &[">"],
                &opts,
            )
            .await;
            match read {
                Ok(reply) => {
                    for entry in reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
                        let Some(permit) = permits.pop() else { break };
                        let shared = Arc::clone(&shared);
                        in_flight
                            .start(permit, async move { shared.settle(entry, false).await })
                            .await;
                    }
                }
                Err(e) => {
                    failure = Some(BrokerError::broker("XREADGROUP", e));
                    break;
                }
            }
        }
        in_flight.drain().await;
        match failure {
            Some(e) => Err(e),
            None => Ok(shared.counters.snapshot()),
        }
    }
}

struct Shared<H> {
    consumer: String,
    stream: String,
    group: String,
    config: ConsumerConfig,
    handler: H,
    counters: Counters,
    acks: MultiplexedConnection,
}

impl<H: Handle> Shared<H> {
    async fn settle(&self, entry: StreamId, reclaimed: bool) {
        let delivery = delivery(&entry, reclaimed);
        let action = decide(
            &self.handler,
            &self.consumer,
            &delivery,
            &self.config,
            &self.counters,
        )
        .await;
        let mut conn = self.acks.clone();
        let settled: redis::RedisResult<()> = match action {
            Action::Ack => {
                redis::cmd("XACK")
                    .arg(&self.stream)
                    .arg(&self.group)
                    .arg(&entry.id)
                    .query_async(&mut conn)
                    .await
            }
            // Stays pending: reclaimed once idle for `claim_idle`.
            Action::Retry { .. } => Ok(()),
            Action::DeadLetter { reason } => {
                let mut add = redis::cmd("XADD");
                add.arg(dead_stream(&self.stream)).arg("*");
                for (field, value) in &entry.map {
                    if let Some(bytes) = bytes_of(value) {
                        add.arg(field).arg(bytes);
                    }
                }
                add.arg(DEAD_LETTER_REASON)
                    .arg(&reason)
                    .arg(DEAD_ENTRY_ID_FIELD)
                    .arg(&entry.id);
                redis::pipe()
                    .atomic()
                    .add_command(add)
                    .ignore()
                    .cmd("XACK")
                    .arg(&self.stream)
                    .arg(&self.group)
                    .arg(&entry.id)
                    .ignore()
                    .query_async(&mut conn)
                    .await
            }
        };
        if let Err(e) = settled {
            // Left pending: reclaimed later.
            tracing::warn!(error = %e, entry = %entry.id, "could not settle a stream entry");
            Counters::bump(&self.counters.settle_errors);
        }
    }
}

fn bytes_of(value: &Value) -> Option<&[u8]> {
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
