//! The Redis Streams rows: a stream and consumer group per run.

use std::sync::Arc;
use std::time::Instant;

use dedup_core::{Inbox, MemoryStore};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::harness::{
    Broker, Kind, PAYLOAD, Workers, adapter_run, admit, at_millis, config, handle_once,
};
use crate::bench::driver::Run;
use crate::bench::{Names, Result};
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
            let (inbox, mut acks, stream) = (Arc::clone(&inbox), acks.clone(), stream.to_owned());
            workers
                .run(slot, async move {
                    if kind == Kind::InboxLoop {
                        // The adapter's admission floor: the entry id's milliseconds.
                        let ms = entry.id.split('-').next().and_then(|ms| ms.parse().ok());
                        admit(ms.map(at_millis))?;
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
