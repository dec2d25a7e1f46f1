//! The RabbitMQ publisher and consumer against the real RabbitMQ (`DEDUP_AMQP_URL`).

mod suite;
mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use dedup_brokers::rabbitmq::{
    DEAD_LETTER_EXCHANGE_ARG, DeadLetters, RabbitConsumer, RabbitPublisher, Topology,
};
use dedup_brokers::{
    BrokerError, ConsumerConfig, DEAD_LETTER_REASON, Delivery, shutdown, with_inbox,
};
use dedup_core::outbox::Publisher;
use dedup_core::{Inbox, InboxConfig, MemoryStore};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use suite::{BrokerFactory, DeadLetter, broker_suite};
use support::{Runs, assert_retried_in_process, config, counting, row, transient_once, wait_until};
use tokio::sync::Semaphore;

struct Fixture {
    conn: Connection,
    queue: String,
    dead: String,
    /// Each suite worker's own connection, closed when it is killed.
    workers: Mutex<HashMap<String, Connection>>,
}

impl Fixture {
    /// A fresh queue whose dead-letter exchange is the default one, routing to `<queue>.dead`.
    async fn new() -> Option<Fixture> {
        let url = dedup_conformance::server_url("DEDUP_AMQP_URL")?;
        let conn = Connection::connect(&url, ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ");
        let queue = format!("dedup-brokers-{}", uuid::Uuid::new_v4().simple());
        let dead = format!("{queue}.dead");
        let ch = conn.create_channel().await.unwrap();
        ch.queue_declare(
            dead.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        let mut args = FieldTable::default();
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(dead.as_str().into()),
        );
        ch.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), args)
            .await
            .unwrap();
        Some(Fixture {
            conn,
            queue,
            dead,
            workers: Mutex::default(),
        })
    }

    async fn channel(&self) -> Channel {
        self.conn.create_channel().await.unwrap()
    }

    fn dest(&self) -> String {
        format!("/{}", self.queue)
    }

    async fn publish_raw(&self, props: BasicProperties, payload: &[u8]) {
        let ch = self.channel().await;
        ch.basic_publish(
            "".into(),
            self.queue.as_str().into(),
            BasicPublishOptions::default(),
            payload,
            props,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }

    /// Everything in `queue` right now (acked).
    async fn drain(&self, queue: &str) -> Vec<lapin::message::Delivery> {
        let ch = self.channel().await;
        let mut out = Vec::new();
        while let Some(m) = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            out.push(m.delivery);
        }
        out
    }

    async fn cleanup(self) {
        let ch = self.channel().await;
        for q in [&self.queue, &self.dead] {
            let _ = ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
}

fn text(value: Option<&AMQPValue>) -> Option<String> {
    match value? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// The suite's consumers dead-letter by publishing a copy to `<queue>.dead` (the reason as
/// a header); the queue's own dead-letter exchange (the default) has its own test below.
#[async_trait]
impl BrokerFactory for Fixture {
    type Source = RabbitConsumer;

    async fn new() -> Option<Self> {
        Fixture::new().await
    }

    async fn publish(&self, ids: &[String]) {
        let publisher = RabbitPublisher::new(&self.conn).await.unwrap();
        let rows: Vec<_> = ids.iter().map(|id| row(&self.dest(), id)).collect();
        let results = publisher.publish_all(&rows).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }

    async fn publish_without_id(&self, payload: &[u8]) {
        self.publish_raw(BasicProperties::default(), payload).await;
    }

    async fn source(&self, worker: &str, config: &ConsumerConfig) -> RabbitConsumer {
        let url = dedup_conformance::server_url("DEDUP_AMQP_URL").unwrap();
        let conn = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = conn.create_channel().await.unwrap();
        let dead_letters = DeadLetters::Publish {
            publisher: RabbitPublisher::new(&conn).await.unwrap(),
            destination: format!("/{}", self.dead),
        };
        self.workers.lock().unwrap().insert(worker.to_owned(), conn);
        RabbitConsumer::new(channel, self.queue.clone(), config.clone()).dead_letters(dead_letters)
    }

    async fn kill(&self, worker: &str) {
        let conn = self.workers.lock().unwrap().remove(worker);
        if let Some(conn) = conn {
            // The aborted consumer may have left its channel closing: the connection's
            // close then reports it, and closes anyway.
            let _ = conn.close(0, "killed".into()).await;
            assert!(
                !conn.status().connected(),
                "the worker's connection is closed"
            );
        }
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        // Read without taking them: get, then requeue by closing the channel unacked.
        let ch = self.channel().await;
        let mut out = Vec::new();
        while let Some(m) = ch
            .basic_get(self.dead.as_str().into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
        {
            let props = &m.delivery.properties;
            let headers = props
                .headers()
                .as_ref()
                .map(|h| {
                    h.inner()
                        .iter()
                        .filter_map(|(n, v)| Some((n.as_str().to_owned(), text(Some(v))?)))
                        .collect()
                })
                .unwrap_or_default();
            out.push(DeadLetter {
                headers,
                message_id: props.message_id().as_ref().map(|s| s.to_string()),
                payload: m.delivery.data.clone(),
                reason: props
                    .headers()
                    .as_ref()
                    .and_then(|h| text(h.inner().get(DEAD_LETTER_REASON))),
            });
        }
        ch.close(0, "peeked".into()).await.unwrap();
        out
    }

    async fn outstanding(&self) -> u64 {
        let ch = self.channel().await;
        let q = ch
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        u64::from(q.message_count())
    }

    async fn cleanup(self) {
        Fixture::cleanup(self).await
    }
}

broker_suite!(Fixture);

#[tokio::test]
async fn a_published_row_arrives_with_its_message_id_headers_and_timestamp() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = RabbitPublisher::new(&fx.conn).await.unwrap();
    publisher
        .publish(&row(&fx.dest(), "order-1"))
        .await
        .unwrap();
    let rows = [row(&fx.dest(), "order-2"), row(&fx.dest(), "order-3")];
    let results = publisher.publish_all(&rows).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let got = fx.drain(&fx.queue).await;
    let ids: Vec<_> = got
        .iter()
        .map(|d| d.properties.message_id().as_ref().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["order-1", "order-2", "order-3"]);
    let first = &got[0];
    assert_eq!(first.data, b"payload of order-1");
    let headers = first.properties.headers().as_ref().unwrap();
    assert!(
        matches!(headers.inner().get("tenant"), Some(AMQPValue::LongString(s)) if s.as_bytes() == b"acme"),
        "{headers:?}"
    );
    assert!(first.properties.timestamp().is_some());
    // Unroutable: no queue behind the routing key, so the broker returns it: an error.
    let lost = publisher
        .publish(&row("/no-such-queue-dedup", "order-4"))
        .await;
    assert!(lost.is_err(), "an unroutable publish must not be Ok");
    fx.cleanup().await;
}

#[tokio::test]
async fn deliveries_without_an_id_or_older_than_the_floor_are_dead_lettered_unhandled() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    fx.publish_raw(BasicProperties::default(), b"no id").await;
    let hour_ago = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 3600;
    fx.publish_raw(
        BasicProperties::default()
            .with_message_id("old".into())
            .with_timestamp(hour_ago),
        b"old",
    )
    .await;
    let runs = Runs::default();
    let calls = Arc::new(AtomicU32::new(0));
    let handler = counting(
        &Arc::new(MemoryStore::new()),
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let consumer = RabbitConsumer::new(
        fx.channel().await,
        fx.queue.clone(),
        ConsumerConfig {
            max_age: Some(Duration::from_secs(60)),
            ..config()
        },
    );
    let task = tokio::spawn(consumer.run(handler, signal));
    let mut dead = Vec::new();
    for _ in 0..200 {
        dead.extend(fx.drain(&fx.dead).await);
        if dead.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    let mut payloads: Vec<_> = dead.iter().map(|d| d.data.clone()).collect();
    payloads.sort();
    assert_eq!(payloads, [b"no id".to_vec(), b"old".to_vec()]);
    assert_eq!(stats.refused, 2, "{stats:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the handler never saw them"
    );
    fx.cleanup().await;
}

#[tokio::test]
async fn a_consumer_over_a_channel_ends_with_a_refused_error_when_its_channel_is_lost() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let url = dedup_conformance::server_url("DEDUP_AMQP_URL").unwrap();
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let consumer = RabbitConsumer::new(
        conn.create_channel().await.unwrap(),
        fx.queue.clone(),
        config(),
    );
    let (runs, calls) = (Runs::default(), Arc::new(AtomicU32::new(0)));
    let handler = counting(
        &Arc::new(MemoryStore::new()),
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (_stop, signal) = shutdown();
    let task = tokio::spawn(consumer.run(handler, signal));
    tokio::time::sleep(Duration::from_millis(200)).await;
    conn.close(0, "gone".into()).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("run ends when its channel is lost")
        .unwrap();
    match result {
        Err(e @ dedup_brokers::BrokerError::Refused { .. }) => {
            assert!(e.to_string().contains("RabbitConsumer::from_uri"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    fx.cleanup().await;
}

/// The handler finishes after its delivery's channel closed: the ack cannot go, so the
/// delivery is not counted as settled (health shows no settle) and RabbitMQ keeps the
/// message for a redelivery.
#[tokio::test]
async fn an_ack_whose_channel_closed_first_is_not_counted_as_settled() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = RabbitPublisher::new(&fx.conn).await.unwrap();
    publisher.publish(&row(&fx.dest(), "m-1")).await.unwrap();
    let channel = fx.channel().await;
    let consumer = RabbitConsumer::new(channel.clone(), fx.queue.clone(), config());
    let health = consumer.health();
    let (started, gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let handler = {
        let (started, gate) = (Arc::clone(&started), Arc::clone(&gate));
        with_inbox(
            Inbox::new(MemoryStore::new()),
            move |_lease, _d: Delivery| {
                let (started, gate) = (Arc::clone(&started), Arc::clone(&gate));
                async move {
                    started.add_permits(1);
                    gate.acquire().await.unwrap().forget();
                    Ok::<_, std::io::Error>(None)
                }
            },
        )
    };
    let (_stop, signal) = shutdown();
    let task = tokio::spawn(consumer.run(handler, signal));
    started.acquire().await.unwrap().forget();
    channel.close(200, "gone".into()).await.unwrap();
    gate.add_permits(1);
    let result = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("run ends when its channel is lost")
        .unwrap();
    assert!(
        result.is_err(),
        "a consumer over a lost channel ends: {result:?}"
    );
    let after = health.snapshot();
    assert_eq!(after.last_settle, None, "the ack never went: {after:?}");
    let back = fx.drain(&fx.queue).await;
    let ids: Vec<_> = back
        .iter()
        .map(|d| d.properties.message_id().as_ref().map(|s| s.to_string()))
        .collect();
    assert_eq!(ids, [Some("m-1".to_owned())], "RabbitMQ kept the message");
    fx.cleanup().await;
}

#[tokio::test]
async fn a_transient_error_runs_again_inside_one_delivery_which_is_acked_once() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = RabbitPublisher::new(&fx.conn).await.unwrap();
    publisher
        .publish(&row(&fx.dest(), "parcel-1"))
        .await
        .unwrap();
    let store = Arc::new(MemoryStore::new());
    let log = Arc::default();
    let (stop, signal) = shutdown();
    let consumer = RabbitConsumer::new(fx.channel().await, fx.queue.clone(), config());
    let task = tokio::spawn(consumer.run(transient_once(&store, &log), signal));
    wait_until("the second run", || log.lock().unwrap().len() == 2).await;
    // Time for a wrongly requeued delivery to come back and run a third time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_retried_in_process(&stats, &log);
    assert_eq!(stats.settle_errors, 0, "one ack, accepted: {stats:?}");
    let key = dedup_core::Key::new(fx.queue.as_str(), "parcel-1").unwrap();
    let record = dedup_core::DedupStore::get(&*store, &key)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(record.state, dedup_core::RecordState::Completed { .. }) && record.attempt == 2,
        "{record:?}"
    );
    assert!(
        fx.drain(&fx.queue).await.is_empty(),
        "acked: nothing left in the queue"
    );
    assert!(fx.drain(&fx.dead).await.is_empty(), "nothing dead-lettered");
    fx.cleanup().await;
}

/// A message without a message id, straight to `queue` through the default exchange.
async fn publish_without_id(conn: &Connection, queue: &str, payload: &[u8]) {
    let ch = conn.create_channel().await.unwrap();
    ch.basic_publish(
        "".into(),
        queue.into(),
        BasicPublishOptions::default(),
        payload,
        BasicProperties::default(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let _ = ch.close(200, "published".into()).await;
}

/// Delete `queues` and `exchanges`.
async fn remove(conn: &Connection, queues: &[&str], exchanges: &[&str]) {
    let ch = conn.create_channel().await.unwrap();
    for q in queues {
        let _ = ch
            .queue_delete((*q).into(), QueueDeleteOptions::default())
            .await;
    }
    for x in exchanges {
        let _ = ch
            .exchange_delete((*x).into(), ExchangeDeleteOptions::default())
            .await;
    }
}

/// A consumer that declares its topology makes the queue, its dead-letter exchange and its
/// dead-letter queue: a delivery it rejects (no message id) lands in the dead-letter queue,
/// a good one is handled. A second run declares it all again, unchanged.
#[tokio::test]
async fn a_declared_topology_keeps_what_the_consumer_rejects() {
    let Some(url) = dedup_conformance::server_url("DEDUP_AMQP_URL") else {
        return;
    };
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let topology = Topology::for_queue(format!("dedup-topology-{}", uuid::Uuid::new_v4().simple()));
    let publisher = RabbitPublisher::new(&conn).await.unwrap();
    for round in 0..2 {
        let (runs, calls) = (Runs::default(), Arc::new(AtomicU32::new(0)));
        let store = Arc::new(MemoryStore::new());
        let handler = counting(
            &store,
            InboxConfig::default(),
            &runs,
            &calls,
            Duration::ZERO,
        );
        let consumer =
            RabbitConsumer::from_uri(&url, &topology.queue, config()).declare(topology.clone());
        let health = consumer.health();
        let (stop, signal) = shutdown();
        let task = tokio::spawn(consumer.run(handler, signal));
        wait_until("connected", || health.snapshot().connected).await;
        let id = format!("good-{round}");
        publisher
            .publish(&row(&format!("/{}", topology.queue), &id))
            .await
            .unwrap();
        let bad = format!("no id {round}");
        publish_without_id(&conn, &topology.queue, bad.as_bytes()).await;
        wait_until("the good one handled", || {
            runs.lock().unwrap().contains_key(&id)
        })
        .await;
        let ch = conn.create_channel().await.unwrap();
        let mut dead = Vec::new();
        for _ in 0..200 {
            if let Some(m) = ch
                .basic_get(
                    topology.dead_letter_queue.as_str().into(),
                    BasicGetOptions { no_ack: true },
                )
                .await
                .unwrap()
            {
                dead.push(m.delivery.data.clone());
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        stop.shut_down();
        let stats = task.await.unwrap().unwrap();
        assert_eq!(dead, [bad.into_bytes()], "round {round}: {stats:?}");
        assert_eq!((stats.processed, stats.refused), (1, 1), "{stats:?}");
    }
    remove(
        &conn,
        &[&topology.queue, &topology.dead_letter_queue],
        &[&topology.dead_letter_exchange],
    )
    .await;
}

/// Run a consumer of `queue` made by `make` with a counting handler: its result (given up
/// after 20 s) and the message ids it handled.
async fn run_briefly(
    queue: &str,
    make: impl FnOnce() -> RabbitConsumer,
    until: usize,
) -> (Result<dedup_brokers::ConsumerStats, BrokerError>, Runs) {
    let runs = Runs::default();
    let handler = counting(
        &Arc::new(MemoryStore::new()),
        InboxConfig::default(),
        &runs,
        &Arc::new(AtomicU32::new(0)),
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let task = tokio::spawn(make().run(handler, signal));
    for _ in 0..800 {
        if task.is_finished() || runs.lock().unwrap().len() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    stop.shut_down();
    let result = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap_or_else(|_| panic!("the consumer of {queue} did not stop"))
        .unwrap();
    (result, runs)
}

/// The start-up check of the default dead-lettering (reject to the queue's dead-letter
/// exchange): a queue without `x-dead-letter-exchange` is refused with `MissingTopology`
/// naming the queue and the argument, and nothing is consumed; queues that have one (also
/// with arguments RabbitMQ compares before it, durable or not) run; a policy-set exchange
/// skips the check.
#[tokio::test]
async fn a_queue_without_a_dead_letter_exchange_is_refused_and_nothing_is_consumed() {
    let Some(url) = dedup_conformance::server_url("DEDUP_AMQP_URL") else {
        return;
    };
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let ttl = |args: &mut FieldTable| {
        args.insert("x-message-ttl".into(), AMQPValue::LongInt(600_000));
        args.insert("x-expires".into(), AMQPValue::LongInt(3_600_000));
    };
    let dlx = |args: &mut FieldTable| {
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
    };
    // (queue, durable, with a TTL and expiry, with a dead-letter exchange)
    let queues = [
        (format!("dedup-bare-{tag}"), false, false, false),
        (format!("dedup-bare-ttl-{tag}"), true, true, false),
        (format!("dedup-dlx-ttl-{tag}"), true, true, true),
        (format!("dedup-dlx-{tag}"), false, false, true),
    ];
    let publisher = RabbitPublisher::new(&conn).await.unwrap();
    for (queue, durable, with_ttl, with_dlx) in &queues {
        let mut args = FieldTable::default();
        if *with_ttl {
            ttl(&mut args);
        }
        if *with_dlx {
            dlx(&mut args);
        }
        let options = QueueDeclareOptions {
            durable: *durable,
            ..QueueDeclareOptions::default()
        };
        ch.queue_declare(queue.as_str().into(), options, args)
            .await
            .unwrap();
        publisher
            .publish(&row(&format!("/{queue}"), &format!("m-{queue}")))
            .await
            .unwrap();
    }
    for (queue, _, _, with_dlx) in &queues {
        let (result, runs) =
            run_briefly(queue, || RabbitConsumer::from_uri(&url, queue, config()), 1).await;
        if *with_dlx {
            let stats = result.unwrap_or_else(|e| panic!("{queue} has one: {e}"));
            assert_eq!(stats.processed, 1, "{queue}: {stats:?}");
            continue;
        }
        match result {
            Err(BrokerError::MissingTopology {
                endpoint, missing, ..
            }) => {
                assert_eq!(&endpoint, queue);
                assert_eq!(missing, DEAD_LETTER_EXCHANGE_ARG);
            }
            other => panic!("{queue} must be refused: {other:?}"),
        }
        assert!(runs.lock().unwrap().is_empty(), "{queue}: nothing handled");
        let held = ch
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        assert_eq!(held.message_count(), 1, "{queue}: nothing consumed");
    }
    // Told the exchange comes from a policy, the consumer skips the check and consumes.
    let bare = &queues[0].0;
    let (result, runs) = run_briefly(
        bare,
        || RabbitConsumer::from_uri(&url, bare, config()).dead_letter_exchange_by_policy(),
        1,
    )
    .await;
    assert_eq!(result.unwrap().processed, 1);
    assert_eq!(runs.lock().unwrap().len(), 1);
    let names: Vec<&str> = queues.iter().map(|q| q.0.as_str()).collect();
    remove(&conn, &names, &[]).await;
}

/// A publisher's confirm timeout (20 s by default) fits a relay's default 30 s hold; a
/// 30 s one is refused by the relay.
#[tokio::test]
async fn a_relay_refuses_a_rabbitmq_publisher_whose_confirm_timeout_outlasts_its_hold() {
    let Some(url) = dedup_conformance::server_url("DEDUP_AMQP_URL") else {
        return;
    };
    let default = RabbitPublisher::connect(url, ConnectionProperties::default())
        .await
        .unwrap();
    let slow = default.clone().confirm_timeout(Duration::from_secs(30));
    support::relay_time::assert_relay_checks_timeout(
        Arc::new(default),
        Arc::new(slow),
        Duration::from_secs(30),
    )
    .await;
}
