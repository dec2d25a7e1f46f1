//! The NATS JetStream rows: a stream and durable pull consumer per run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_core::{Inbox, MemoryStore};
use futures::FutureExt;
use futures::StreamExt;
use futures::future::BoxFuture;

use super::harness::{Broker, Kind, PAYLOAD, Workers, adapter_run, admit, config, handle_once};
use crate::bench::driver::Run;
use crate::bench::{Names, Result};
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
                        // The adapter's admission floor reads the stored time from the
                        // ack subject; a loop with its guarantee does too.
                        admit(Some(message.info()?.published.into()))?;
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
