//! RabbitMQ: a queue whose dead-letter exchange keeps the rejected copies.

use dedup_brokers::ConsumerConfig;
use dedup_brokers::rabbitmq::{RabbitConsumer, RabbitPublisher, Topology};
use dedup_core::outbox::Publisher;
use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};

use crate::{Broker, row};

/// A queue with its dead-letter exchange and queue. The application publishes to it
/// through the default exchange.
pub struct Rabbit {
    url: String,
    conn: Connection,
    topology: Topology,
}

impl Rabbit {
    /// A fresh topology on `url`, declared.
    pub async fn new(url: String) -> Rabbit {
        let conn = Connection::connect(&url, ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ");
        let tag = uuid::Uuid::new_v4().simple();
        let topology = Topology::for_queue(format!("dedup-cli-replay-{tag}"));
        let ch = conn.create_channel().await.unwrap();
        topology.declare(&ch).await.unwrap();
        Rabbit {
            url,
            conn,
            topology,
        }
    }
}

impl Broker for Rabbit {
    type Source = RabbitConsumer;

    fn dead_url(&self) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        let queue = &self.topology.dead_letter_queue;
        format!("{}{sep}queue={queue}", self.url)
    }

    /// The queue: a rejected copy names it as its consumer (it carries no failure headers).
    fn consumer(&self) -> String {
        self.topology.queue.clone()
    }

    fn source(&self, config: ConsumerConfig) -> RabbitConsumer {
        RabbitConsumer::from_uri(&self.url, &self.topology.queue, config)
            .declare(self.topology.clone())
    }

    async fn publish(&self, id: &str) {
        let publisher = RabbitPublisher::new(&self.conn).await.unwrap();
        let to = format!("/{}", self.topology.queue);
        publisher.publish(&row(&to, id)).await.unwrap();
    }

    async fn cleanup(self) {
        let ch = self.conn.create_channel().await.unwrap();
        let t = &self.topology;
        for q in [&t.queue, &t.dead_letter_queue] {
            let _ = ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let x = t.dead_letter_exchange.as_str();
        let _ = ch
            .exchange_delete(x.into(), ExchangeDeleteOptions::default())
            .await;
    }
}
