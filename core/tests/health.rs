//! Health probes on the reference model: the relay's readiness follows its publishes and
//! its running, the checks' report combines their probes.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::MemoryStore;
use dedup_core::health::{HealthChecks, Probe};
use dedup_core::outbox::{MemoryOutbox, MemoryPublisher, OutboxMessage, Relay, RelayConfig};

fn msg(destination: &str, id: &str) -> OutboxMessage {
    OutboxMessage::new(destination, id, b"{}".to_vec()).unwrap()
}

/// Waits until `probe`'s readiness is `ready`, or fails after 5 s.
async fn until_ready(probe: &dyn Probe, ready: bool) -> dedup_core::health::ProbeReport {
    for _ in 0..250 {
        let report = probe.probe().await;
        if report.ready == ready {
            return report;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{} never became ready = {ready}", probe.name());
}

#[tokio::test]
async fn relay_is_ready_while_running_and_publishing() {
    let outbox = MemoryOutbox::new();
    let publisher = MemoryPublisher::new();
    let relay = Relay::new(Arc::new(outbox.clone()), Arc::new(publisher.clone())).with_config(
        RelayConfig::default()
            .poll_interval(Duration::from_millis(10))
            .retention(None),
    );
    let health = relay.health();
    let before = health.probe().await;
    assert!(!before.ready, "a relay not started is not ready");
    assert_eq!(before.detail, "not running");

    let running = relay.start().unwrap();
    outbox.enqueue(&[msg("invoices", "a")]).unwrap();
    let report = until_ready(&health, true).await;
    assert!(report.live);
    while health.snapshot().last_publish.is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Every publish fails: the broker is away.
    publisher.fail("invoices", None);
    outbox.enqueue(&[msg("invoices", "b")]).unwrap();
    let report = until_ready(&health, false).await;
    assert_eq!(report.detail, "publish failing");
    assert_eq!(report.connected, Some(false));
    assert!(report.live, "a failing broker is no reason to restart");

    // It comes back: the next publish is accepted.
    publisher.fail("invoices", Some(0));
    outbox.enqueue(&[msg("invoices", "c")]).unwrap();
    until_ready(&health, true).await;

    running.stop().await;
    assert_eq!(health.probe().await.detail, "not running");
}

#[tokio::test]
async fn checks_are_ready_only_when_every_probe_is() {
    let outbox = MemoryOutbox::new();
    let relay = Relay::new(Arc::new(outbox), Arc::new(MemoryPublisher::new()));
    let checks = HealthChecks::new()
        .with_store("store", Arc::new(MemoryStore::new()))
        .with(relay.health());
    let report = checks.report().await;
    assert!(!report.ready, "the relay is not started");
    assert!(report.live);
    let names: Vec<_> = report.probes.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["store", "relay"]);
    assert!(report.probes[0].ready);
    assert!(HealthChecks::new().report().await.ready);
}
