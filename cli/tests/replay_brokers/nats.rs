//! NATS: a JetStream stream of the messages, and one capturing the dead-letter subject.

use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::jetstream::stream::Config as StreamConfig;
use dedup_brokers::ConsumerConfig;
use dedup_brokers::nats::{NatsConsumer, NatsPublisher};
use dedup_core::outbox::Publisher;

use crate::{Broker, CONSUMER, row};

/// The streams' duplicate window: short, so that a replay soon after the first publish
/// of a message is not dropped as its duplicate.
const WINDOW: Duration = Duration::from_millis(100);

/// A stream of `subject`, consumed by the durable consumer [`CONSUMER`], and a stream of
/// the dead-letter subject.
pub struct Nats {
    url: String,
    js: Context,
    stream: String,
    subject: String,
    dead_stream: String,
    dead_subject: String,
}

impl Nats {
    /// Fresh streams on `url`.
    pub async fn new(url: String) -> Nats {
        let client = async_nats::connect(url.as_str()).await.expect("connect");
        let tag = uuid::Uuid::new_v4().simple();
        let nats = Nats {
            url,
            js: async_nats::jetstream::new(client),
            stream: format!("DEDUP_CLI_REPLAY_{tag}"),
            subject: format!("dedup.cli.{tag}.orders"),
            dead_stream: format!("DEDUP_CLI_REPLAY_{tag}_DEAD"),
            dead_subject: format!("dedup.cli.{tag}.dead"),
        };
        for (name, subject) in [
            (&nats.stream, &nats.subject),
            (&nats.dead_stream, &nats.dead_subject),
        ] {
            let config = StreamConfig {
                name: name.clone(),
                subjects: vec![subject.clone()],
                duplicate_window: WINDOW,
                ..StreamConfig::default()
            };
            nats.js.create_stream(config).await.expect("a stream");
        }
        nats
    }
}

impl Broker for Nats {
    type Source = NatsConsumer;

    fn dead_url(&self) -> String {
        format!("{}?stream={}", self.url, self.dead_stream)
    }

    fn source(&self, config: ConsumerConfig) -> NatsConsumer {
        NatsConsumer::new(self.js.clone(), &self.stream, CONSUMER, config)
            .dead_letter_subject(&self.dead_subject)
            .ack_wait(Duration::from_secs(5))
    }

    async fn publish(&self, id: &str) {
        let publisher = NatsPublisher::new(self.js.clone());
        publisher.publish(&row(&self.subject, id)).await.unwrap();
    }

    async fn cleanup(self) {
        for s in [&self.stream, &self.dead_stream] {
            let _ = self.js.delete_stream(s).await;
        }
    }
}
