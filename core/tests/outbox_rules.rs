//! The outbox's shared types on their own: the names of a row's states, the counts a
//! store's statistics query adds up, the cut of a stored error, a message's limits, what
//! `MemoryPublisher` keeps and fails, and `MemoryOutbox`'s holds, reads and purge.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::outbox::{
    AfterFailure, DestinationStats, DestinationTally, MAX_DESTINATION_LEN, MAX_ERROR_LEN,
    MAX_HEADER_NAME_LEN, MAX_HEADER_VALUE_LEN, MemoryOutbox, MemoryPublisher, OutboxMessage,
    OutboxQuery, OutboxRow, OutboxState, OutboxStats, OutboxStore, Publisher, cut_error,
};
use dedup_core::{Clock, ManualClock, PurgeOptions, Timestamp};

const ALL: [(OutboxState, &str); 4] = [
    (OutboxState::Pending, "pending"),
    (OutboxState::Held, "held"),
    (OutboxState::Sent, "sent"),
    (OutboxState::Dead, "dead"),
];

#[test]
fn each_state_has_its_stored_name_and_parses_back_from_it() {
    for (state, name) in ALL {
        assert_eq!(state.as_str(), name);
        assert_eq!(state.to_string(), name);
        assert_eq!(OutboxState::parse(name), Some(state));
    }
}

#[test]
fn an_unknown_name_is_no_state() {
    for name in ["", "Pending", "failed", "sent "] {
        assert_eq!(OutboxState::parse(name), None, "{name:?}");
    }
}

#[test]
fn counts_add_up_by_state_and_the_oldest_unsent_row_is_kept() {
    let now = Timestamp::from_millis(100_000);
    let mut stats = OutboxStats {
        now,
        ..OutboxStats::default()
    };
    let at = Timestamp::from_millis;
    stats
        .count_state("sql", "pending", 2, Some(at(90_000)))
        .unwrap();
    stats
        .count_state("sql", "pending", 3, Some(at(95_000)))
        .unwrap();
    stats
        .count_state("sql", "held", 1, Some(at(80_000)))
        .unwrap();
    stats
        .count_state("sql", "sent", 5, Some(at(1_000)))
        .unwrap();
    stats
        .count_state("sql", "dead", 4, Some(at(2_000)))
        .unwrap();
    let expected = OutboxStats {
        pending: 5,
        held: 1,
        sent: 5,
        dead: 4,
        oldest_unsent: Some(at(80_000)),
        now,
    };
    assert_eq!(stats, expected, "sent and dead rows are not unsent");
    assert_eq!(stats.oldest_unsent_age(), Duration::from_secs(20));
    assert_eq!(OutboxStats::default().oldest_unsent_age(), Duration::ZERO);
}

#[test]
fn an_unknown_state_is_a_store_error_and_counts_nothing() {
    let mut stats = OutboxStats::default();
    let error = stats.count_state("sql", "lost", 7, None).unwrap_err();
    assert!(!error.is_retryable(), "{error:?}");
    let chain = dedup_core::error_chain(&error);
    assert!(chain.contains("unknown state \"lost\""), "{chain}");
    assert_eq!(stats, OutboxStats::default());
}

#[test]
fn a_tally_counts_each_destination_apart_in_order() {
    let now = Timestamp::from_millis(50_000);
    let mut tally = DestinationTally::at(now);
    tally
        .add(
            "sql",
            "orders",
            "pending",
            2,
            Some(Timestamp::from_millis(40_000)),
        )
        .unwrap();
    tally.add("sql", "invoices", "dead", 1, None).unwrap();
    tally.add("sql", "orders", "sent", 3, None).unwrap();
    assert!(tally.add("sql", "orders", "lost", 1, None).is_err());
    let of = |pending, sent, dead, oldest_unsent| OutboxStats {
        pending,
        sent,
        dead,
        oldest_unsent,
        now,
        ..OutboxStats::default()
    };
    let expected = [
        DestinationStats {
            destination: "invoices".to_owned(),
            stats: of(0, 0, 1, None),
        },
        DestinationStats {
            destination: "orders".to_owned(),
            stats: of(2, 3, 0, Some(Timestamp::from_millis(40_000))),
        },
    ];
    assert_eq!(tally.finish(), expected);
}

#[test]
fn a_stored_error_is_cut_at_a_character_boundary() {
    let short = "broker refused";
    assert_eq!(cut_error(short), short);
    let exact = "e".repeat(MAX_ERROR_LEN);
    assert_eq!(cut_error(&exact), exact);
    // A 2-byte character across the limit is left out whole.
    let long = format!("{}é tail", "e".repeat(MAX_ERROR_LEN - 1));
    assert_eq!(cut_error(&long), "e".repeat(MAX_ERROR_LEN - 1));
}

fn row(id: i64, destination: &str) -> OutboxRow {
    OutboxRow {
        id,
        destination: destination.to_owned(),
        message_id: format!("m-{id}"),
        headers: Vec::new(),
        payload: b"{}".to_vec(),
        ordering_key: None,
        written_at: Timestamp::from_millis(1_000),
        attempts: 1,
    }
}

#[tokio::test]
async fn a_memory_publisher_fails_a_destination_the_times_it_was_told_then_keeps_each_row() {
    let publisher = MemoryPublisher::new();
    assert_eq!(publisher.name(), "memory");
    publisher.fail("orders", Some(2));
    for _ in 0..2 {
        let err = publisher.publish(&row(1, "orders")).await.unwrap_err();
        assert_eq!(err.to_string(), "memory publisher told to fail orders");
    }
    publisher.publish(&row(1, "orders")).await.unwrap();
    publisher.publish(&row(2, "mails")).await.unwrap();
    publisher.publish(&row(1, "orders")).await.unwrap();
    // Every row accepted, in order, copies included.
    assert_eq!(
        publisher.published(),
        [row(1, "orders"), row(2, "mails"), row(1, "orders")]
    );
    assert_eq!(publisher.message_ids(), ["m-1", "m-2", "m-1"]);
}

#[tokio::test]
async fn a_shared_publisher_publishes_and_fails_as_the_one_it_shares() {
    let publisher = MemoryPublisher::new();
    let shared = Arc::new(publisher.clone());
    publisher.fail("m-1", None);
    let failed = <Arc<MemoryPublisher> as Publisher>::publish(&shared, &row(1, "orders")).await;
    assert!(failed.is_err(), "{failed:?}");
    <Arc<MemoryPublisher> as Publisher>::publish(&shared, &row(2, "orders"))
        .await
        .unwrap();
    assert_eq!(publisher.message_ids(), ["m-2"]);
}

#[test]
fn a_message_takes_each_field_at_its_limit_and_refuses_one_more() {
    let m = OutboxMessage::new("orders", "m-1", b"{}".to_vec()).unwrap();
    assert_eq!(m.destination(), "orders");
    assert_eq!(m.message_id(), "m-1");
    assert_eq!(m.payload(), b"{}");
    assert_eq!(m.ordering_key_str(), None);
    let keyed = m.clone().ordering_key("customer-7").unwrap();
    assert_eq!(keyed.ordering_key_str(), Some("customer-7"));
    let destination = "d".repeat(MAX_DESTINATION_LEN);
    assert!(OutboxMessage::new(&destination, "m-1", Vec::new()).is_ok());
    let over = format!("{destination}d");
    assert!(OutboxMessage::new(over, "m-1", Vec::new()).is_err());
    let name = "n".repeat(MAX_HEADER_NAME_LEN);
    let value = "v".repeat(MAX_HEADER_VALUE_LEN);
    let longest = m.clone().header(&name, &value).unwrap();
    assert_eq!(longest.headers().last(), Some(&(name.clone(), value)));
    assert!(m.clone().header(format!("{name}n"), "v").is_err());
    let too_long = "v".repeat(MAX_HEADER_VALUE_LEN + 1);
    assert!(m.clone().header("n", too_long).is_err());
    // The longest delay is 30 days.
    let thirty_days = Duration::from_secs(30 * 24 * 3600);
    let due = m.clone().deliver_after(thirty_days).unwrap();
    assert_eq!(due.delay(), thirty_days);
    let over = thirty_days + Duration::from_millis(1);
    assert!(m.deliver_after(over).is_err());
}

#[tokio::test]
async fn a_memory_outbox_hold_is_over_at_its_last_instant() {
    let clock = Arc::new(ManualClock::starting_now());
    let outbox = MemoryOutbox::with_clock(clock.clone());
    assert_eq!(outbox.backend(), "memory");
    let message = OutboxMessage::new("orders", "m-1", b"{}".to_vec()).unwrap();
    outbox.enqueue(&[message]).unwrap();
    let hold = Duration::from_secs(10);
    let first = outbox.take(10, hold).await.unwrap();
    assert_eq!(first.rows.len(), 1);
    clock.advance(hold - Duration::from_millis(1));
    let held = outbox.take(10, hold).await.unwrap();
    assert!(held.rows.is_empty(), "still held: {held:?}");
    // At `until` the hold is over: another take gets the row, the first token marks nothing.
    clock.advance(Duration::from_millis(1));
    let again = outbox.take(10, hold).await.unwrap();
    assert_eq!(again.rows.len(), 1);
    let marked = outbox.mark_sent(&first.token, &[again.rows[0].id]).await;
    assert_eq!(marked.unwrap(), Vec::<i64>::new());
}

#[tokio::test]
async fn a_memory_outbox_reads_back_its_rows_and_purges_only_old_sent_ones() {
    let clock = Arc::new(ManualClock::starting_now());
    let outbox = MemoryOutbox::with_clock(clock.clone());
    let message = |id: &str, to: &str| OutboxMessage::new(to, id, b"{}".to_vec()).unwrap();
    let messages = [
        message("m-1", "orders"),
        message("m-2", "orders"),
        message("m-3", "mails"),
    ];
    outbox.enqueue(&messages).unwrap();
    let held = outbox.take(1, Duration::from_secs(10)).await.unwrap();
    let first = held.rows[0].id;
    outbox.mark_sent(&held.token, &[first]).await.unwrap();

    let stats = outbox.stats().await.unwrap();
    assert_eq!(stats.now, clock.now());
    assert_eq!((stats.pending, stats.sent), (2, 1));
    let by_destination = outbox.stats_by_destination().await.unwrap();
    let pending: Vec<_> = (by_destination.iter())
        .map(|d| (d.destination.as_str(), d.stats.pending))
        .collect();
    assert_eq!(pending, [("mails", 1), ("orders", 1)]);
    let after_first = OutboxQuery {
        after_id: Some(first),
        limit: 10,
        ..OutboxQuery::default()
    };
    let listed = outbox.list(&after_first).await.unwrap();
    let ids: Vec<_> = listed.iter().map(|e| e.row.message_id.as_str()).collect();
    assert_eq!(ids, ["m-2", "m-3"]);
    let only = |state, destination: Option<&str>| OutboxQuery {
        state,
        destination: destination.map(str::to_owned),
        limit: 10,
        ..OutboxQuery::default()
    };
    let sent = outbox.list(&only(Some(OutboxState::Sent), None)).await;
    assert_eq!(sent.unwrap()[0].row.message_id, "m-1");
    let mails = outbox.list(&only(None, Some("mails"))).await.unwrap();
    assert_eq!(mails.len(), 1);
    assert_eq!(mails[0].row.message_id, "m-3");

    // A sent row younger than the retention stays; past it, it goes, in one batch.
    let retention = PurgeOptions::older_than(Duration::from_secs(60));
    assert_eq!(outbox.purge(&retention).await.unwrap().completed, 0);
    clock.advance(Duration::from_secs(61));
    let report = outbox.purge(&retention).await.unwrap();
    assert_eq!((report.completed, report.batches), (1, 1));
    assert_eq!(
        outbox.stats().await.unwrap().pending,
        2,
        "unsent rows are kept"
    );
}

#[tokio::test]
async fn a_memory_outbox_retries_a_dead_row_and_not_a_sent_one() {
    let outbox = MemoryOutbox::new();
    let message = |id: &str| OutboxMessage::new("orders", id, b"{}".to_vec()).unwrap();
    outbox.enqueue(&[message("m-1"), message("m-2")]).unwrap();
    let held = outbox.take(2, Duration::from_secs(10)).await.unwrap();
    let (dead, sent) = (held.rows[0].id, held.rows[1].id);
    let failed = outbox.mark_failed(&held.token, dead, "refused", AfterFailure::Dead);
    assert!(failed.await.unwrap());
    outbox.mark_sent(&held.token, &[sent]).await.unwrap();
    assert!(!outbox.retry(sent).await.unwrap(), "a sent row stays sent");
    assert!(outbox.retry(dead).await.unwrap());
    let again = outbox.take(2, Duration::from_secs(10)).await.unwrap();
    let taken: Vec<_> = again.rows.iter().map(|r| (r.id, r.attempts)).collect();
    assert_eq!(
        taken,
        [(dead, 1)],
        "pending again, its attempts counted afresh"
    );
}
