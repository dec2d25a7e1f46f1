//! The broker rows (`--only brokers`): per broker (RabbitMQ, Redis Streams, NATS
//! JetStream, Kafka, Google Cloud Pub/Sub, each where the environment names its server),
//! the throughput of consuming `--batch-messages` pre-published messages three ways, with
//! at most `c` in flight (AMQP prefetch, `XREADGROUP COUNT`, JetStream batch and
//! `max_ack_pending`, Kafka records taken from librdkafka):
//!
//! - `raw`: a hand-written loop on the broker's client reading messages and acking each
//!   (inline with one in flight; with more, each ack in a task holding one of `c` slots,
//!   reads asking for as many messages as slots are free);
//! - `inbox_loop`: the same loop with `Inbox::handle` (a [`MemoryStore`](dedup_core::MemoryStore), so the store
//!   costs next to nothing and the adapter's own cost shows) around an empty handler
//!   before each ack;
//! - `adapter`: the `dedup-brokers` consumer with `with_inbox` around the same empty
//!   handler and store.
//!
//! Rows: `consumer_adapter_vs_inbox_loop` (the adapter's cost over the hand-written loop)
//! and `consumer_adapter_vs_raw`. A run ends when the last message was acked (adapter:
//! handled, its ack follows). Every run consumes messages published for it alone (not measured).

use futures::FutureExt;
use serde_json::{Map, json};

use super::rounds::{Contender, best_of, contender};
use super::{Names, Params, Result, Row, row};
use harness::{Broker, KINDS, timed};

mod harness;
#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "pubsub")]
mod pubsub;
#[cfg(feature = "rabbitmq")]
mod rabbit;
#[cfg(feature = "redis")]
mod streams;

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
    /// `DEDUP_KAFKA_BROKERS` (bootstrap servers).
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) kafka: Option<String>,
    /// `DEDUP_PUBSUB_EMULATOR_HOST` (`host:port` of Google's Pub/Sub emulator).
    #[cfg_attr(not(feature = "pubsub"), allow(dead_code))]
    pub(crate) pubsub: Option<String>,
}

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
    #[cfg(feature = "kafka")]
    match &servers.kafka {
        Some(brokers) => keep(
            "kafka",
            async {
                let broker = kafka::Kafka::connect(brokers, &names).await?;
                bench_broker("kafka", params, &broker).await
            }
            .await,
        ),
        None => eprintln!("brokers: DEDUP_KAFKA_BROKERS not set: no Kafka rows"),
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

async fn bench_broker<B: Broker>(
    backend: &'static str,
    params: &Params,
    broker: &B,
) -> Result<Vec<Row>> {
    let n = params.batch_messages;
    if let Some(only) = &params.sides {
        return one_side(backend, params, broker, only).await;
    }
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

/// `--sides`: only the ways named (`raw`, `loop`, `adapter`), each run once per
/// concurrency after its warm-up, their throughput printed and no rows (a row compares
/// two sides): what a `valgrind --tool=callgrind` run of one side counts.
async fn one_side<B: Broker>(
    backend: &'static str,
    params: &Params,
    broker: &B,
    only: &[String],
) -> Result<Vec<Row>> {
    let n = params.batch_messages;
    for &c in &params.concurrency {
        for (kind, what) in KINDS
            .into_iter()
            .filter(|(_, w)| only.iter().any(|o| o == w))
        {
            timed(broker.consume(kind, format!("warm-c{c}-{what}"), params.warmup.max(1), c))
                .await?;
            let run = timed(broker.consume(kind, format!("c{c}-{what}-0"), n, c)).await?;
            eprintln!(
                "brokers: {backend} {what} with {c} in flight: {:.0} msgs/s",
                run.throughput(n)
            );
        }
    }
    Ok(Vec::new())
}
