//! The relay's throughput against raw publishing (PostgreSQL + RabbitMQ).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use dedup_brokers::rabbitmq::RabbitPublisher;
use dedup_core::outbox::{OutboxStore, Relay, RelayConfig};
use futures::FutureExt;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
    QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection as AmqpConnection};
use serde_json::{Map, json};

#[cfg(feature = "counted")]
use crate::bench::counted::cpu::{Meter, Server, Spent, listener_of};
use crate::bench::driver::Run;
use crate::bench::rounds::{best_of, contender};
use crate::bench::{Names, Params, Result, Row, row};

use super::postgres::{Pg, prefill};
use super::probe::Probe;
use super::support::lock;

/// Rows per relay take.
pub(super) const RELAY_BATCH: usize = 100;

/// A fresh durable queue on `connection`.
pub(super) async fn declare(connection: &AmqpConnection, queue: &str) -> Result<Channel> {
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
    Ok(channel)
}

/// Measure 2b: a started relay (its default rounds in flight) until it sent every row,
/// against raw confirmed publishes. With the `counted` feature, also the CPU each side
/// spent per message in its timed part: the bench process (the relay or the raw
/// publisher), PostgreSQL (the relay's takes and marks) and RabbitMQ, when they run on
/// this machine.
pub(super) async fn relay_throughput(
    params: &Params,
    pg: &Pg,
    postgres: &str,
    amqp: &str,
    names: &Names,
) -> Result<Row> {
    let n = params.batch_messages;
    let queue = format!("dedup-bench-{}-relay", names.run);
    let destination = format!("/{queue}");
    let connection = AmqpConnection::connect(amqp, lapin::ConnectionProperties::default()).await?;
    let admin = declare(&connection, &queue).await?;
    let publisher = RabbitPublisher::new(&connection).await?;
    let probe = Arc::new(Probe::new(pg.outbox.clone(), true));
    let outbox: Arc<dyn OutboxStore> = Arc::clone(&probe) as Arc<dyn OutboxStore>;
    let relay = Arc::new(
        Relay::new(outbox, Arc::new(publisher))
            .with_config(RelayConfig::default().batch_size(RELAY_BATCH)),
    );
    let raw = connection.create_channel().await?;
    raw.confirm_select(ConfirmSelectOptions::default()).await?;
    // The fastest relay run: its time, its seconds in take and mark_sent, its rounds.
    let fastest = Arc::new(Mutex::new(None::<(Duration, f64, f64, usize)>));
    let meter = Meters::new(postgres, amqp);

    let relay_run = |round: usize| {
        let (relay, pg, destination, admin, queue) = (
            Arc::clone(&relay),
            pg.clone(),
            destination.clone(),
            admin.clone(),
            queue.clone(),
        );
        let (fastest, probe, meter) = (Arc::clone(&fastest), Arc::clone(&probe), meter.clone());
        async move {
            prefill(&pg, &destination, &format!("relay-{round}"), n).await?;
            probe.split();
            // The relay as an application runs it (`start`: its rounds in flight), until
            // it sent every row (watched on its own counters: polling the table would
            // load the server the relay is measured on).
            let mark = meter.mark();
            let started = Instant::now();
            let handle = Relay::clone(&relay).start()?;
            while handle.sent() + handle.dead() < n as u64 {
                if started.elapsed() > Duration::from_secs(120) {
                    handle.stop().await;
                    return Err("the relay did not drain the outbox in 120 s".into());
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let elapsed = started.elapsed();
            let all = handle.stop().await;
            meter.relay(&mark, n);
            if all.failed + all.dead + all.lost > 0 {
                return Err(format!("relay rounds failed rows: {all:?}").into());
            }
            let (sent, rounds) = (all.sent as usize, n.div_ceil(RELAY_BATCH));
            if sent != n {
                return Err(format!("the relay sent {sent} rows, expected {n}").into());
            }
            let (take, mark) = probe.split();
            {
                let mut fastest = lock(&fastest);
                if fastest.is_none_or(|(e, ..)| elapsed < e) {
                    *fastest = Some((elapsed, take, mark, rounds));
                }
            }
            admin
                .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                .await?;
            Ok(Run {
                elapsed,
                samples: Vec::new(),
            })
        }
        .boxed()
    };
    let raw_run = |round: usize| {
        let (raw, queue, admin, meter) = (raw.clone(), queue.clone(), admin.clone(), meter.clone());
        async move {
            let mark = meter.mark();
            let started = Instant::now();
            let mut confirms = Vec::with_capacity(n);
            for k in 0..n {
                confirms.push(publish_raw(&raw, &queue, format!("raw-{round}-{k}")).await?);
            }
            for confirm in confirms {
                match confirm.await? {
                    Confirmation::Ack(None) => {}
                    other => return Err(format!("raw publish: {other:?}").into()),
                }
            }
            let elapsed = started.elapsed();
            meter.raw(&mark, n);
            admin
                .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                .await?;
            Ok(Run {
                elapsed,
                samples: Vec::new(),
            })
        }
        .boxed()
    };
    let measured = best_of(params, vec![contender(relay_run), contender(raw_run)]).await;
    admin
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    let _ = connection.close(200, "bench done".into()).await;
    let runs = measured?;
    let (relay_r, raw_r) = (&runs[0], &runs[1]);
    let mut details = Map::new();
    details.insert("library_msgs_per_s".into(), json!(relay_r.throughput(n)));
    details.insert("raw_msgs_per_s".into(), json!(raw_r.throughput(n)));
    details.insert("library_secs".into(), json!(relay_r.elapsed.as_secs_f64()));
    details.insert("raw_secs".into(), json!(raw_r.elapsed.as_secs_f64()));
    details.insert("relay_batch".into(), json!(RELAY_BATCH));
    let (_, take, mark, rounds) = lock(&fastest).unwrap_or_default();
    details.insert("relay_rounds".into(), json!(rounds));
    // Summed over the relay's rounds in flight, so together they may exceed its time.
    details.insert("relay_take_secs_summed".into(), json!(take));
    details.insert("relay_mark_sent_secs_summed".into(), json!(mark));
    details.insert(
        "relay_rounds_in_flight".into(),
        json!(RelayConfig::default().rounds_in_flight),
    );
    details.insert("messages".into(), json!(n));
    meter.details(&mut details);
    details.insert(
        "setup".into(),
        json!(format!(
            "{}; RabbitMQ durable queue, persistent messages",
            pg.setup
        )),
    );
    Ok(row(
        "postgres+rabbitmq",
        "relay_vs_raw_publish",
        1,
        "msgs/s",
        (relay_r.throughput(n), raw_r.throughput(n)),
        details,
    ))
}

/// One publish with the properties [`RabbitPublisher`] sets (message id, a string header,
/// timestamp, persistent, mandatory) to `queue` through the default exchange.
async fn publish_raw(
    channel: &Channel,
    queue: &str,
    id: String,
) -> Result<lapin::PublisherConfirm> {
    let mut headers = FieldTable::default();
    headers.insert(
        "type".into(),
        AMQPValue::LongString(LongString::from(b"OrderPlaced".to_vec())),
    );
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let props = BasicProperties::default()
        .with_message_id(id.into())
        .with_headers(headers)
        .with_timestamp(now)
        .with_delivery_mode(2);
    Ok(channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            br#"{"order_id":"o-1","item":"book","amount":100}"#,
            props,
        )
        .await?)
}

/// The CPU each side of the relay measure spent in its timed parts, summed over its runs
/// (the `counted` feature; without it, nothing is read).
#[derive(Clone)]
struct Meters {
    #[cfg(feature = "counted")]
    inner: Arc<(Meter, Mutex<(Spent, Spent)>)>,
}

#[cfg(feature = "counted")]
impl Meters {
    /// This process, PostgreSQL's postmaster and its children, and RabbitMQ's process.
    fn new(postgres: &str, amqp: &str) -> Self {
        let meter = Meter::new(vec![
            ("postgres", listener_of(postgres).map(Server::Tree)),
            ("rabbitmq", listener_of(amqp).map(Server::Process)),
        ]);
        Meters {
            inner: Arc::new((meter, Mutex::new(Default::default()))),
        }
    }

    fn mark(&self) -> crate::bench::counted::cpu::Mark {
        self.inner.0.mark()
    }

    /// A relay run that handled `messages` since `mark`.
    fn relay(&self, mark: &crate::bench::counted::cpu::Mark, messages: usize) {
        self.inner
            .0
            .add_since(mark, messages, &mut lock(&self.inner.1).0);
    }

    /// A raw run that handled `messages` since `mark`.
    fn raw(&self, mark: &crate::bench::counted::cpu::Mark, messages: usize) {
        self.inner
            .0
            .add_since(mark, messages, &mut lock(&self.inner.1).1);
    }

    /// The figures, per message over every run of each side: `library_cpu_us` /
    /// `raw_cpu_us` (each `client` and each server's µs, `null` where a server's CPU
    /// cannot be read) and `cpu_ratio` (the sums' ratio, when every part is known).
    fn details(&self, details: &mut Map<String, serde_json::Value>) {
        let (library, raw) = lock(&self.inner.1).clone();
        let ((lib_map, lib_total), (raw_map, raw_total)) =
            (library.per_message_us(), raw.per_message_us());
        details.insert("library_cpu_us".into(), json!(lib_map));
        details.insert("raw_cpu_us".into(), json!(raw_map));
        details.insert(
            "cpu_ratio".into(),
            json!(lib_total.zip(raw_total).map(|(l, r)| l / r)),
        );
    }
}

#[cfg(not(feature = "counted"))]
impl Meters {
    fn new(_: &str, _: &str) -> Self {
        Meters {}
    }
    fn mark(&self) {}
    fn relay(&self, _: &(), _: usize) {}
    fn raw(&self, _: &(), _: usize) {}
    fn details(&self, _: &mut Map<String, serde_json::Value>) {}
}
