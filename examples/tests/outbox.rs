//! The outbox story against real PostgreSQL and RabbitMQ: once on the servers the test
//! script started, once on its MariaDB (`--store mysql://...`), once on its Kafka (Tansu,
//! `--broker kafka`), and under chaos (worker processes SIGKILLed at every step, a private
//! store server, PostgreSQL or MariaDB, and a private broker, RabbitMQ or Kafka,
//! crash-restarted mid-run).

use dedup_lab::programs as support;

use support::{json_lines, run_example};

/// Runs the story on the store at `store` and the broker of `broker` (its arguments) and
/// checks every order got one invoice and one e-mail.
fn one_invoice_and_one_email_per_order(store: &str, broker: &[&str]) {
    let mut args = vec!["--store", store, "--orders", "40", "--json"];
    args.extend(broker);
    let out = run_example("outbox", &args);
    let r = &json_lines(&out)[0];
    assert_eq!(r["orders"], 40, "{out}");
    assert_eq!(
        r["order_rows"], 40,
        "one order row per order, retries included: {out}"
    );
    assert!(
        r["requests"].as_u64().unwrap() >= 50,
        "every fourth order sent twice: {out}"
    );
    assert_eq!(r["invoices"], 40, "{out}");
    assert_eq!(r["emails"], 40, "{out}");
    assert_eq!(
        (r["doubled"].as_u64(), r["lost"].as_u64()),
        (Some(0), Some(0)),
        "{out}"
    );
    assert_eq!(r["unsent"], 0, "the outbox is drained: {out}");
}

#[test]
fn every_order_gives_one_invoice_and_one_email() {
    let (Some(pg), Some(amqp)) = (
        dedup_conformance::server_url("DEDUP_POSTGRES_URL"),
        dedup_conformance::server_url("DEDUP_AMQP_URL"),
    ) else {
        eprintln!("SKIPPED: DEDUP_POSTGRES_URL or DEDUP_AMQP_URL not set");
        return;
    };
    one_invoice_and_one_email_per_order(&pg, &["--amqp", &amqp]);
}

#[test]
fn on_mysql_every_order_gives_one_invoice_and_one_email() {
    let (Some(mysql), Some(amqp)) = (
        dedup_conformance::server_url("DEDUP_MYSQL_URL"),
        dedup_conformance::server_url("DEDUP_AMQP_URL"),
    ) else {
        eprintln!("SKIPPED: DEDUP_MYSQL_URL or DEDUP_AMQP_URL not set");
        return;
    };
    one_invoice_and_one_email_per_order(&mysql, &["--amqp", &amqp]);
}

#[test]
fn on_kafka_every_order_gives_one_invoice_and_one_email() {
    let (Some(pg), Some(kafka)) = (
        dedup_conformance::server_url("DEDUP_POSTGRES_URL"),
        dedup_conformance::server_url("DEDUP_KAFKA_BROKERS"),
    ) else {
        eprintln!("SKIPPED: DEDUP_POSTGRES_URL or DEDUP_KAFKA_BROKERS not set");
        return;
    };
    one_invoice_and_one_email_per_order(&pg, &["--broker", "kafka", "--kafka", &kafka]);
}

/// Runs the story under chaos with `store` (`postgres` or `mariadb`) as the private store
/// server and `broker` (`rabbitmq` or `kafka`) as the private broker: every kill point is
/// hit, the store and the broker are crash-restarted once each, and still every order gets
/// one invoice and one e-mail.
fn under_chaos(store: &str, broker: &str, orders: u64) {
    let orders_arg = orders.to_string();
    let out = run_example(
        "outbox",
        &[
            "--chaos",
            "--chaos-store",
            store,
            "--broker",
            broker,
            "--orders",
            &orders_arg,
            "--kill-rate",
            "0.03",
            "--json",
        ],
    );
    let r = &json_lines(&out)[0];
    assert_eq!(
        (r["doubled"].as_u64(), r["lost"].as_u64()),
        (Some(0), Some(0)),
        "{out}"
    );
    assert_eq!(r["invoices"], orders, "{out}");
    assert_eq!(r["emails"], orders, "{out}");
    let kills = r["kills"].as_object().expect("kills");
    for point in [
        "relay_take_publish",
        "relay_publish_mark",
        "billing_claim_effect",
        "billing_effect_commit",
        "billing_commit_ack",
        "mail_claim_send",
        "mail_send_commit",
        "mail_commit_ack",
    ] {
        assert!(kills.contains_key(point), "no kill at {point}: {out}");
    }
    assert_eq!(r["restarts"][store], 1, "{out}");
    assert_eq!(r["restarts"][broker], 1, "{out}");
    assert!(
        r["mail_calls"].as_u64().unwrap() > r["emails"].as_u64().unwrap(),
        "a mail worker killed between its send and its commit calls the provider again, \
         which keeps one e-mail: {out}"
    );
}

#[test]
fn under_chaos_every_order_still_gives_one_invoice_and_one_email() {
    if dedup_conformance::server_url("DEDUP_POSTGRES_URL").is_none() {
        eprintln!("SKIPPED: the servers' binaries are installed by scripts/test.sh");
        return;
    }
    under_chaos("postgres", "rabbitmq", 60);
}

/// The same on MariaDB: the MySQL outbox, `TxInbox` and inbox through kills and a MariaDB
/// crash-restart.
#[test]
fn on_mariadb_under_chaos_every_order_still_gives_one_invoice_and_one_email() {
    if dedup_conformance::server_url("DEDUP_MYSQL_URL").is_none() {
        eprintln!("SKIPPED: the servers' binaries are installed by scripts/test.sh");
        return;
    }
    under_chaos("mariadb", "rabbitmq", 40);
}

/// The same on Kafka: a private Tansu on S3 storage (`services.sh start kafka-durable`),
/// SIGKILLed and started again at two thirds of the e-mails; its topics, records and the
/// groups' committed offsets survive, the relays' idempotent producer and the consumer
/// groups reconnect by themselves.
#[test]
fn on_kafka_under_chaos_every_order_still_gives_one_invoice_and_one_email() {
    if dedup_conformance::server_url("DEDUP_KAFKA_BROKERS").is_none() {
        eprintln!("SKIPPED: the servers' binaries are installed by scripts/test.sh");
        return;
    }
    under_chaos("postgres", "kafka", 20);
}
