//! `StreamBacklog` against the real Redis (`DEDUP_REDIS_URL`): what the group has not
//! settled, delivered or not.

use dedup_brokers::BrokerError;
use dedup_brokers::backlog::Backlog;
use dedup_brokers::redis_streams::StreamBacklog;
use redis::AsyncCommands;
use redis::streams::{StreamReadOptions, StreamReadReply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_is_what_the_group_has_not_acknowledged() {
    let Some(url) = dedup_conformance::server_url("DEDUP_REDIS_URL") else {
        return;
    };
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let stream = format!("dedup-backlog-{}", uuid::Uuid::new_v4().simple());
    let _: () = conn
        .xgroup_create_mkstream(&stream, "billing", "0")
        .await
        .unwrap();
    let backlog = StreamBacklog::new(client.clone(), &stream, "billing");
    assert_eq!(backlog.backlog().await.unwrap(), 0);
    for i in 0..5 {
        let _: String = conn.xadd(&stream, "*", &[("n", i)]).await.unwrap();
    }
    assert_eq!(backlog.backlog().await.unwrap(), 5, "none delivered yet");

    // Two delivered, not acknowledged: still waiting.
    let read = StreamReadOptions::default().group("billing", "w1").count(2);
    let got: StreamReadReply = conn.xread_options(&[&stream], &[">"], &read).await.unwrap();
    let ids: Vec<String> = got.keys[0].ids.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(backlog.backlog().await.unwrap(), 5);
    let _: u64 = conn.xack(&stream, "billing", &ids).await.unwrap();
    assert_eq!(backlog.backlog().await.unwrap(), 3);

    let missing = StreamBacklog::new(client, &stream, "shipping");
    let refused = missing.backlog().await;
    assert!(
        matches!(refused, Err(BrokerError::Refused { .. })),
        "{refused:?}"
    );
    let _: () = conn.del(&stream).await.unwrap();
}
