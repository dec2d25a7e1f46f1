//! `NatsBacklog` against the real NATS server (`DEDUP_NATS_URL`): what the durable
//! consumer has not settled, delivered or not.

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::Config as StreamConfig;
use dedup_brokers::BrokerError;
use dedup_brokers::backlog::Backlog;
use dedup_brokers::nats::NatsBacklog;
use futures::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_is_what_the_consumer_has_not_acknowledged() {
    let Some(url) = dedup_conformance::server_url("DEDUP_NATS_URL") else {
        return;
    };
    let client = async_nats::connect(url.as_str()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let (name, subject) = (format!("DEDUP_{tag}"), format!("dedup.{tag}.orders"));
    let stream = js
        .create_stream(StreamConfig {
            name: name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let consumer: PullConsumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("billing".into()),
            ack_policy: AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let backlog = NatsBacklog::new(js.clone(), &name, "billing");
    assert_eq!(backlog.backlog().await.unwrap(), 0);
    for i in 0..5 {
        js.publish(subject.clone(), format!("{i}").into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    assert_eq!(backlog.backlog().await.unwrap(), 5, "none delivered yet");

    // Two delivered, not acknowledged: still waiting.
    let mut batch = consumer.fetch().max_messages(2).messages().await.unwrap();
    let mut taken = Vec::new();
    while let Some(m) = batch.next().await {
        taken.push(m.unwrap());
    }
    assert_eq!(taken.len(), 2);
    assert_eq!(backlog.backlog().await.unwrap(), 5);
    for m in &taken {
        m.double_ack().await.unwrap();
    }
    assert_eq!(backlog.backlog().await.unwrap(), 3);

    let missing = NatsBacklog::new(js.clone(), &name, "shipping");
    let refused = missing.backlog().await;
    assert!(
        matches!(refused, Err(BrokerError::Refused { .. })),
        "{refused:?}"
    );
    js.delete_stream(&name).await.unwrap();
}
