//! The RabbitMQ publisher and consumer against the real RabbitMQ (`DEDUP_AMQP_URL`).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use dedup_brokers::rabbitmq::{DeadLetters, RabbitConsumer, RabbitPublisher};
use dedup_brokers::{ConsumerConfig, DEAD_LETTER_REASON, Shutdown, shutdown};
use dedup_core::outbox::Publisher;
use dedup_core::{InboxConfig, MemoryStore};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use support::{
    Runs, all_once, assert_one_at_a_time, assert_retried_in_process, commit_then_hang, config,
    counting, ids, one_at_a_time_probe, one_in_flight, poison, row, transient_once, wait_until,
};

struct Fixture {
    conn: Connection,
    queue: String,
    dead: String,
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
        Some(Fixture { conn, queue, dead })
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
async fn duplicates_published_on_purpose_are_acked_without_running_the_handler() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = RabbitPublisher::new(&fx.conn).await.unwrap();
    let rows: Vec<_> = ["a", "b", "a", "a", "c"]
        .iter()
        .map(|id| row(&fx.dest(), id))
        .collect();
    assert!(publisher.publish_all(&rows).await.iter().all(Result::is_ok));

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
    let consumer = RabbitConsumer::new(fx.channel().await, fx.queue.clone(), config());
    let task = tokio::spawn(consumer.run(handler, signal));
    wait_until("five deliveries were handled", || {
        calls.load(Ordering::SeqCst) == 5
    })
    .await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!((stats.processed, stats.duplicates), (3, 2), "{stats:?}");
    assert!(all_once(&runs, 3), "a, b and c ran once each");
    assert!(
        fx.drain(&fx.queue).await.is_empty(),
        "every delivery was acked"
    );
    fx.cleanup().await;
}

#[tokio::test]
async fn a_consumer_killed_before_its_ack_has_its_redelivery_absorbed() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = RabbitPublisher::new(&fx.conn).await.unwrap();
    publisher
        .publish(&row(&fx.dest(), "order-1"))
        .await
        .unwrap();
    let store = Arc::new(MemoryStore::new());
    let runs = Runs::default();

    // Consumer A, on a connection of its own: processes (commits) and hangs before its ack.
    let url = dedup_conformance::server_url("DEDUP_AMQP_URL").unwrap();
    let conn_a = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let committed = Arc::new(AtomicU32::new(0));
    let hang = commit_then_hang(&store, &runs, &committed);
    let a = RabbitConsumer::new(
        conn_a.create_channel().await.unwrap(),
        fx.queue.clone(),
        config(),
    );
    let task_a = tokio::spawn(a.run(hang, Shutdown::never()));
    wait_until("A committed", || committed.load(Ordering::SeqCst) == 1).await;
    // Killed: the task and its connection are gone without an ack.
    task_a.abort();
    conn_a.close(0, "killed".into()).await.unwrap();

    let calls = Arc::new(AtomicU32::new(0));
    let b_handler = counting(
        &store,
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let b = RabbitConsumer::new(fx.channel().await, fx.queue.clone(), config());
    let task_b = tokio::spawn(b.run(b_handler, signal));
    wait_until("B got the redelivery", || calls.load(Ordering::SeqCst) == 1).await;
    stop.shut_down();
    let stats = task_b.await.unwrap().unwrap();
    assert_eq!((stats.processed, stats.duplicates), (0, 1), "{stats:?}");
    assert!(all_once(&runs, 1), "the handler ran once");
    assert!(fx.drain(&fx.queue).await.is_empty());
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
async fn a_poison_message_reaches_the_dead_letters_after_max_attempts() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = RabbitPublisher::new(&fx.conn).await.unwrap();
    publisher.publish(&row(&fx.dest(), "poison")).await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let handler = poison(MemoryStore::new(), 3, &runs);
    let (stop, signal) = shutdown();
    let consumer = RabbitConsumer::new(fx.channel().await, fx.queue.clone(), config())
        .dead_letters(DeadLetters::Publish {
            publisher: RabbitPublisher::new(&fx.conn).await.unwrap(),
            destination: format!("/{}", fx.dead),
        });
    let task = tokio::spawn(consumer.run(handler, signal));
    let mut dead = Vec::new();
    for _ in 0..200 {
        dead.extend(fx.drain(&fx.dead).await);
        if !dead.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(
        d.properties.message_id().as_ref().unwrap().as_str(),
        "poison"
    );
    let reason = d
        .properties
        .headers()
        .as_ref()
        .unwrap()
        .inner()
        .get(DEAD_LETTER_REASON)
        .cloned();
    assert!(
        matches!(&reason, Some(AMQPValue::LongString(s)) if s.to_string().contains("attempts used up")),
        "{reason:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "three attempts, then no more"
    );
    assert_eq!((stats.errors, stats.dead_letters), (3, 1), "{stats:?}");
    assert!(
        fx.drain(&fx.queue).await.is_empty(),
        "the original was acked"
    );
    fx.cleanup().await;
}

#[tokio::test]
async fn shutdown_with_messages_in_flight_loses_none() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = RabbitPublisher::new(&fx.conn).await.unwrap();
    let rows: Vec<_> = (0..20)
        .map(|i| row(&fx.dest(), &format!("m-{i}")))
        .collect();
    assert!(publisher.publish_all(&rows).await.iter().all(Result::is_ok));
    let store = Arc::new(MemoryStore::new());
    let runs = Runs::default();
    let calls = Arc::new(AtomicU32::new(0));
    let slow = |runs: &Runs| {
        counting(
            &store,
            InboxConfig::default(),
            runs,
            &calls,
            Duration::from_millis(100),
        )
    };
    let (stop, signal) = shutdown();
    let first = RabbitConsumer::new(fx.channel().await, fx.queue.clone(), config());
    let task = tokio::spawn(first.run(slow(&runs), signal));
    wait_until("some ran", || runs.lock().unwrap().len() >= 2).await;
    stop.shut_down();
    let first_stats = task.await.unwrap().unwrap();
    assert!(first_stats.processed < 20, "stopped early: {first_stats:?}");

    let (stop, signal) = shutdown();
    let second = RabbitConsumer::new(fx.channel().await, fx.queue.clone(), config());
    let task = tokio::spawn(second.run(slow(&runs), signal));
    wait_until("all ran", || runs.lock().unwrap().len() == 20).await;
    stop.shut_down();
    let second_stats = task.await.unwrap().unwrap();
    assert_eq!(first_stats.processed + second_stats.processed, 20);
    assert!(
        runs.lock().unwrap().values().all(|n| *n == 1),
        "each ran once"
    );
    assert!(fx.drain(&fx.queue).await.is_empty());
    fx.cleanup().await;
}

#[tokio::test]
async fn with_one_in_flight_messages_run_one_at_a_time_in_queue_order() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = RabbitPublisher::new(&fx.conn).await.unwrap();
    for id in ids(10) {
        publisher.publish(&row(&fx.dest(), &id)).await.unwrap();
    }
    let (order, most) = (Arc::default(), Arc::new(AtomicU32::new(0)));
    let one = one_in_flight();
    let (stop, signal) = shutdown();
    let consumer = RabbitConsumer::new(fx.channel().await, fx.queue.clone(), one);
    let task = tokio::spawn(consumer.run(one_at_a_time_probe(&order, &most), signal));
    wait_until("all ran", || order.lock().unwrap().len() == 10).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_one_at_a_time(&stats, &order, &most, 10);
    assert!(fx.drain(&fx.queue).await.is_empty());
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
