//! The outbox relay's configuration: each builder sets its own field and keeps the others.

use std::time::Duration;

use dedup_core::outbox::RelayConfig;
use dedup_core::{Backoff, Retention};

#[test]
fn each_builder_sets_its_own_field() {
    let config = RelayConfig::default()
        .batch_size(7)
        .hold(Duration::from_secs(60))
        .mark_margin(Duration::from_secs(9))
        .poll_interval(Duration::from_millis(250))
        .max_attempts(3)
        .backoff(Backoff::Interval(Duration::from_secs(2)))
        .rounds_in_flight(2)
        .linger(Duration::from_millis(5))
        .retention(None)
        .stop_grace(Duration::from_secs(4));
    let expected = {
        let mut c = RelayConfig::default();
        c.batch_size = 7;
        c.hold = Duration::from_secs(60);
        c.mark_margin = Duration::from_secs(9);
        c.poll_interval = Duration::from_millis(250);
        c.max_attempts = 3;
        c.backoff = Backoff::Interval(Duration::from_secs(2));
        c.rounds_in_flight = 2;
        c.linger = Duration::from_millis(5);
        c.retention = None;
        c.stop_grace = Duration::from_secs(4);
        c
    };
    assert_eq!(config, expected);
    assert_ne!(config, RelayConfig::default(), "every field moved");
}

#[test]
fn a_relay_runs_at_least_one_round_at_once() {
    assert_eq!(
        RelayConfig::default().rounds_in_flight(0).rounds_in_flight,
        1
    );
    assert_eq!(RelayConfig::default().rounds_in_flight, 4);
}

#[test]
fn the_retention_builder_keeps_a_given_policy() {
    let retention = Retention::default();
    let config = RelayConfig::default()
        .retention(None)
        .retention(Some(retention));
    assert_eq!(config.retention, Some(retention));
}
