//! [`StreamConsumer`]: a consumer group's entries through a [`Handle`](crate::Handle).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply};

use super::errors::classify;
use super::pending::{Names, StreamPending};
use crate::consumer::consumer_plumbing;
use crate::{BrokerError, ConsumerConfig, Health, Shutdown, Source};

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

consumer_plumbing!(
    StreamConsumer,
    debug: [names, worker, claim_idle],
    on_shutdown: "stops reading and lets started handlers finish and settle. Nothing is held \
         unstarted.",
    errors: [
        "[`BrokerError::Config`]: an invalid [`ConsumerConfig`] (or a zero `claim_idle`). \
         Nothing was consumed.",
        "[`BrokerError::Refused`]: refused credentials or commands.",
    ],
    redelivery: ": its entries stay pending and are reclaimed after `claim_idle`.",
);

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

    fn pending(
        &self,
        entry: StreamId,
        reclaimed: bool,
        acks: &MultiplexedConnection,
    ) -> StreamPending {
        StreamPending::new(entry, reclaimed, Arc::clone(&self.names), acks.clone())
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
