//! The broker consumers against the real RabbitMQ, Redis and Kafka (Tansu) the test script
//! starts.

use dedup_lab::programs as support;

use support::{json_lines, run_example};

#[test]
fn rabbitmq_consumer_killed_before_ack_the_redelivery_is_processed_once() {
    let Some(url) = dedup_conformance::server_url("DEDUP_AMQP_URL") else {
        eprintln!("SKIPPED: DEDUP_AMQP_URL not set");
        return;
    };
    let out = run_example("rabbitmq", &["--amqp", &url]);
    let r = &json_lines(&out)[0];
    assert_eq!(r["published"], 6, "{out}");
    assert_eq!(r["killed_before_ack"], true, "{out}");
    assert_eq!(r["charges"], 5, "one charge per order:\n{out}");
    assert_eq!(
        (r["doubled"].as_u64(), r["lost"].as_u64()),
        (Some(0), Some(0)),
        "{out}"
    );
    // A processed order-1..3 (order-2's duplicate skipped); B got order-3 again, redelivered,
    // and acked it as a duplicate.
    assert_eq!(r["a"]["processed"], 3, "{out}");
    assert!(r["b"]["redelivered"].as_u64().unwrap() >= 1, "{out}");
    assert!(r["b"]["duplicates"].as_u64().unwrap() >= 1, "{out}");
    assert_eq!(r["b"]["processed"], 2, "{out}");
}

#[test]
fn redis_streams_dead_consumers_pending_entries_are_reclaimed_and_processed_once() {
    let Some(url) = dedup_conformance::server_url("DEDUP_REDIS_URL") else {
        eprintln!("SKIPPED: DEDUP_REDIS_URL not set");
        return;
    };
    let out = run_example("redis_streams", &["--redis", &url]);
    let r = &json_lines(&out)[0];
    assert_eq!(r["charges"], 5, "{out}");
    assert_eq!(r["doubled"], 0, "{out}");
    assert_eq!(r["distinct_orders_charged"], 5, "{out}");
    assert_eq!(r["pending"], 0, "nothing left pending:\n{out}");
    assert_eq!(r["worker_1"]["deliveries"], 4, "{out}");
    assert_eq!(
        r["worker_2"]["redelivered"], 4,
        "all of worker 1's entries:\n{out}"
    );
    assert_eq!(r["worker_2"]["duplicates"], 4, "{out}");
    assert_eq!(r["worker_2"]["processed"], 2, "{out}");
}

#[test]
fn kafka_consumer_killed_before_its_record_settled_the_redelivery_is_processed_once() {
    let Some(brokers) = dedup_conformance::server_url("DEDUP_KAFKA_BROKERS") else {
        eprintln!("SKIPPED: DEDUP_KAFKA_BROKERS not set");
        return;
    };
    let out = run_example("kafka", &["--kafka", &brokers]);
    let r = &json_lines(&out)[0];
    assert_eq!(r["records"], 6, "{out}");
    assert_eq!(r["charges"], 5, "one charge per order:\n{out}");
    assert_eq!(
        (r["doubled"].as_u64(), r["lost"].as_u64()),
        (Some(0), Some(0)),
        "{out}"
    );
    // A processed order-1..3 (the second order-2 record a duplicate) and died on order-3;
    // B was given order-3 again, a duplicate, then processed order-4 and order-5.
    assert_eq!(r["a"]["processed"], 3, "{out}");
    assert_eq!(r["a"]["duplicates"], 1, "{out}");
    assert_eq!(r["a_last"], "order-3", "{out}");
    assert!(r["b"]["duplicates"].as_u64().unwrap() >= 1, "{out}");
    assert_eq!(r["b"]["processed"], 2, "{out}");
    assert_eq!(
        r["committed"], 6,
        "every record settled and committed:\n{out}"
    );
}
