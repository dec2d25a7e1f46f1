//! `RabbitDepth` against the real RabbitMQ (`DEDUP_AMQP_URL`): the messages ready in the
//! queue, read without changing it.

use dedup_brokers::BrokerError;
use dedup_brokers::backlog::Backlog;
use dedup_brokers::rabbitmq::{RabbitDepth, RabbitPublisher};
use dedup_core::outbox::{OutboxRow, Publisher};
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

fn row(queue: &str, id: &str) -> OutboxRow {
    OutboxRow {
        id: 1,
        destination: format!("/{queue}"),
        message_id: id.into(),
        headers: Vec::new(),
        payload: b"{}".to_vec(),
        ordering_key: None,
        attempts: 1,
        written_at: dedup_core::Timestamp::from_millis(0),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_depth_is_the_messages_ready_in_the_queue() {
    let Some(url) = dedup_conformance::server_url("DEDUP_AMQP_URL") else {
        return;
    };
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ");
    let queue = format!("dedup-depth-{}", uuid::Uuid::new_v4().simple());
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let depth = RabbitDepth::new(&url, &queue);
    assert_eq!(depth.backlog().await.unwrap(), 0);

    let publisher = RabbitPublisher::new(&conn).await.unwrap();
    for i in 0..5 {
        publisher
            .publish(&row(&queue, &format!("m-{i}")))
            .await
            .unwrap();
    }
    assert_eq!(depth.backlog().await.unwrap(), 5);
    for _ in 0..2 {
        let got = ch
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap();
        assert!(got.is_some());
    }
    assert_eq!(depth.backlog().await.unwrap(), 3);

    // A queue that does not exist is refused, and the next read works again.
    let missing = RabbitDepth::new(&url, format!("{queue}-none"));
    let refused = missing.backlog().await;
    assert!(
        matches!(refused, Err(BrokerError::Refused { .. })),
        "{refused:?}"
    );
    ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let gone = depth.backlog().await;
    assert!(matches!(gone, Err(BrokerError::Refused { .. })), "{gone:?}");
}
