//! Following one order across two hops, against the real RabbitMQ (`DEDUP_AMQP_URL`):
//! an API's SQLite outbox, its relay and the RabbitMQ publisher; billing's consumer on a
//! SQLite `TxInbox` writing an invoice message with a `ConsumerOutbox`; billing's relay;
//! the mailer's consumer. Each delivery carries the causation id (the message before it),
//! the order's correlation id and a `traceparent` with the order's trace id, and the
//! inbox's and relay's spans record them.
//!
//! One test in its own binary: it installs a global `tracing` subscriber to read the
//! spans the consumer tasks and the relays open.

mod support;

use std::sync::{Arc, Mutex};

use dedup_brokers::rabbitmq::{RabbitConsumer, RabbitPublisher};
use dedup_brokers::{ConsumerConfig, Delivery, shutdown, with_inbox};
use dedup_core::outbox::{ConsumerOutbox, OutboxMessage, Relay, derived_message_id};
use dedup_core::test_util::Capture;
use dedup_core::trace::TraceParent;
use dedup_core::{Inbox, InboxConfig, Key, MemoryStore};
use dedup_sqlite::{SqliteStore, TxInbox};
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use support::{config, wait_until};

async fn declare(conn: &Connection, queue: &str) {
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_orders_messages_carry_its_causation_correlation_and_trace_id() {
    let Some(url) = dedup_conformance::server_url("DEDUP_AMQP_URL") else {
        return;
    };
    let capture = Capture::default();
    tracing::subscriber::set_global_default(capture.clone()).expect("one subscriber");
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ");
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (orders, invoices) = (
        format!("follow-orders-{run}"),
        format!("follow-invoices-{run}"),
    );
    declare(&conn, &orders).await;
    declare(&conn, &invoices).await;
    let dir = tempfile::tempdir().unwrap();

    // The API: two orders, one under the API call's own traceparent and correlation id,
    // one with what the outbox gives by default.
    let api = SqliteStore::open(dir.path().join("api.db")).await.unwrap();
    let api_call = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (traced, plain) = (format!("order-a-{run}"), format!("order-b-{run}"));
    let messages = [
        OutboxMessage::new(format!("/{orders}"), traced.clone(), b"a".to_vec())
            .unwrap()
            .correlation_id(format!("checkout-{run}"))
            .unwrap()
            .traceparent(api_call)
            .unwrap(),
        OutboxMessage::new(format!("/{orders}"), plain.clone(), b"b".to_vec()).unwrap(),
    ];
    let conn_api = api.open_connection().unwrap();
    assert_eq!(api.outbox().enqueue(&conn_api, &messages).unwrap(), 2);
    let expected: Vec<(String, String, String)> = vec![
        (
            traced.clone(),
            format!("checkout-{run}"),
            "4bf92f3577b34da6a3ce929d0e0e4736".to_owned(),
        ),
        (
            plain.clone(),
            plain.clone(),
            TraceParent::derived(&plain, &plain).trace_id(),
        ),
    ];
    let publisher = Arc::new(RabbitPublisher::new(&conn).await.unwrap());
    let api_relay = Relay::new(Arc::new(api.outbox()), publisher.clone());
    assert_eq!(api_relay.run_once().await.unwrap().sent, 2);

    // Billing: a TxInbox handler that writes one invoice message per order.
    let billing = SqliteStore::open(dir.path().join("billing.db"))
        .await
        .unwrap();
    let inbox = TxInbox::new(billing.clone());
    let seen = Arc::new(Mutex::new(Vec::<Delivery>::new()));
    let handler = {
        let (seen, billing) = (Arc::clone(&seen), billing.clone());
        let invoices = invoices.clone();
        move |key: Key, delivery: Delivery| {
            let (seen, inbox, outbox) = (Arc::clone(&seen), inbox.clone(), billing.outbox());
            let invoices = invoices.clone();
            async move {
                seen.lock().unwrap().push(delivery);
                inbox
                    .handle(&key, None, move |tx, lease| {
                        // No trace given: the delivery's is in scope for this key.
                        let mut out = ConsumerOutbox::new(lease);
                        let m = out.message(format!("/{invoices}"), b"invoice".to_vec())?;
                        outbox.enqueue(tx, &[m])?;
                        Ok::<_, dedup_core::Error>(None)
                    })
                    .await
            }
        }
    };
    let (stop, signal) = shutdown();
    let consumer = RabbitConsumer::new(
        conn.create_channel().await.unwrap(),
        orders.clone(),
        ConsumerConfig {
            consumer: Some("billing".into()),
            ..config()
        },
    );
    let billing_task = tokio::spawn(consumer.run(handler, signal));
    wait_until("billing handled both orders", || {
        seen.lock().unwrap().len() >= 2
    })
    .await;

    // Billing's relay, then the mailer reading the invoices.
    let billing_relay = Relay::new(Arc::new(billing.outbox()), publisher.clone());
    let mut sent = 0;
    for _ in 0..100 {
        sent += billing_relay.run_once().await.unwrap().sent;
        if sent >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(sent, 2, "both invoices published");
    let mailed = Arc::new(Mutex::new(Vec::<Delivery>::new()));
    let mailer = {
        let mailed = Arc::clone(&mailed);
        with_inbox(
            Inbox::from_arc(Arc::new(MemoryStore::new()), InboxConfig::default()),
            move |_lease, delivery: Delivery| {
                let mailed = Arc::clone(&mailed);
                async move {
                    mailed.lock().unwrap().push(delivery);
                    Ok::<_, dedup_core::Error>(None)
                }
            },
        )
    };
    let (stop_mail, mail_signal) = shutdown();
    let mail_consumer = RabbitConsumer::new(
        conn.create_channel().await.unwrap(),
        invoices.clone(),
        ConsumerConfig {
            consumer: Some("mailer".into()),
            ..config()
        },
    );
    let mail_task = tokio::spawn(mail_consumer.run(mailer, mail_signal));
    wait_until("the mailer got both invoices", || {
        mailed.lock().unwrap().len() >= 2
    })
    .await;
    stop.shut_down();
    stop_mail.shut_down();
    billing_task.await.unwrap().unwrap();
    mail_task.await.unwrap().unwrap();

    let seen = seen.lock().unwrap().clone();
    let mailed = mailed.lock().unwrap().clone();
    for (order, correlation, trace_id) in &expected {
        // Hop 1: the order as billing got it.
        let d = seen
            .iter()
            .find(|d| d.message_id.as_deref() == Some(order))
            .expect("billing got the order");
        assert_eq!(d.correlation_id(), Some(correlation.as_str()), "{d:?}");
        assert_eq!(d.causation_id(), None, "an order starts its flow: {d:?}");
        let tp = TraceParent::parse(d.header("traceparent").expect("a traceparent")).unwrap();
        assert_eq!(&tp.trace_id(), trace_id, "{d:?}");

        // Hop 2: the invoice billing wrote while handling it.
        let invoice_id = derived_message_id(&Key::new("billing", order).unwrap(), 0);
        let m = mailed
            .iter()
            .find(|m| m.message_id.as_deref() == Some(&invoice_id))
            .expect("the mailer got the invoice");
        assert_eq!(m.causation_id(), Some(order.as_str()), "{m:?}");
        assert_eq!(m.correlation_id(), Some(correlation.as_str()), "{m:?}");
        let next = m.trace().unwrap();
        assert_eq!(&next.trace_id(), trace_id, "the same trace id: {m:?}");
        assert_ne!(
            next.traceparent().parent_id(),
            tp.parent_id(),
            "a parent id of its own"
        );

        // The spans: the relays' publishes of both hops, billing's consume and inbox.
        let publishes = capture.find("dedup.outbox.publish", "trace_id", trace_id);
        let ids: Vec<&str> = publishes
            .iter()
            .filter_map(|f| f.get("message_id").map(String::as_str))
            .collect();
        assert!(
            ids.contains(&order.as_str()) && ids.contains(&invoice_id.as_str()),
            "{publishes:?}"
        );
        let inbox_spans = capture.find("dedup_inbox", "trace_id", trace_id);
        assert!(
            inbox_spans
                .iter()
                .any(|f| f.get("correlation_id") == Some(correlation)
                    && f.get("consumer").map(String::as_str) == Some("billing")),
            "{inbox_spans:?}"
        );
        assert!(
            inbox_spans
                .iter()
                .any(|f| f.get("causation_id") == Some(order)
                    && f.get("consumer").map(String::as_str) == Some("mailer")),
            "the mailer's lease-mode inbox span: {inbox_spans:?}"
        );
        let consumed = capture.find("dedup.consume", "trace_id", trace_id);
        assert!(
            consumed
                .iter()
                .any(|f| f.get("message_id") == Some(&invoice_id)
                    && f.get("causation_id") == Some(order)),
            "{consumed:?}"
        );
    }

    let ch = conn.create_channel().await.unwrap();
    for q in [&orders, &invoices] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
}
