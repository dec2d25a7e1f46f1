//! The Google Cloud Pub/Sub rows: a topic and a subscription per run (and a dead-letter
//! topic with a subscription, which the adapter requires), on the server the client was
//! made for (the emulator in the test servers).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use dedup_core::{Inbox, MemoryStore};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::harness::{Broker, Kind, PAYLOAD, Workers, adapter_run, admit, config, handle_once};
use crate::bench::driver::Run;
use crate::bench::{Names, Result};
use dedup_brokers::pubsub::gcloud_gax::conn::Environment;
use dedup_brokers::pubsub::gcloud_googleapis::pubsub::v1::{
    AcknowledgeRequest, PubsubMessage, PullRequest,
};
use dedup_brokers::pubsub::gcloud_pubsub::client::{Client, ClientConfig};
use dedup_brokers::pubsub::gcloud_pubsub::subscription::SubscriptionConfig;
use dedup_brokers::pubsub::{MESSAGE_ID_ATTRIBUTE, PubSubConsumer};

/// The subscriptions' ack deadline: longer than any run's wait, so the raw loop (which
/// does not extend it) gets no redelivery.
const ACK_DEADLINE: i32 = 120;

/// How long the raw loop waits after a pull that found nothing (the adapter's wait too).
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// Pub/Sub through gcloud-pubsub's gRPC client.
pub(in crate::bench) struct PubSub {
    client: Client,
    run: String,
}

impl PubSub {
    /// A client of the emulator at `host` (`host:port`), project `dedup-bench`.
    pub(in crate::bench) async fn connect(host: &str, names: &Names) -> Result<Self> {
        let config = ClientConfig {
            environment: Environment::Emulator(host.to_owned()),
            project_id: Some("dedup-bench".into()),
            ..ClientConfig::default()
        };
        Ok(PubSub {
            client: Client::new(config).await?,
            run: names.run.clone(),
        })
    }
}

impl Broker for PubSub {
    fn consume(
        &self,
        kind: Kind,
        tag: String,
        n: usize,
        in_flight: usize,
    ) -> BoxFuture<'static, Result<Run>> {
        let client = self.client.clone();
        let topic = format!("dedup-bench-{}-{tag}", self.run);
        async move {
            let (sub, dead, dead_sub) = (
                format!("{topic}-sub"),
                format!("{topic}-dead"),
                format!("{topic}-dead-sub"),
            );
            let settings = || SubscriptionConfig {
                ack_deadline_seconds: ACK_DEADLINE,
                ..SubscriptionConfig::default()
            };
            for (t, s) in [(&topic, &sub), (&dead, &dead_sub)] {
                client.create_topic(t, None, None).await?;
                client.create_subscription(s, t, settings(), None).await?;
            }
            let run = async {
                let publisher = client.topic(&topic).new_publisher(None);
                for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
                    let messages = chunk
                        .iter()
                        .map(|k| PubsubMessage {
                            data: PAYLOAD.to_vec().into(),
                            attributes: [
                                (MESSAGE_ID_ATTRIBUTE.to_owned(), format!("{tag}-{k}")),
                                ("type".to_owned(), "OrderPlaced".to_owned()),
                            ]
                            .into_iter()
                            .collect(),
                            ..PubsubMessage::default()
                        })
                        .collect();
                    publisher.publish_immediately(messages, None).await?;
                }
                match kind {
                    Kind::Adapter => {
                        let consumer =
                            PubSubConsumer::new(client.clone(), &sub, &dead, config(in_flight));
                        adapter_run(n, |handler, stopped| async move {
                            consumer.run(handler, stopped).await?;
                            Ok(())
                        })
                        .await
                    }
                    Kind::Raw | Kind::InboxLoop => raw(&client, &sub, kind, n, in_flight).await,
                }
            }
            .await;
            for s in [&sub, &dead_sub] {
                client.subscription(s).delete(None).await?;
            }
            for t in [&topic, &dead] {
                client.topic(t).delete(None).await?;
            }
            run
        }
        .boxed()
    }

    fn setup(&self) -> String {
        "Google Cloud Pub/Sub emulator: a topic and subscription per run (ack deadline 120 s), \
         unary pulls of the free slots answered at once (50 ms wait when empty), one \
         acknowledge per message; the adapter also extends each message's ack deadline \
         while it is held (a task per message)"
            .into()
    }
}

async fn raw(client: &Client, sub: &str, kind: Kind, n: usize, in_flight: usize) -> Result<Run> {
    let inbox = Arc::new(Inbox::new(MemoryStore::new()));
    let subscription = client.subscription(sub);
    let subscriber = subscription.get_client();
    let name = subscription.fully_qualified_name().to_owned();
    let mut workers = Workers::new(in_flight);
    let started = Instant::now();
    let mut taken = 0;
    while taken < n {
        let slots = workers.free().await?;
        #[allow(deprecated)] // return_immediately, as the adapter pulls
        let request = PullRequest {
            subscription: name.clone(),
            return_immediately: true,
            max_messages: i32::try_from(slots.len())?,
        };
        let got = subscriber
            .pull(request, None)
            .await?
            .into_inner()
            .received_messages;
        if got.is_empty() {
            tokio::time::sleep(IDLE_WAIT).await;
            continue;
        }
        let mut slots = slots.into_iter();
        for received in got {
            let slot = slots.next().ok_or("the server sent more than asked")?;
            taken += 1;
            let (inbox, subscriber, name) = (Arc::clone(&inbox), subscriber.clone(), name.clone());
            workers
                .run(slot, async move {
                    if kind == Kind::InboxLoop {
                        // The adapter's admission floor: the message's publish time.
                        let published = received
                            .message
                            .as_ref()
                            .and_then(|m| m.publish_time.as_ref())
                            .and_then(|t| {
                                let secs = u64::try_from(t.seconds).ok()?;
                                let nanos = u32::try_from(t.nanos).ok()?;
                                Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos))
                            });
                        admit(published)?;
                        let id = received
                            .message
                            .as_ref()
                            .and_then(|m| m.attributes.get(MESSAGE_ID_ATTRIBUTE))
                            .map(String::as_str);
                        handle_once(&inbox, "bench", id).await?;
                    }
                    let ack = AcknowledgeRequest {
                        subscription: name,
                        ack_ids: vec![received.ack_id],
                    };
                    subscriber.acknowledge(ack, None).await?;
                    Ok(())
                })
                .await?;
        }
    }
    workers.finish().await?;
    Ok(Run {
        elapsed: started.elapsed(),
        samples: Vec::new(),
    })
}
