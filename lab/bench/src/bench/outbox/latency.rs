//! Commit-to-publish latency with `NOTIFY` wakeups against polling alone (PostgreSQL +
//! RabbitMQ).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_brokers::rabbitmq::RabbitPublisher;
use dedup_core::outbox::{OutboxStore, Relay, RelayConfig};
use futures::StreamExt;
use lapin::Connection as AmqpConnection;
use lapin::options::{BasicConsumeOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use serde_json::{Map, json};

use crate::bench::driver::percentile_ms;
use crate::bench::{Names, Params, Result, Row, row};

use super::postgres::{Extra, Pg};
use super::probe::Probe;
use super::relay::{RELAY_BATCH, declare};
use super::support::lock;

/// How often the latency measure's producer commits a row: 1 000 msgs/s, the rate issue
/// 55's target is set at.
pub(crate) const LATENCY_TICK: Duration = Duration::from_millis(1);

/// The relay's poll interval with `NOTIFY` (long: wakeups do the work).
const NOTIFY_POLL: Duration = Duration::from_secs(10);

/// The relay's poll interval without wakeups.
const POLL_ONLY: Duration = Duration::from_millis(100);

/// The p99 commit-to-publish latency issue 55 asks for at most, with `NOTIFY`, at 1 000
/// msgs/s.
pub(crate) const P99_TARGET_MS: f64 = 10.0;

/// Arrival times by message id, stamped by the latency measure's consumer.
type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

/// Measure 2c: commit-to-receipt latency with `NOTIFY`, against polling alone.
pub(super) async fn commit_to_publish(
    params: &Params,
    pg: &Pg,
    amqp: &str,
    names: &Names,
) -> Result<Vec<Row>> {
    let n = (params.messages / 2).max(10);
    let queue = format!("dedup-bench-{}-latency", names.run);
    let destination = format!("/{queue}");
    let connection = AmqpConnection::connect(amqp, lapin::ConnectionProperties::default()).await?;
    let admin = declare(&connection, &queue).await?;
    let arrivals: Arrivals = Arc::default();
    let mut consumer = connection
        .create_channel()
        .await?
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    let stamping = {
        let arrivals = Arc::clone(&arrivals);
        tokio::spawn(async move {
            while let Some(Ok(d)) = consumer.next().await {
                let now = Instant::now();
                if let Some(id) = d.properties.message_id() {
                    lock(&arrivals).insert(id.as_str().to_owned(), now);
                }
            }
        })
    };
    let measured = async {
        let mut out = Vec::new();
        for (mode, poll, notify) in [("notify", NOTIFY_POLL, true), ("polling", POLL_ONLY, false)] {
            let store: Arc<dyn OutboxStore> = Arc::new(Probe::new(pg.outbox.clone(), notify));
            let publisher = RabbitPublisher::new(&connection).await?;
            let relay = Relay::new(store, Arc::new(publisher))
                .with_config(
                    RelayConfig::default()
                        .batch_size(RELAY_BATCH)
                        .poll_interval(poll),
                )
                .start()?;
            // Let it LISTEN before the first commit.
            tokio::time::sleep(Duration::from_millis(300)).await;
            // One producer transaction starts every tick, whether or not the previous one
            // committed: the offered rate does not slow down with the commits.
            let producing = Instant::now();
            let mut tick = tokio::time::interval(LATENCY_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut writes = Vec::with_capacity(n);
            for i in 0..n {
                tick.tick().await;
                let (pg, destination) = (pg.clone(), destination.clone());
                writes.push(tokio::spawn(async move {
                    let id = format!("{mode}-{i}");
                    pg.write(id.clone(), Extra::Enqueue, &destination).await?;
                    Ok::<_, crate::bench::BoxError>((id, Instant::now()))
                }));
            }
            let mut commits = Vec::with_capacity(n);
            for write in writes {
                commits.push(write.await??);
            }
            let rate = n as f64 / producing.elapsed().as_secs_f64();
            let deadline = Instant::now() + Duration::from_secs(30);
            while commits
                .iter()
                .any(|(id, _)| !lock(&arrivals).contains_key(id))
            {
                if Instant::now() > deadline {
                    return Err(format!("{mode}: not every message arrived within 30 s").into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let round = relay.stop().await;
            let arrived = lock(&arrivals);
            let latencies: Vec<Duration> = commits
                .iter()
                .map(|(id, committed)| arrived[id].saturating_duration_since(*committed))
                .collect();
            out.push((latencies, round.sent, rate));
        }
        Ok::<_, crate::bench::BoxError>(out)
    }
    .await;
    stamping.abort();
    admin
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    let _ = connection.close(200, "bench done".into()).await;
    let mut measured = measured?;
    let (mut polling, polling_sent, polling_rate) = measured.pop().ok_or("no polling run")?;
    let (mut notify, notify_sent, notify_rate) = measured.pop().ok_or("no notify run")?;
    let mut rows = Vec::new();
    for (measure, q) in [
        ("commit_to_publish_p50", 0.50),
        ("commit_to_publish_p99", 0.99),
    ] {
        let (with, without) = (
            percentile_ms(&mut notify, q),
            percentile_ms(&mut polling, q),
        );
        let mut details = Map::new();
        details.insert("notify_ms".into(), json!(with));
        details.insert("polling_ms".into(), json!(without));
        details.insert(
            "notify_poll_interval_ms".into(),
            json!(NOTIFY_POLL.as_millis()),
        );
        details.insert("polling_interval_ms".into(), json!(POLL_ONLY.as_millis()));
        details.insert("commit_every_ms".into(), json!(LATENCY_TICK.as_millis()));
        // The rate the producer transactions reached (started one per tick, to the last
        // commit).
        details.insert("notify_commits_per_s".into(), json!(notify_rate));
        details.insert("polling_commits_per_s".into(), json!(polling_rate));
        details.insert("notify_sent".into(), json!(notify_sent));
        details.insert("polling_sent".into(), json!(polling_sent));
        details.insert("target_p99_ms".into(), json!(P99_TARGET_MS));
        details.insert("messages".into(), json!(n));
        details.insert(
            "setup".into(),
            json!(format!(
                "{}; latency from the producer's commit returning to a consumer's receipt",
                pg.setup
            )),
        );
        rows.push(row(
            "postgres+rabbitmq",
            measure,
            1,
            "ms",
            (with.max(1e-6), without.max(1e-6)),
            details,
        ));
    }
    Ok(rows)
}
