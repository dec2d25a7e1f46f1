//! The RabbitMQ publisher and consumer against the real RabbitMQ (`DEDUP_AMQP_URL`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use dedup_brokers::rabbitmq::{DeadLetters, RabbitConsumer, RabbitPublisher};
use dedup_brokers::{ConsumerConfig, DEAD_LETTER_REASON, Delivery, shutdown, with_inbox};
use dedup_core::outbox::{OutboxRow, Publisher};
use dedup_core::{Handled, Inbox, InboxConfig, Key, MemoryStore, Timestamp};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

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

fn row(destination: &str, id: &str) -> OutboxRow {
    OutboxRow {
        id: 1,
        destination: destination.into(),
        message_id: id.into(),
        headers: vec![("tenant".into(), "acme".into())],
        payload: format!("payload of {id}").into_bytes(),
        ordering_key: None,
        written_at: Timestamp::from_system_time(SystemTime::now()),
        attempts: 1,
    }
}

fn config() -> ConsumerConfig {
    ConsumerConfig {
        in_flight: 4,
        retry_delay: Duration::from_millis(50),
        max_retry_delay: Duration::from_millis(200),
        ..ConsumerConfig::default()
    }
}

type Runs = Arc<Mutex<HashMap<String, u32>>>;

fn counting_inbox(
    inbox: Inbox<MemoryStore>,
    runs: &Runs,
    calls: &Arc<AtomicU32>,
) -> impl dedup_brokers::Handle {
    let runs = Arc::clone(runs);
    let calls = Arc::clone(calls);
    let inner = Arc::new(with_inbox(inbox, move |_lease, d: Delivery| {
        let runs = Arc::clone(&runs);
        async move {
            *runs
                .lock()
                .unwrap()
                .entry(d.message_id.clone().unwrap())
                .or_default() += 1;
            Ok::<_, std::io::Error>(Some(b"done".to_vec()))
        }
    }));
    move |key: Key, d: Delivery| {
        let inner = Arc::clone(&inner);
        let calls = Arc::clone(&calls);
        async move {
            let answer = dedup_brokers::Handle::handle(&*inner, &key, &d).await;
            calls.fetch_add(1, Ordering::SeqCst);
            answer
        }
    }
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..200 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting until {what}");
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
    let handler = counting_inbox(Inbox::new(MemoryStore::new()), &runs, &calls);
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
    let runs = runs.lock().unwrap().clone();
    assert_eq!(
        runs,
        HashMap::from([("a".into(), 1), ("b".into(), 1), ("c".into(), 1)])
    );
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
    let inner = Arc::new(with_inbox(
        Inbox::from_arc(Arc::clone(&store), InboxConfig::default()),
        {
            let runs = Arc::clone(&runs);
            move |_lease, d: Delivery| {
                let runs = Arc::clone(&runs);
                async move {
                    *runs
                        .lock()
                        .unwrap()
                        .entry(d.message_id.unwrap())
                        .or_default() += 1;
                    Ok::<_, std::io::Error>(None)
                }
            }
        },
    ));
    let hang = {
        let committed = Arc::clone(&committed);
        move |key: Key, d: Delivery| {
            let inner = Arc::clone(&inner);
            let committed = Arc::clone(&committed);
            async move {
                let answer = dedup_brokers::Handle::handle(&*inner, &key, &d).await;
                assert!(matches!(answer, Ok(Handled::Processed { .. })));
                committed.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
                answer
            }
        }
    };
    let a = RabbitConsumer::new(
        conn_a.create_channel().await.unwrap(),
        fx.queue.clone(),
        config(),
    );
    let task_a = tokio::spawn(a.run(hang, dedup_brokers::Shutdown::never()));
    wait_until("A committed", || committed.load(Ordering::SeqCst) == 1).await;
    // Killed: the task and its connection are gone without an ack.
    task_a.abort();
    conn_a.close(0, "killed".into()).await.unwrap();

    let calls = Arc::new(AtomicU32::new(0));
    let b_handler = counting_inbox(
        Inbox::from_arc(Arc::clone(&store), InboxConfig::default()),
        &runs,
        &calls,
    );
    let (stop, signal) = shutdown();
    let b = RabbitConsumer::new(fx.channel().await, fx.queue.clone(), config());
    let task_b = tokio::spawn(b.run(b_handler, signal));
    wait_until("B got the redelivery", || calls.load(Ordering::SeqCst) == 1).await;
    stop.shut_down();
    let stats = task_b.await.unwrap().unwrap();
    assert_eq!((stats.processed, stats.duplicates), (0, 1), "{stats:?}");
    assert_eq!(runs.lock().unwrap()["order-1"], 1, "the handler ran once");
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
    let handler = counting_inbox(Inbox::new(MemoryStore::new()), &runs, &calls);
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
    let inbox = Inbox::new(MemoryStore::new()).with_config(InboxConfig {
        max_attempts: Some(3),
        ..InboxConfig::default()
    });
    let handler = with_inbox(inbox, {
        let runs = Arc::clone(&runs);
        move |_lease, _d: Delivery| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Err::<Option<Vec<u8>>, _>("cannot parse") }
        }
    });
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
    let slow = |runs: &Runs| {
        let runs = Arc::clone(runs);
        with_inbox(
            Inbox::from_arc(Arc::clone(&store), InboxConfig::default()),
            move |_lease, d: Delivery| {
                let runs = Arc::clone(&runs);
                async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    *runs
                        .lock()
                        .unwrap()
                        .entry(d.message_id.unwrap())
                        .or_default() += 1;
                    Ok::<_, std::io::Error>(None)
                }
            },
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
