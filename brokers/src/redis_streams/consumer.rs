//! [`StreamConsumer`]: a consumer group's entries through a [`Handle`].

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply};
use redis::{AsyncConnectionConfig, Value};

use super::errors::classify;
use super::{DEAD_ENTRY_ID_FIELD, MESSAGE_ID_FIELD, PAYLOAD_FIELD, dead_stream};
use crate::{
    Action, BrokerError, ConsumerConfig, ConsumerStats, DEAD_LETTER_REASON, Delivery, Handle,
    Health, Pending, Shutdown, Source, consume_with_health,
};

/// Consumes a Redis stream as member `worker` of consumer group `group`.
///
/// The group is created at the stream's start if missing, with the stream.
/// - Key: the entry's `message_id` field. The consumer name is the group's by default.
/// - Broker timestamp: the entry id's millisecond part.
/// - Ack: `XACK`.
/// - Retry: the entry stays pending. It comes back after
///   [`claim_idle`](Self::claim_idle), whatever delay was asked.
/// - Dead letter: `XADD <stream>:dead` (the entry's fields, the reason and the entry id)
///   and `XACK`, in one `MULTI`.
///
/// Each round it first reclaims (`XAUTOCLAIM`) entries pending longer than `claim_idle`,
/// with any member of the group: a dead worker's, or its own retries. Then it reads new
/// ones (`XREADGROUP ... >`). It never takes more than its free in-flight slots.
///
/// redis-rs's multiplexed connections do not reconnect by themselves. After a lost
/// connection the receive loop opens new ones. Entries read before stay pending and are
/// reclaimed.
///
/// # Examples
///
/// ```no_run
/// use dedup_brokers::redis_streams::StreamConsumer;
/// use dedup_brokers::{ConsumerConfig, shutdown, with_inbox};
/// use dedup_core::{BoxError, Inbox, MemoryStore};
///
/// # async fn example() -> Result<(), BoxError> {
/// let inbox = Inbox::new(MemoryStore::new()); // your store
/// let handler = with_inbox(inbox, |_lease, delivery| async move {
///     println!("{} bytes", delivery.payload.len());
///     Ok::<_, BoxError>(None)
/// });
///
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let consumer = StreamConsumer::new(client, "orders", "billing", "worker-1", ConsumerConfig::default());
/// let (stop, signal) = shutdown();
/// let running = tokio::spawn(consumer.run(handler, signal));
/// // ... later, on SIGTERM:
/// stop.shut_down();
/// running.await??;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct StreamConsumer {
    client: redis::Client,
    names: Arc<Names>,
    worker: String,
    config: ConsumerConfig,
    health: Health,
    claim_idle: Duration,
    block: Duration,
    conns: Option<(MultiplexedConnection, MultiplexedConnection)>,
    cursor: String,
    last_claim: Option<Instant>,
}

#[derive(Debug)]
struct Names {
    stream: String,
    group: String,
}

impl StreamConsumer {
    /// A consumer of `stream` in `group`, as `worker`.
    ///
    /// `worker` must be unique among the group's live members: host and process id, for
    /// example. It reclaims entries after 30 s idle by default. Nothing is contacted until
    /// [`run`](Self::run).
    pub fn new(
        client: redis::Client,
        stream: impl Into<String>,
        group: impl Into<String>,
        worker: impl Into<String>,
        config: ConsumerConfig,
    ) -> Self {
        StreamConsumer {
            client,
            names: Arc::new(Names {
                stream: stream.into(),
                group: group.into(),
            }),
            worker: worker.into(),
            config,
            health: Health::default(),
            claim_idle: Duration::from_secs(30),
            block: Duration::from_millis(200),
            conns: None,
            cursor: "0-0".to_owned(),
            last_claim: None,
        }
    }

    /// Reclaim entries pending at least this long: longer than a handler runs, or a busy
    /// entry is taken from a live worker (harmless, the inbox answers `Busy`, but wasted).
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.claim_idle = idle;
        self
    }

    /// The consumer's live state for probes (connected, in flight, last settle,
    /// reconnects): take it before [`run`](Self::run); it follows that run.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Consumes until `shutdown` fires, or until an error no reconnect fixes.
    ///
    /// On `shutdown` it stops reading and lets started handlers finish and settle.
    /// Nothing is held unstarted. Then it returns the counts of what happened. See
    /// [`consume`](crate::consume) for the loop.
    ///
    /// # Errors
    ///
    /// A lost connection or a restarting broker does not end it: it connects again, with
    /// backoff. It returns an error no reconnect fixes:
    /// - [`BrokerError::Config`]: an invalid [`ConsumerConfig`] (or a zero `claim_idle`). Nothing was consumed.
    /// - [`BrokerError::Refused`]: refused credentials or commands.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is not a graceful stop: fire `shutdown` instead. Handlers
    /// already started are aborted at their next await point. An
    /// [`Inbox`](dedup_core::Inbox) releases their leases in the background. The broker
    /// delivers again what was not settled: its entries stay pending and are reclaimed after `claim_idle`.
    pub async fn run<H: Handle>(
        self,
        handler: H,
        shutdown: Shutdown,
    ) -> Result<ConsumerStats, BrokerError> {
        let config = self.config.clone();
        let health = self.health.clone();
        consume_with_health(self, config, handler, shutdown, health).await
    }

    fn pending(
        &self,
        entry: StreamId,
        reclaimed: bool,
        acks: &MultiplexedConnection,
    ) -> StreamPending {
        StreamPending {
            delivery: delivery(&entry, reclaimed),
            entry,
            names: Arc::clone(&self.names),
            acks: acks.clone(),
        }
    }
}

#[async_trait]
impl Source for StreamConsumer {
    type Pending = StreamPending;

    fn endpoint(&self) -> &str {
        &self.names.group
    }

    fn check(&self, _config: &ConsumerConfig) -> Result<(), BrokerError> {
        if self.claim_idle.is_zero() {
            return Err(BrokerError::Config("claim_idle must be above zero".into()));
        }
        Ok(())
    }

    async fn connect(&mut self, _config: &ConsumerConfig) -> Result<(), BrokerError> {
        self.conns = None;
        let reads_config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(self.block + Duration::from_secs(5)));
        let mut reads = self
            .client
            .get_multiplexed_async_connection_with_config(&reads_config)
            .await
            .map_err(|e| classify("connecting to Redis", e))?;
        let acks = self
            .client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| classify("connecting to Redis", e))?;
        let created: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.names.stream)
            .arg(&self.names.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut reads)
            .await;
        if let Err(e) = created
            && e.code() != Some("BUSYGROUP")
        {
            return Err(classify("XGROUP CREATE", e));
        }
        // Reclaim at once: entries of a worker that died with the old connection.
        self.last_claim = None;
        self.conns = Some((reads, acks));
        Ok(())
    }

    /// Not cut short on shutdown: Redis may already have handed entries over (they would
    /// stay pending for this worker until reclaimed). A read returns within its block time.
    async fn fetch(
        &mut self,
        max: usize,
        _shutdown: &Shutdown,
    ) -> Result<Vec<StreamPending>, BrokerError> {
        let Some((mut reads, acks)) = self.conns.clone() else {
            return Err(BrokerError::broker("reading", "not connected"));
        };
        let names = Arc::clone(&self.names);
        let mut fetched = Vec::new();
        // Reclaimed entries first, before the (blocking) read of new ones.
        if self
            .last_claim
            .is_none_or(|t| t.elapsed() >= self.claim_idle / 2)
        {
            self.last_claim = Some(Instant::now());
            let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
                .arg(&names.stream)
                .arg(&names.group)
                .arg(&self.worker)
                .arg(self.claim_idle.as_millis() as u64)
                .arg(&self.cursor)
                .arg("COUNT")
                .arg(max)
                .query_async(&mut reads)
                .await
                .map_err(|e| classify("XAUTOCLAIM", e))?;
            self.cursor = reply.next_stream_id;
            for entry in reply.claimed.into_iter().take(max) {
                fetched.push(self.pending(entry, true, &acks));
            }
        }
        // Reclaimed entries start now: a blocking read first would let them idle past
        // `claim_idle` again before their handlers even began.
        if !fetched.is_empty() {
            return Ok(fetched);
        }
        let opts = StreamReadOptions::default()
            .group(&names.group, &self.worker)
            .count(max - fetched.len())
            .block(self.block.as_millis() as usize);
        let keys = [names.stream.as_str()];
        let reply = redis::AsyncCommands::xread_options::<_, _, Option<StreamReadReply>>(
            &mut reads,
            &keys,
            &[">"],
            &opts,
        )
        .await
        .map_err(|e| classify("XREADGROUP", e))?;
        for entry in reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
            fetched.push(self.pending(entry, false, &acks));
        }
        Ok(fetched)
    }
}

/// One stream entry, read or reclaimed, and the connection that acks it.
#[derive(Debug)]
pub struct StreamPending {
    delivery: Delivery,
    entry: StreamId,
    names: Arc<Names>,
    acks: MultiplexedConnection,
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
