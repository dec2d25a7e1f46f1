//! Replay from a RabbitMQ dead-letter queue against the real RabbitMQ (`DEDUP_AMQP_URL`):
//! the copies the queue's dead-letter exchange keeps go back to their exchange and routing
//! key, and each runs once.

mod replay_suite;
mod support;

use async_trait::async_trait;
use dedup_brokers::rabbitmq::{
    DeadLetters as DeadLetterTo, ORIGIN_HEADER, RabbitConsumer, RabbitDeadLetters, RabbitPublisher,
    Topology,
};
use dedup_brokers::replay::{self, DeadLetters, Pick};
use dedup_brokers::{ConsumerConfig, FAILURE_CONSUMER_HEADER};
use dedup_core::outbox::Publisher;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use replay_suite::{ReplayBroker, World, replay_scenarios, strings};
use support::row;

/// The routing key the application publishes with.
const ROUTING_KEY: &str = "order.created";

struct Fixture {
    url: String,
    conn: Connection,
    topology: Topology,
    /// The application's exchange (direct), routing [`ROUTING_KEY`] to the queue.
    exchange: String,
    /// A second queue bound like the consumer's: it keeps a copy of what is published.
    tap: String,
    publisher: RabbitPublisher,
    /// Whether its consumers dead-letter by publishing to the dead-letter queue
    /// (`DeadLetters::Publish`) instead of rejecting.
    publishing: bool,
}

impl Fixture {
    fn destination(&self) -> String {
        format!("{}/{ROUTING_KEY}", self.exchange)
    }

    /// The messages the tap queue received so far (taken).
    async fn tapped(&self) -> Vec<lapin::message::Delivery> {
        let ch = self.conn.create_channel().await.unwrap();
        let mut out = Vec::new();
        while let Some(m) = ch
            .basic_get(self.tap.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            out.push(m.delivery);
        }
        out
    }
}

#[async_trait]
impl ReplayBroker for Fixture {
    type Source = RabbitConsumer;
    type Letters = RabbitDeadLetters;

    /// A queue with its dead-letter exchange and queue, and an exchange routing to it.
    async fn new() -> Option<Self> {
        let url = dedup_conformance::server_url("DEDUP_AMQP_URL")?;
        let conn = Connection::connect(&url, ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ");
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let topology = Topology::for_queue(format!("dedup-replay-{tag}"));
        let exchange = format!("dedup-replay-x-{tag}");
        let tap = format!("dedup-replay-tap-{tag}");
        let ch = conn.create_channel().await.unwrap();
        topology.declare(&ch).await.unwrap();
        ch.exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_declare(
            tap.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        for queue in [&topology.queue, &tap] {
            ch.queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                ROUTING_KEY.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        }
        let publisher = RabbitPublisher::new(&conn).await.unwrap();
        Some(Fixture {
            url,
            conn,
            topology,
            exchange,
            tap,
            publisher,
            publishing: false,
        })
    }

    fn consumer(&self) -> String {
        self.topology.queue.clone()
    }

    async fn publish(&self, ids: &[String]) {
        for id in ids {
            let sent = self.publisher.publish(&row(&self.destination(), id)).await;
            sent.unwrap();
        }
    }

    async fn source(&self, config: &ConsumerConfig) -> RabbitConsumer {
        let consumer = RabbitConsumer::from_uri(&self.url, &self.topology.queue, config.clone())
            .declare(self.topology.clone());
        if !self.publishing {
            return consumer;
        }
        consumer.dead_letters(DeadLetterTo::Publish {
            publisher: RabbitPublisher::new(&self.conn).await.unwrap(),
            destination: format!("/{}", self.topology.dead_letter_queue),
        })
    }

    async fn dead_letters(&self) -> RabbitDeadLetters {
        let url = format!("{}?queue={}", self.url, self.topology.dead_letter_queue);
        RabbitDeadLetters::open(&url).await.unwrap()
    }

    async fn cleanup(self) {
        let ch = self.conn.create_channel().await.unwrap();
        let t = &self.topology;
        for q in [&t.queue, &t.dead_letter_queue, &self.tap] {
            let _ = ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        for x in [&t.dead_letter_exchange, &self.exchange] {
            let _ = ch
                .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
    }
}

replay_scenarios!(Fixture);

fn header(d: &lapin::message::Delivery, name: &str) -> Option<String> {
    let headers = d.properties.headers().as_ref()?;
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        other => Some(format!("{other:?}")),
    }
}

/// A rejected copy names its origin from `x-death` (the exchange and routing key it was
/// published with) and its consumer from the queue. The replayed message carries the
/// message id, payload and headers, without RabbitMQ's or the failure's bookkeeping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_copy_goes_back_to_its_exchange_and_routing_key() {
    goes_back_to_its_exchange(false).await;
}

/// A copy the consumer published (`DeadLetters::Publish`) names its origin in
/// `x-dedup-origin`, and goes back there the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_copy_goes_back_to_its_exchange_and_routing_key() {
    goes_back_to_its_exchange(true).await;
}

async fn goes_back_to_its_exchange(publishing: bool) {
    let Some(mut fx) = <Fixture as ReplayBroker>::new().await else {
        return;
    };
    fx.publishing = publishing;
    let w = World::start(fx).await;
    w.dead_letter(&strings(&["bad-1"])).await;
    let first = w.fx.tapped().await;
    assert_eq!(first.len(), 1, "the tap got the original");

    let mut dead = w.fx.dead_letters().await;
    assert!(dead.describe().contains(&w.fx.topology.dead_letter_queue));
    let letters = dead.take(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.origin, w.fx.destination());
    assert_eq!(
        letter.header(FAILURE_CONSUMER_HEADER),
        Some(w.fx.topology.queue.as_str())
    );
    if publishing {
        assert_eq!(
            letter.header(ORIGIN_HEADER),
            Some(w.fx.destination().as_str())
        );
    } else {
        assert_eq!(letter.header("x-first-death-reason"), Some("rejected"));
    }
    dead.give_back().await.unwrap();
    drop(dead);

    let report = w.replay(&Pick::All).await;
    assert_eq!(report.replayed, ["bad-1"], "{report:?}");
    let again = w.fx.tapped().await;
    assert_eq!(again.len(), 1, "the tap got the replayed message");
    let replayed = &again[0];
    let id = replayed
        .properties
        .message_id()
        .as_ref()
        .map(|s| s.as_str());
    assert_eq!(id, Some("bad-1"));
    assert_eq!(replayed.data, b"payload of bad-1");
    assert_eq!(header(replayed, "tenant").as_deref(), Some("acme"));
    let names: Vec<String> = replayed
        .properties
        .headers()
        .as_ref()
        .map(|h| h.inner().keys().map(|k| k.to_string()).collect())
        .unwrap_or_default();
    assert!(
        names
            .iter()
            .all(|n| !n.starts_with("x-") && !replay::is_dead_letter_header(n)),
        "{names:?}"
    );
    w.finish().await;
}

/// `replay::open` opens an `amqp://` URL's `?queue=`. A URL without it is refused, naming
/// what it lacks; a missing queue is refused.
#[tokio::test]
async fn open_reads_the_queue_from_the_url() {
    let Some(fx) = <Fixture as ReplayBroker>::new().await else {
        return;
    };
    let url = fx.url.clone();
    let named = format!("{url}?queue={}", fx.topology.dead_letter_queue);
    let dead = replay::open(&named).await.unwrap();
    let queue = &fx.topology.dead_letter_queue;
    assert_eq!(dead.describe(), format!("RabbitMQ queue {queue:?}"));
    drop(dead);
    fx.cleanup().await;
    let missing = replay::open(&url).await.err().expect("no queue named");
    assert!(missing.to_string().contains("?queue="), "{missing}");
    let absent = format!("{url}?queue=dedup-no-such-queue-{}", uuid::Uuid::new_v4());
    let refused = replay::open(&absent).await.err().expect("no such queue");
    assert!(
        matches!(refused, dedup_brokers::BrokerError::Refused { .. }),
        "{refused:?}"
    );
}
