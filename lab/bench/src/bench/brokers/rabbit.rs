//! The RabbitMQ rows: a durable queue per run, persistent messages.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use dedup_core::{Inbox, MemoryStore};
use futures::FutureExt;
use futures::StreamExt;
use futures::future::BoxFuture;

use super::harness::{Broker, Kind, PAYLOAD, Workers, adapter_run, admit, config, handle_once};
use crate::bench::driver::Run;
use crate::bench::{Names, Result};
use dedup_brokers::rabbitmq::RabbitConsumer;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
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
            connection: Arc::new(Connection::connect(url, ConnectionProperties::default()).await?),
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
                                        // The adapter's admission floor (as NATS's loop).
                                        admit(d.properties.timestamp().map(|secs| {
                                            SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
                                        }))?;
                                        let id = d.properties.message_id().as_ref();
                                        handle_once(&inbox, &queue, id.map(|s| s.as_str())).await?;
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
