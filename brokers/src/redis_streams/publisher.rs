//! [`StreamPublisher`]: outbox rows to Redis Streams with `XADD`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_core::BoxError;
use dedup_core::outbox::{OutboxRow, Publisher};
use redis::aio::MultiplexedConnection;

use super::errors::classify;
use super::{MESSAGE_ID_FIELD, PAYLOAD_FIELD};
use crate::{BrokerError, PublishTimedOut};

/// [`StreamPublisher::publish_timeout`] unless set.
const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes each row as `XADD <destination> * message_id <id> payload <bytes>
/// [<header> <value>]...`; `Ok` once Redis answered the entry id. A header named
/// `message_id` or `payload` would hide the row's own fields: such a row is an error (the
/// relay retries it and, after its attempts, marks it dead).
///
/// A publisher made with [`connect`](Self::connect) keeps the client: after a publish
/// failed on a lost connection (Redis restarted, the connection killed), the next publish
/// connects again first, retrying with a delay from 100 ms doubling for at most
/// [`reconnect_within`](Self::reconnect_within) (10 s by default). The publish that met the
/// lost connection still returns its error (its entry may or may not have been written;
/// the relay publishes it again and consumers deduplicate by message id). One made with
/// [`new`](Self::new) over a connection has no client and does not reconnect. Clones share
/// the connection.
///
/// A call (a reconnect included) answers within
/// [`publish_timeout`](Self::publish_timeout), 10 s by default: its
/// [`delivery_timeout`](Publisher::delivery_timeout), which a relay checks against its
/// hold. A call that ran out of time counts its connection as lost, so the next one
/// connects again instead of queueing behind it.
///
/// # Errors
///
/// A publish answers `Err` whenever the broker did not confirm: the message may or may not
/// be there. The relay then publishes it again later, with the same message id, and the
/// consumer's inbox drops the copy.
///
/// # Cancel safety
///
/// A dropped publish may still reach the broker: its `XADD` may have been sent. The relay counts its rows as not
/// published, and publishes them again.
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use dedup_core::outbox::{OutboxStore, Relay};
///
/// # async fn example(outbox: Arc<dyn OutboxStore>) -> Result<(), dedup_core::BoxError> {
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let publisher = dedup_brokers::redis_streams::StreamPublisher::connect(&client).await?;
/// let relay = Relay::new(outbox, Arc::new(publisher)).start()?;
/// // ... on shutdown:
/// relay.stop().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct StreamPublisher {
    conn: Arc<Mutex<MultiplexedConnection>>,
    broken: Arc<AtomicBool>,
    client: Option<redis::Client>,
    reconnect_within: Duration,
    publish_timeout: Duration,
}

impl StreamPublisher {
    /// A publisher over `conn` (it does not reconnect: see the type's docs).
    pub fn new(conn: MultiplexedConnection) -> Self {
        StreamPublisher {
            conn: Arc::new(Mutex::new(conn)),
            broken: Arc::default(),
            client: None,
            reconnect_within: Duration::from_secs(10),
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
        }
    }

    /// How long a call may take in all, a reconnect included, before its rows count as
    /// failed (10 s by default).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// `call`'s answer, or [`PublishTimedOut`] after the publish timeout (the connection
    /// then counts as lost).
    async fn bounded<T>(
        &self,
        destination: &str,
        call: impl std::future::Future<Output = Result<T, BoxError>>,
    ) -> Result<T, BoxError> {
        let deadline = tokio::time::Instant::now() + self.publish_timeout;
        let timed_out = PublishTimedOut {
            publisher: "redis-streams",
            destination: destination.to_owned(),
            timeout: self.publish_timeout,
        };
        let answer = timed_out.unless(deadline, call).await;
        if answer
            .as_ref()
            .is_err_and(|e| e.downcast_ref::<PublishTimedOut>().is_some())
        {
            self.broken.store(true, Ordering::Release);
        }
        answer
    }

    /// A publisher on a new multiplexed connection of `client`.
    ///
    /// It connects again after a lost connection.
    ///
    /// # Errors
    ///
    /// redis-rs's error when the first connection fails: nothing listening, refused
    /// credentials.
    pub async fn connect(client: &redis::Client) -> redis::RedisResult<Self> {
        let mut publisher = Self::new(client.get_multiplexed_async_connection().await?);
        publisher.client = Some(client.clone());
        Ok(publisher)
    }

    /// How long one publish keeps trying to connect again after a lost connection before it
    /// returns the connect error (10 s by default).
    pub fn reconnect_within(mut self, within: Duration) -> Self {
        self.reconnect_within = within;
        self
    }

    /// The connection to publish on: the current one, or a new one after a lost connection.
    async fn conn(&self) -> Result<MultiplexedConnection, BrokerError> {
        if let (true, Some(client)) = (self.broken.load(Ordering::Acquire), &self.client) {
            let deadline = Instant::now() + self.reconnect_within;
            let mut delay = Duration::from_millis(100);
            let conn = loop {
                match client.get_multiplexed_async_connection().await {
                    Ok(conn) => break conn,
                    Err(e) => {
                        let e = classify("connecting the publisher to Redis again", e);
                        if !e.is_retryable() || Instant::now() + delay > deadline {
                            return Err(e);
                        }
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(2));
                    }
                }
            };
            *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = conn;
            self.broken.store(false, Ordering::Release);
            tracing::info!("Redis Streams publisher connected again");
        }
        Ok(self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Remember a lost connection, so the next publish makes a new one.
    fn note(&self, error: &redis::RedisError) {
        if error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
        {
            self.broken.store(true, Ordering::Release);
        }
    }
}

fn xadd(row: &OutboxRow) -> Result<redis::Cmd, BoxError> {
    xadd_entry(
        &row.destination,
        &row.message_id,
        &row.payload,
        &row.headers,
    )
}

/// `XADD <stream> * message_id <id> payload <bytes> [<header> <value>]...`: an outbox row's
/// entry, or a replayed dead letter's.
pub(super) fn xadd_entry(
    stream: &str,
    message_id: &str,
    payload: &[u8],
    headers: &[(String, String)],
) -> Result<redis::Cmd, BoxError> {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream)
        .arg("*")
        .arg(MESSAGE_ID_FIELD)
        .arg(message_id)
        .arg(PAYLOAD_FIELD)
        .arg(payload);
    for (name, value) in headers {
        if name == MESSAGE_ID_FIELD || name == PAYLOAD_FIELD {
            return Err(format!("header {name:?} would hide the entry's own field").into());
        }
        cmd.arg(name).arg(value);
    }
    Ok(cmd)
}

#[async_trait]
impl Publisher for StreamPublisher {
    fn name(&self) -> &'static str {
        "redis-streams"
    }

    /// [`publish_timeout`](Self::publish_timeout).
    fn delivery_timeout(&self) -> Duration {
        self.publish_timeout
    }

    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        let cmd = xadd(row)?;
        self.bounded(&row.destination, async {
            let answer: redis::RedisResult<String> = cmd.query_async(&mut self.conn().await?).await;
            if let Err(e) = &answer {
                self.note(e);
            }
            answer?;
            Ok(())
        })
        .await
    }

    /// One pipeline of `XADD`s (one round trip), each answered on its own, within one
    /// publish timeout.
    async fn publish_all(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        let Some(first) = rows.first() else {
            return Vec::new();
        };
        let all = self.bounded(&first.destination, async { Ok(self.pipeline(rows).await) });
        match all.await {
            Ok(results) => results,
            // Only the time bound fails the whole call.
            Err(e) => rows
                .iter()
                .map(|_| match e.downcast_ref::<PublishTimedOut>() {
                    Some(timed_out) => Err(Box::new(timed_out.clone()) as BoxError),
                    None => Err(e.to_string().into()),
                })
                .collect(),
        }
    }
}

impl StreamPublisher {
    /// [`Publisher::publish_all`] without its time bound.
    async fn pipeline(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut results: Vec<Option<Result<(), BoxError>>> = Vec::with_capacity(rows.len());
        for row in rows {
            match xadd(row) {
                Ok(cmd) => {
                    pipe.add_command(cmd);
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let mut conn = match self.conn().await {
            Ok(conn) => conn,
            Err(e) => {
                let e: BoxError = e.into();
                let e = e.to_string();
                return results
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|| Err(e.clone().into())))
                    .collect();
            }
        };
        let answers: redis::RedisResult<Vec<redis::RedisResult<String>>> =
            pipe.query_async(&mut conn).await;
        if let Err(e) = &answers {
            self.note(e);
        }
        match answers {
            Ok(answers) => {
                let mut answers = answers.into_iter();
                results
                    .into_iter()
                    .map(|r| match r {
                        Some(r) => r,
                        None => match answers.next() {
                            Some(Ok(_)) => Ok(()),
                            Some(Err(e)) => Err(e.into()),
                            None => Err("pipeline answered fewer replies than commands".into()),
                        },
                    })
                    .collect()
            }
            Err(e) => {
                let e = e.to_string();
                results
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|| Err(e.clone().into())))
                    .collect()
            }
        }
    }
}
