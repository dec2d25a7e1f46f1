//! The broker rows (`--only brokers`): per broker (RabbitMQ, Redis Streams, NATS
//! JetStream, Google Cloud Pub/Sub, each where the environment names its server), the throughput of consuming
//! `--batch-messages` pre-published messages three ways, with at most `c` in flight (AMQP
//! prefetch, `XREADGROUP COUNT`, JetStream batch and `max_ack_pending`):
//!
//! - `raw`: a hand-written loop on the broker's client reading messages and acking each
//!   (inline with one in flight; with more, each ack in a task holding one of `c` slots,
//!   reads asking for as many messages as slots are free);
//! - `inbox_loop`: the same loop with `Inbox::handle` (a [`MemoryStore`], so the store
//!   costs next to nothing and the adapter's own cost shows) around an empty handler
//!   before each ack;
//! - `adapter`: the `dedup-brokers` consumer with `with_inbox` around the same empty
//!   handler and store.
//!
//! Rows: `consumer_adapter_vs_inbox_loop` (the adapter's cost over the hand-written loop)
//! and `consumer_adapter_vs_raw`. A run ends when the last message was acked (adapter:
//! handled, its ack follows). Every run consumes messages published for it alone (not measured).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_brokers::{ConsumerConfig, Delivery, Handle, ShutdownTrigger, shutdown, with_inbox};
use dedup_core::{BoxError, Handled, Inbox, InboxError, Key, MemoryStore};
use futures::FutureExt;
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Map, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::driver::Run;
use super::rounds::{Contender, best_of, contender};
use super::{Names, Params, Result, Row, row};

/// The servers the broker rows run on.
#[derive(Clone, Debug, Default)]
pub(crate) struct Servers {
    /// `DEDUP_AMQP_URL`.
    #[cfg_attr(not(feature = "rabbitmq"), allow(dead_code))]
    pub(crate) amqp: Option<String>,
    /// `DEDUP_REDIS_URL`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) redis: Option<String>,
    /// `DEDUP_NATS_URL`.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(crate) nats: Option<String>,
    /// `DEDUP_PUBSUB_EMULATOR_HOST` (`host:port` of Google's Pub/Sub emulator).
    #[cfg_attr(not(feature = "pubsub"), allow(dead_code))]
    pub(crate) pubsub: Option<String>,
}

/// The way a run consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Raw,
    InboxLoop,
    Adapter,
}

const KINDS: [(Kind, &str); 3] = [
    (Kind::Raw, "raw"),
    (Kind::InboxLoop, "loop"),
    (Kind::Adapter, "adapter"),
];

/// The payload every message carries.
const PAYLOAD: &[u8] = br#"{"order_id":"o-1","item":"book","amount":100}"#;

/// How long a run may take before it counts as stuck.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// Every broker row, for the brokers named, and the failures of brokers that failed (the
/// other brokers' rows are kept).
pub(crate) async fn run(params: &Params, servers: &Servers) -> (Vec<Row>, Vec<String>) {
    let names = Names::new();
    let (mut rows, mut failed) = (Vec::new(), Vec::new());
    let mut keep = |broker: &str, measured: Result<Vec<Row>>| match measured {
        Ok(found) => rows.extend(found),
        Err(e) => failed.push(format!("{broker}: {e}")),
    };
    #[cfg(feature = "rabbitmq")]
    match &servers.amqp {
        Some(url) => keep(
            "rabbitmq",
            async {
                let broker = rabbit::Rabbit::connect(url, &names).await?;
                let rows = bench_broker("rabbitmq", params, &broker).await;
                broker.close().await?;
                rows
            }
            .await,
        ),
        None => eprintln!("brokers: DEDUP_AMQP_URL not set: no RabbitMQ rows"),
    }
    #[cfg(feature = "redis")]
    match &servers.redis {
        Some(url) => keep(
            "redis-streams",
            async {
                let broker = streams::Streams::connect(url, &names).await?;
                bench_broker("redis-streams", params, &broker).await
            }
            .await,
        ),
        None => eprintln!("brokers: DEDUP_REDIS_URL not set: no Redis Streams rows"),
    }
    #[cfg(feature = "nats")]
    match &servers.nats {
        Some(url) => keep(
            "nats",
            async {
                let broker = nats::Nats::connect(url, &names).await?;
                bench_broker("nats", params, &broker).await
            }
            .await,
        ),
        None => eprintln!("brokers: DEDUP_NATS_URL not set: no NATS rows"),
    }
    #[cfg(feature = "pubsub")]
    match &servers.pubsub {
        Some(host) => keep(
            "pubsub",
            async {
                let broker = pubsub::PubSub::connect(host, &names).await?;
                bench_broker("pubsub", params, &broker).await
            }
            .await,
        ),
        None => eprintln!("brokers: DEDUP_PUBSUB_EMULATOR_HOST not set: no Pub/Sub rows"),
    }
    (rows, failed)
}

/// One broker's way of publishing and consuming.
trait Broker: Send + Sync + 'static {
    /// Publish `n` messages with ids `{tag}-0...` to a destination of tag `tag` of its
    /// own (not measured), and consume them the `kind` way with `in_flight` at most.
    fn consume(
        &self,
        kind: Kind,
        tag: String,
        n: usize,
        in_flight: usize,
    ) -> BoxFuture<'static, Result<Run>>;

    /// How the broker is set up, for the rows.
    fn setup(&self) -> String;
}

async fn bench_broker<B: Broker>(
    backend: &'static str,
    params: &Params,
    broker: &B,
) -> Result<Vec<Row>> {
    let n = params.batch_messages;
    let mut rows = Vec::new();
    for &c in &params.concurrency {
        eprintln!("brokers: {backend} with {c} in flight...");
        for (kind, what) in KINDS {
            timed(broker.consume(kind, format!("warm-c{c}-{what}"), params.warmup.max(1), c))
                .await?;
        }
        let contenders: Vec<Contender<'_>> = KINDS
            .iter()
            .map(|&(kind, what)| {
                contender(move |round| {
                    timed(broker.consume(kind, format!("c{c}-{what}-{round}"), n, c)).boxed()
                })
            })
            .collect();
        let runs = best_of(params, contenders).await?;
        let (raw, inbox_loop, adapter) = (
            runs[0].throughput(n),
            runs[1].throughput(n),
            runs[2].throughput(n),
        );
        let mut details = Map::new();
        details.insert("raw_msgs_per_s".into(), json!(raw));
        details.insert("inbox_loop_msgs_per_s".into(), json!(inbox_loop));
        details.insert("library_msgs_per_s".into(), json!(adapter));
        details.insert(
            "adapter_cost_over_inbox_loop_percent".into(),
            json!((1.0 - adapter / inbox_loop) * 100.0),
        );
        details.insert("store".into(), json!("MemoryStore"));
        details.insert("messages".into(), json!(n));
        details.insert("setup".into(), json!(broker.setup()));
        rows.push(row(
            backend,
            "consumer_adapter_vs_inbox_loop",
            c,
            "msgs/s",
            (adapter, inbox_loop),
            details.clone(),
        ));
        rows.push(row(
            backend,
            "consumer_adapter_vs_raw",
            c,
            "msgs/s",
            (adapter, raw),
            details,
        ));
    }
    Ok(rows)
}

async fn timed(run: BoxFuture<'static, Result<Run>>) -> Result<Run> {
    tokio::time::timeout(RUN_TIMEOUT, run)
        .await
        .map_err(|_| format!("a consumer run took over {RUN_TIMEOUT:?}"))?
}

/// The hand-written loop's step: `Inbox::handle` around an empty handler; the message
/// must be new.
async fn handle_once(inbox: &Inbox<MemoryStore>, consumer: &str, id: Option<&str>) -> Result<()> {
    let key = Key::new(consumer, id.ok_or("a message without an id")?)?;
    match inbox
        .handle(&key, None, |_lease| async { Ok::<_, BoxError>(None) })
        .await?
    {
        Handled::Processed { .. } => Ok(()),
        other => Err(format!("{key:?} should have been new: {other:?}").into()),
    }
}

/// The adapter's handler: `with_inbox` around an empty handler, counting what it handled;
/// the `n`th handled message stamps the end of the run and stops the consumer.
struct Counting<H> {
    inner: H,
    handled: AtomicUsize,
    n: usize,
    ended: std::sync::Mutex<Option<Instant>>,
    stop: ShutdownTrigger,
}

#[async_trait]
impl<H: Handle> Handle for Counting<H> {
    async fn handle(&self, key: &Key, delivery: &Delivery) -> Result<Handled, InboxError> {
        let handled = self.inner.handle(key, delivery).await?;
        if self.handled.fetch_add(1, Ordering::SeqCst) + 1 == self.n {
            *self.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            self.stop.shut_down();
        }
        Ok(handled)
    }
}

/// Run an adapter: `consume(handler, shutdown)` until `n` messages were handled; the time
/// from the start to the `n`th.
async fn adapter_run<F, Fut>(n: usize, consume: F) -> Result<Run>
where
    F: FnOnce(Arc<Counting<Arc<dyn Handle>>>, dedup_brokers::Shutdown) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let (stop, stopped) = shutdown();
    let inner: Arc<dyn Handle> = Arc::new(with_inbox(
        Inbox::new(MemoryStore::new()),
        |_lease, _delivery| async { Ok::<_, BoxError>(None) },
    ));
    let handler = Arc::new(Counting {
        inner,
        handled: AtomicUsize::new(0),
        n,
        ended: std::sync::Mutex::new(None),
        stop,
    });
    let started = Instant::now();
    consume(Arc::clone(&handler), stopped).await?;
    let ended = handler
        .ended
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .ok_or("the consumer stopped before handling every message")?;
    Ok(Run {
        elapsed: ended - started,
        samples: Vec::new(),
    })
}

/// How the hand-written loops (raw and inbox_loop) run each message's work: inline with one
/// in flight, else as a task holding one of `in_flight` slots, as a hand-written consumer
/// with that many in flight would.
struct Workers {
    slots: Arc<Semaphore>,
    tasks: JoinSet<Result<()>>,
    inline: bool,
}

impl Workers {
    fn new(in_flight: usize) -> Self {
        Workers {
            slots: Arc::new(Semaphore::new(in_flight.max(1))),
            tasks: JoinSet::new(),
            inline: in_flight <= 1,
        }
    }

    /// Wait for a free slot, then take every free one (a finished task's error fails the
    /// run here).
    async fn free(&mut self) -> Result<Vec<OwnedSemaphorePermit>> {
        let mut slots = vec![Arc::clone(&self.slots).acquire_owned().await?];
        while let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() {
            slots.push(slot);
        }
        while let Some(done) = self.tasks.try_join_next() {
            done??;
        }
        Ok(slots)
    }

    /// Run `work` in `slot`.
    async fn run(
        &mut self,
        slot: OwnedSemaphorePermit,
        work: impl Future<Output = Result<()>> + Send + 'static,
    ) -> Result<()> {
        if self.inline {
            return work.await;
        }
        self.tasks.spawn(async move {
            let done = work.await;
            drop(slot);
            done
        });
        Ok(())
    }

    /// Wait for every task.
    async fn finish(mut self) -> Result<()> {
        while let Some(done) = self.tasks.join_next().await {
            done??;
        }
        Ok(())
    }
}

fn config(in_flight: usize) -> ConsumerConfig {
    ConsumerConfig {
        in_flight,
        ..ConsumerConfig::default()
    }
}

#[cfg(feature = "pubsub")]
mod pubsub;

#[cfg(feature = "rabbitmq")]
mod rabbit {
    use super::*;
    use dedup_brokers::rabbitmq::RabbitConsumer;
    use lapin::options::{
        BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions,
        BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::types::{AMQPValue, FieldTable, LongString};
    use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};

    /// RabbitMQ: a durable queue per run, persistent messages.
    pub(super) struct Rabbit {
        connection: Arc<Connection>,
        run: String,
    }

    impl Rabbit {
        pub(super) async fn connect(url: &str, names: &Names) -> Result<Self> {
            Ok(Rabbit {
                connection: Arc::new(
                    Connection::connect(url, ConnectionProperties::default()).await?,
                ),
                run: names.run.clone(),
            })
        }

        pub(super) async fn close(self) -> Result<()> {
            self.connection.close(200, "bench done".into()).await?;
            Ok(())
        }
    }

    async fn publish(connection: &Connection, queue: &str, tag: &str, n: usize) -> Result<()> {
        let channel = connection.create_channel().await?;
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let mut confirms = Vec::with_capacity(n);
        for k in 0..n {
            let mut headers = FieldTable::default();
            headers.insert(
                "type".into(),
                AMQPValue::LongString(LongString::from(b"OrderPlaced".to_vec())),
            );
            let props = BasicProperties::default()
                .with_message_id(format!("{tag}-{k}").into())
                .with_headers(headers)
                .with_delivery_mode(2);
            confirms.push(
                channel
                    .basic_publish(
                        "".into(),
                        queue.into(),
                        BasicPublishOptions::default(),
                        PAYLOAD,
                        props,
                    )
                    .await?,
            );
        }
        for confirm in confirms {
            if !matches!(confirm.await?, Confirmation::Ack(None)) {
                return Err("a bench publish was not confirmed".into());
            }
        }
        let _ = channel.close(200, "published".into()).await;
        Ok(())
    }

    impl Broker for Rabbit {
        fn consume(
            &self,
            kind: Kind,
            tag: String,
            n: usize,
            in_flight: usize,
        ) -> BoxFuture<'static, Result<Run>> {
            let connection = Arc::clone(&self.connection);
            let queue = format!("dedup-bench-{}-{tag}", self.run);
            async move {
                publish(&connection, &queue, &tag, n).await?;
                let channel = connection.create_channel().await?;
                let run = match kind {
                    Kind::Adapter => {
                        let consumer =
                            RabbitConsumer::new(channel.clone(), queue.as_str(), config(in_flight));
                        adapter_run(n, |handler, stopped| async move {
                            consumer.run(handler, stopped).await?;
                            Ok(())
                        })
                        .await?
                    }
                    Kind::Raw | Kind::InboxLoop => {
                        let inbox = Arc::new(Inbox::new(MemoryStore::new()));
                        let mut workers = Workers::new(in_flight);
                        let started = Instant::now();
                        channel
                            .basic_qos(in_flight as u16, BasicQosOptions::default())
                            .await?;
                        let mut consumer = channel
                            .basic_consume(
                                queue.as_str().into(),
                                "".into(),
                                BasicConsumeOptions::default(),
                                FieldTable::default(),
                            )
                            .await?;
                        let mut seen = 0;
                        while seen < n {
                            let mut slots = workers.free().await?;
                            while let Some(slot) = slots.pop() {
                                let d = consumer.next().await.ok_or("the consumer closed")??;
                                let (inbox, queue) = (Arc::clone(&inbox), queue.clone());
                                workers
                                    .run(slot, async move {
                                        if kind == Kind::InboxLoop {
                                            let id = d.properties.message_id().as_ref();
                                            handle_once(&inbox, &queue, id.map(|s| s.as_str()))
                                                .await?;
                                        }
                                        d.acker.ack(BasicAckOptions::default()).await?;
                                        Ok(())
                                    })
                                    .await?;
                                seen += 1;
                                if seen == n {
                                    break;
                                }
                            }
                        }
                        workers.finish().await?;
                        let elapsed = started.elapsed();
                        channel
                            .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                            .await?;
                        Run {
                            elapsed,
                            samples: Vec::new(),
                        }
                    }
                };
                channel
                    .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                    .await?;
                let _ = channel.close(200, "done".into()).await;
                Ok(run)
            }
            .boxed()
        }

        fn setup(&self) -> String {
            "RabbitMQ: a durable queue per run, persistent messages, manual acks, prefetch = \
             in flight"
                .into()
        }
    }
}

#[cfg(feature = "redis")]
mod streams {
    use super::*;
    use dedup_brokers::redis_streams::{MESSAGE_ID_FIELD, PAYLOAD_FIELD, StreamConsumer};
    use redis::aio::MultiplexedConnection;
    use redis::streams::{StreamReadOptions, StreamReadReply};

    /// Redis Streams: a stream and consumer group per run.
    pub(super) struct Streams {
        client: redis::Client,
        conn: MultiplexedConnection,
        run: String,
    }

    impl Streams {
        pub(super) async fn connect(url: &str, names: &Names) -> Result<Self> {
            let client = redis::Client::open(url)?;
            let conn = client.get_multiplexed_async_connection().await?;
            Ok(Streams {
                client,
                conn,
                run: names.run.clone(),
            })
        }
    }

    const GROUP: &str = "bench";

    async fn publish(
        conn: &mut MultiplexedConnection,
        stream: &str,
        tag: &str,
        n: usize,
    ) -> Result<()> {
        for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
            let mut pipe = redis::pipe();
            for k in chunk {
                pipe.cmd("XADD")
                    .arg(stream)
                    .arg("*")
                    .arg(MESSAGE_ID_FIELD)
                    .arg(format!("{tag}-{k}"))
                    .arg(PAYLOAD_FIELD)
                    .arg(PAYLOAD)
                    .arg("type")
                    .arg("OrderPlaced")
                    .ignore();
            }
            pipe.query_async::<()>(conn).await?;
        }
        Ok(())
    }

    impl Broker for Streams {
        fn consume(
            &self,
            kind: Kind,
            tag: String,
            n: usize,
            in_flight: usize,
        ) -> BoxFuture<'static, Result<Run>> {
            let (client, mut conn) = (self.client.clone(), self.conn.clone());
            let stream = format!("dedup-bench:{}:{tag}", self.run);
            async move {
                publish(&mut conn, &stream, &tag, n).await?;
                let run = match kind {
                    Kind::Adapter => {
                        let consumer = StreamConsumer::new(
                            client,
                            stream.as_str(),
                            GROUP,
                            "w1",
                            config(in_flight),
                        );
                        adapter_run(n, |handler, stopped| async move {
                            consumer.run(handler, stopped).await?;
                            Ok(())
                        })
                        .await
                    }
                    Kind::Raw | Kind::InboxLoop => raw(&client, &stream, kind, n, in_flight).await,
                };
                let _: () = redis::cmd("DEL")
                    .arg(&stream)
                    .query_async(&mut conn)
                    .await?;
                run
            }
            .boxed()
        }

        fn setup(&self) -> String {
            "Redis Streams: a stream and group per run; XREADGROUP COUNT in flight, BLOCK \
             200 ms; one XACK per entry"
                .into()
        }
    }

    async fn raw(
        client: &redis::Client,
        stream: &str,
        kind: Kind,
        n: usize,
        in_flight: usize,
    ) -> Result<Run> {
        let inbox = Arc::new(Inbox::new(MemoryStore::new()));
        let mut workers = Workers::new(in_flight);
        let started = Instant::now();
        let mut conn = client.get_multiplexed_async_connection().await?;
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await?;
        let acks = client.get_multiplexed_async_connection().await?;
        let mut seen = 0;
        while seen < n {
            let mut slots = workers.free().await?;
            let opts = StreamReadOptions::default()
                .group(GROUP, "w1")
                .count(slots.len())
                .block(200);
            let reply: Option<StreamReadReply> =
                redis::AsyncCommands::xread_options(&mut conn, &[stream], &[">"], &opts).await?;
            for entry in reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
                let slot = slots.pop().ok_or("more entries than asked for")?;
                let (inbox, mut acks, stream) =
                    (Arc::clone(&inbox), acks.clone(), stream.to_owned());
                workers
                    .run(slot, async move {
                        if kind == Kind::InboxLoop {
                            let id: Option<String> = entry.get(MESSAGE_ID_FIELD);
                            handle_once(&inbox, GROUP, id.as_deref()).await?;
                        }
                        let _: () = redis::cmd("XACK")
                            .arg(&stream)
                            .arg(GROUP)
                            .arg(&entry.id)
                            .query_async(&mut acks)
                            .await?;
                        Ok(())
                    })
                    .await?;
                seen += 1;
            }
        }
        workers.finish().await?;
        Ok(Run {
            elapsed: started.elapsed(),
            samples: Vec::new(),
        })
    }
}

#[cfg(feature = "nats")]
mod nats {
    use super::*;
    use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
    use async_nats::jetstream::stream::Config as StreamConfig;
    use async_nats::jetstream::{self, Context};
    use dedup_brokers::nats::{MSG_ID_HEADER, NatsConsumer};

    /// NATS JetStream: a stream and durable pull consumer per run.
    pub(super) struct Nats {
        js: Context,
        run: String,
    }

    impl Nats {
        pub(super) async fn connect(url: &str, names: &Names) -> Result<Self> {
            let client = async_nats::connect(url).await?;
            Ok(Nats {
                js: jetstream::new(client),
                run: names.run.clone(),
            })
        }
    }

    const DURABLE: &str = "bench";

    impl Broker for Nats {
        fn consume(
            &self,
            kind: Kind,
            tag: String,
            n: usize,
            in_flight: usize,
        ) -> BoxFuture<'static, Result<Run>> {
            let js = self.js.clone();
            let name = format!("DEDUP_BENCH_{}_{}", self.run, tag.replace('-', "_"));
            let subject = format!("dedup.bench.{}.{tag}", self.run);
            async move {
                js.create_stream(StreamConfig {
                    name: name.clone(),
                    subjects: vec![subject.clone()],
                    ..StreamConfig::default()
                })
                .await?;
                let run = async {
                    // Acks awaited every 500 publishes: the client times out acks left
                    // waiting longer.
                    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
                        let mut acks = Vec::with_capacity(chunk.len());
                        for k in chunk {
                            let mut headers = async_nats::HeaderMap::new();
                            headers.insert(MSG_ID_HEADER, format!("{tag}-{k}").as_str());
                            headers.insert("type", "OrderPlaced");
                            acks.push(
                                js.publish_with_headers(subject.clone(), headers, PAYLOAD.into())
                                    .await?,
                            );
                        }
                        for ack in acks {
                            ack.await?;
                        }
                    }
                    match kind {
                        Kind::Adapter => {
                            let consumer =
                                NatsConsumer::new(js.clone(), &name, DURABLE, config(in_flight));
                            adapter_run(n, |handler, stopped| async move {
                                consumer.run(handler, stopped).await?;
                                Ok(())
                            })
                            .await
                        }
                        Kind::Raw | Kind::InboxLoop => raw(&js, &name, kind, n, in_flight).await,
                    }
                }
                .await;
                js.delete_stream(&name).await?;
                run
            }
            .boxed()
        }

        fn setup(&self) -> String {
            "NATS JetStream: a stream and durable pull consumer per run (explicit acks, \
             max_ack_pending = in flight), batches of the free slots with 200 ms expiry"
                .into()
        }
    }

    async fn raw(js: &Context, name: &str, kind: Kind, n: usize, in_flight: usize) -> Result<Run> {
        let inbox = Arc::new(Inbox::new(MemoryStore::new()));
        let mut workers = Workers::new(in_flight);
        let started = Instant::now();
        let consumer: PullConsumer = js
            .get_stream(name)
            .await?
            .get_or_create_consumer(
                DURABLE,
                pull::Config {
                    durable_name: Some(DURABLE.into()),
                    ack_policy: AckPolicy::Explicit,
                    max_ack_pending: in_flight as i64,
                    ..pull::Config::default()
                },
            )
            .await?;
        let mut seen = 0;
        while seen < n {
            let mut slots = workers.free().await?;
            let mut batch = consumer
                .batch()
                .max_messages(slots.len())
                .expires(Duration::from_millis(200))
                .messages()
                .await?;
            while let Some(message) = batch.next().await {
                let message = message?;
                let slot = slots.pop().ok_or("more messages than asked for")?;
                let inbox = Arc::clone(&inbox);
                workers
                    .run(slot, async move {
                        if kind == Kind::InboxLoop {
                            let id = message
                                .headers
                                .as_ref()
                                .and_then(|h| h.get(MSG_ID_HEADER))
                                .map(|v| v.as_str().to_owned());
                            handle_once(&inbox, DURABLE, id.as_deref()).await?;
                        }
                        message.ack().await?;
                        Ok(())
                    })
                    .await?;
                seen += 1;
            }
        }
        workers.finish().await?;
        Ok(Run {
            elapsed: started.elapsed(),
            samples: Vec::new(),
        })
    }
}
