//! The outbox: only committed rows are published, at least once, with one id; holds never
//! overlap; failures back off and die without blocking others; order per ordering key;
//! late commits are not skipped; sent rows are purged after retention; an id is kept once.
//! The operations one by one are in `outbox_operations.rs`.
//!
//! Publishing goes through the core [`Relay`] and a [`MemoryPublisher`], so the relay is
//! exercised on every backend too. Time moves only on the context's clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dedup_core::outbox::{
    MemoryPublisher, OutboxMessage, OutboxQuery, OutboxState, OutboxStore, Relay, RelayConfig,
};
use dedup_core::{Backoff, PurgeOptions};

use crate::TestContext;
use crate::TxEnd;
use crate::outbox::{OutboxFactory, OutboxUnderTest};
use crate::support::LEASE;

const HOUR: Duration = Duration::from_secs(3600);

pub(super) async fn setup<F: OutboxFactory>(
    factory: &F,
    clause: &str,
) -> (TestContext, OutboxUnderTest) {
    let ctx = TestContext::new(clause);
    let outbox = factory.open(&ctx).await;
    (ctx, outbox)
}

pub(super) fn msg(destination: &str, id: &str) -> OutboxMessage {
    OutboxMessage::new(destination, id, format!("payload of {id}").into_bytes())
        .expect("valid message")
}

fn keyed(id: &str, key: &str) -> OutboxMessage {
    msg("orders", id).ordering_key(key).expect("valid key")
}

pub(super) async fn commit(outbox: &OutboxUnderTest, messages: &[OutboxMessage]) {
    outbox
        .producer
        .enqueue(messages, TxEnd::Commit)
        .await
        .expect("enqueue and commit");
}

fn relay(outbox: &OutboxUnderTest, publisher: &MemoryPublisher, config: RelayConfig) -> Relay {
    Relay::new(Arc::clone(&outbox.store), Arc::new(publisher.clone())).with_config(config)
}

fn quick() -> RelayConfig {
    RelayConfig::default()
        .hold(LEASE)
        .max_attempts(3)
        .backoff(Backoff::Interval(Duration::from_secs(1)))
}

/// Relay rounds until one takes nothing (at most 50).
async fn drain(relay: &Relay) {
    for _ in 0..50 {
        let round = relay.run_once().await.expect("relay round");
        if round.taken == 0 {
            return;
        }
    }
    panic!("the relay still took rows after 50 rounds");
}

pub(super) async fn entries(store: &dyn OutboxStore) -> Vec<dedup_core::outbox::OutboxEntry> {
    store
        .list(&OutboxQuery {
            limit: 1000,
            ..OutboxQuery::default()
        })
        .await
        .expect("list")
}

pub(super) async fn state_of(store: &dyn OutboxStore, message_id: &str) -> OutboxState {
    entries(store)
        .await
        .into_iter()
        .find(|e| e.row.message_id == message_id)
        .unwrap_or_else(|| panic!("row {message_id} is not in the outbox"))
        .state
}

/// Every committed row is published once by a relay, with its destination, id, headers and
/// payload as written, and is then sent.
pub async fn outbox_publishes_every_committed_row<F: OutboxFactory>(factory: &F) {
    let (_ctx, outbox) = setup(factory, "outbox_committed").await;
    let with_headers = msg("invoices", "m-1")
        .header("content-type", "application/json")
        .and_then(|m| {
            m.header(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )
        })
        .expect("headers");
    commit(&outbox, &[with_headers.clone(), msg("orders", "m-2")]).await;
    commit(
        &outbox,
        &[
            msg("orders", "m-3"),
            msg("orders", "m-4"),
            msg("mail", "m-5"),
        ],
    )
    .await;
    let publisher = MemoryPublisher::new();
    drain(&relay(&outbox, &publisher, quick())).await;

    let mut ids = publisher.message_ids();
    ids.sort();
    assert_eq!(
        ids,
        ["m-1", "m-2", "m-3", "m-4", "m-5"],
        "each committed row published once"
    );
    let first = publisher
        .published()
        .into_iter()
        .find(|r| r.message_id == "m-1")
        .expect("m-1 published");
    assert_eq!(first.destination, "invoices");
    assert_eq!(first.payload, with_headers.payload(), "payload as written");
    assert_eq!(
        first.headers,
        with_headers.headers(),
        "headers as written, in order"
    );
    let stats = outbox.store.stats().await.expect("stats");
    assert_eq!(
        (stats.sent, stats.pending, stats.held),
        (5, 0, 0),
        "{stats:?}"
    );
}

/// A row written in a transaction that rolled back is never published, never listed.
pub async fn outbox_never_publishes_a_rolled_back_row<F: OutboxFactory>(factory: &F) {
    let (_ctx, outbox) = setup(factory, "outbox_rollback").await;
    outbox
        .producer
        .enqueue(&[msg("orders", "rolled-back")], TxEnd::Rollback)
        .await
        .expect("enqueue, then roll back");
    commit(&outbox, &[msg("orders", "committed")]).await;
    let publisher = MemoryPublisher::new();
    drain(&relay(&outbox, &publisher, quick())).await;
    assert_eq!(
        publisher.message_ids(),
        ["committed"],
        "the rolled-back row was published"
    );
    let listed: Vec<String> = entries(&*outbox.store)
        .await
        .into_iter()
        .map(|e| e.row.message_id)
        .collect();
    assert_eq!(listed, ["committed"], "a rolled-back row is in the outbox");
}

/// A relay that published and died before its mark leaves the row held until the hold runs
/// out; then another relay publishes it again, with the same message id, and the dead
/// relay's late mark changes nothing.
pub async fn outbox_republishes_with_the_same_id_after_a_relay_died_before_its_mark<
    F: OutboxFactory,
>(
    factory: &F,
) {
    let (ctx, outbox) = setup(factory, "outbox_republish").await;
    commit(&outbox, &[msg("orders", "order-1")]).await;
    let publisher = MemoryPublisher::new();
    // The first relay takes and publishes, then dies before marking.
    let held = outbox.store.take(10, LEASE).await.expect("take");
    assert_eq!(held.rows.len(), 1);
    dedup_core::outbox::Publisher::publish(&publisher, &held.rows[0])
        .await
        .expect("publish");
    // While its hold lives, nobody else gets the row.
    let second = relay(&outbox, &publisher, quick());
    assert_eq!(
        second.run_once().await.expect("round").taken,
        0,
        "a held row was taken by another relay before its hold ran out"
    );
    ctx.clock.advance(LEASE + Duration::from_secs(1));
    drain(&second).await;
    assert_eq!(
        publisher.message_ids(),
        ["order-1", "order-1"],
        "the row is published again, with the same id"
    );
    let late = outbox
        .store
        .mark_sent(&held.token, &[held.rows[0].id])
        .await
        .expect("late mark");
    assert!(
        late.is_empty(),
        "a dead relay's late mark changed the row: {late:?}"
    );
    assert_eq!(state_of(&*outbox.store, "order-1").await, OutboxState::Sent);
}

/// Relays on several nodes taking at once never hold one row together; every row is taken.
/// Of rows sharing an ordering key, only the first is taken while it is held.
pub async fn outbox_two_relays_never_hold_one_row<F: OutboxFactory>(factory: &F) {
    let (ctx, outbox) = setup(factory, "outbox_two_relays").await;
    let other = factory.open(&ctx).await;
    let mut messages: Vec<OutboxMessage> = (0..60)
        .map(|i| msg("orders", &format!("free-{i}")))
        .collect();
    messages.extend((0..8).map(|i| keyed(&format!("keyed-{i}"), "account-7")));
    commit(&outbox, &messages).await;

    let mut tasks = Vec::new();
    for node in 0..4 {
        let store = if node % 2 == 0 {
            Arc::clone(&outbox.store)
        } else {
            Arc::clone(&other.store)
        };
        tasks.push(tokio::spawn(async move {
            let mut taken = Vec::new();
            // 68 rows in takes of 7: a store that keeps answering is handing out rows twice.
            for _ in 0..100 {
                let held = store.take(7, LEASE).await.expect("take");
                if held.rows.is_empty() {
                    return taken;
                }
                taken.extend(held.rows.into_iter().map(|r| r.message_id));
            }
            taken
        }));
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    for task in tasks {
        for id in task.await.expect("taker") {
            *seen.entry(id).or_default() += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "rows held by two live holds: {twice:?}");
    for i in 0..60 {
        assert!(
            seen.contains_key(&format!("free-{i}")),
            "free-{i} was never taken"
        );
    }
    let keyed_taken: Vec<_> = seen.keys().filter(|id| id.starts_with("keyed-")).collect();
    assert_eq!(
        keyed_taken,
        [&"keyed-0".to_owned()],
        "only the first row of an ordering key may be held while it is"
    );
}

/// A row that always fails is retried with backoff, then dead after `max_attempts`, with
/// its last error kept; rows behind it (other rows, and later rows of its own ordering key
/// once it is dead) are published.
pub async fn outbox_a_failing_row_dies_after_the_limit_and_later_rows_are_published<
    F: OutboxFactory,
>(
    factory: &F,
) {
    let (ctx, outbox) = setup(factory, "outbox_poison").await;
    commit(&outbox, &[keyed("poison", "k"), msg("orders", "fine-1")]).await;
    commit(
        &outbox,
        &[keyed("after-poison", "k"), msg("orders", "fine-2")],
    )
    .await;
    let publisher = MemoryPublisher::new();
    publisher.fail("poison", None);
    let relay = relay(&outbox, &publisher, quick());
    relay.run_once().await.expect("round 1");
    let mut ids = publisher.message_ids();
    ids.sort();
    assert_eq!(
        ids,
        ["fine-1", "fine-2"],
        "a failing row blocked rows of other keys"
    );
    assert_eq!(
        state_of(&*outbox.store, "poison").await,
        OutboxState::Pending
    );
    for _ in 0..5 {
        ctx.clock.advance(Duration::from_secs(2));
        relay.run_once().await.expect("round");
        if state_of(&*outbox.store, "poison").await == OutboxState::Dead {
            break;
        }
        assert!(
            !publisher.message_ids().contains(&"after-poison".to_owned()),
            "a later row of the key was published before the failing one was settled"
        );
    }
    let poison = entries(&*outbox.store)
        .await
        .into_iter()
        .find(|e| e.row.message_id == "poison")
        .expect("poison row kept");
    assert_eq!(
        poison.state,
        OutboxState::Dead,
        "not dead after max_attempts: {poison:?}"
    );
    assert_eq!(poison.row.attempts, 3, "attempts counted: {poison:?}");
    assert!(
        poison
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("told to fail")),
        "the last error is kept: {poison:?}"
    );
    drain(&relay).await;
    assert!(
        publisher.message_ids().contains(&"after-poison".to_owned()),
        "a dead row blocks its ordering key"
    );
    assert!(!publisher.message_ids().contains(&"poison".to_owned()));
}

/// Rows sharing an ordering key are published one at a time, in the order they were
/// committed, also when one of them fails once; rows of other keys do not wait.
pub async fn outbox_keeps_order_per_ordering_key<F: OutboxFactory>(factory: &F) {
    let (ctx, outbox) = setup(factory, "outbox_order").await;
    for i in 0..5 {
        commit(&outbox, &[keyed(&format!("a-{i}"), "account-a")]).await;
        commit(&outbox, &[keyed(&format!("b-{i}"), "account-b")]).await;
    }
    let first = outbox.store.take(100, LEASE).await.expect("take");
    let mut firsts: Vec<_> = first.rows.iter().map(|r| r.message_id.clone()).collect();
    firsts.sort();
    assert_eq!(firsts, ["a-0", "b-0"], "one row per ordering key per take");
    let ids: Vec<i64> = first.rows.iter().map(|r| r.id).collect();
    outbox
        .store
        .hand_back(&first.token, &ids)
        .await
        .expect("hand back");

    let publisher = MemoryPublisher::new();
    publisher.fail("a-1", Some(1));
    let relay = relay(&outbox, &publisher, quick());
    for _ in 0..30 {
        relay.run_once().await.expect("round");
        ctx.clock.advance(Duration::from_secs(2));
    }
    let published = publisher.message_ids();
    let of = |prefix: &str| -> Vec<String> {
        published
            .iter()
            .filter(|id| id.starts_with(prefix))
            .cloned()
            .collect()
    };
    assert_eq!(
        of("a-"),
        ["a-0", "a-1", "a-2", "a-3", "a-4"],
        "order of key a"
    );
    assert_eq!(
        of("b-"),
        ["b-0", "b-1", "b-2", "b-3", "b-4"],
        "order of key b"
    );
    let b_done = published.iter().position(|id| id == "b-4").expect("b-4");
    let a_done = published.iter().position(|id| id == "a-4").expect("a-4");
    assert!(
        b_done < a_done,
        "key b waited for key a's failure: {published:?}"
    );
}

/// A row whose transaction commits after rows with greater ids were already published is
/// still published (the relay reads by state and due time, not by an id watermark).
pub async fn outbox_does_not_skip_a_row_that_committed_late<F: OutboxFactory>(factory: &F) {
    let (_ctx, outbox) = setup(factory, "outbox_late").await;
    let Some(open) = outbox
        .producer
        .enqueue_open(&[msg("orders", "late")])
        .await
        .expect("open transaction")
    else {
        eprintln!(
            "outbox_does_not_skip_a_row_that_committed_late: this backend has one writer at a \
             time, so no row can commit while another transaction holds an earlier id"
        );
        return;
    };
    let writer = outbox.producer.clone();
    let early = tokio::spawn(async move {
        writer
            .enqueue(&[msg("orders", "early")], TxEnd::Commit)
            .await
    });
    let early_done = tokio::time::timeout(Duration::from_secs(10), early).await;
    let publisher = MemoryPublisher::new();
    let relay = relay(&outbox, &publisher, quick());
    match early_done {
        Ok(joined) => {
            joined.expect("task").expect("enqueue early");
            drain(&relay).await;
            assert_eq!(publisher.message_ids(), ["early"]);
            open.commit().await.expect("commit late");
        }
        Err(_) => panic!("a second producer waited 10 s for an open transaction to end"),
    }
    drain(&relay).await;
    assert_eq!(
        publisher.message_ids(),
        ["early", "late"],
        "the row that committed late was skipped"
    );
}

/// Sent rows are removed by `purge` once sent longer ago than the retention, and counted;
/// pending and dead rows never are.
pub async fn outbox_purges_sent_rows_after_retention_only<F: OutboxFactory>(factory: &F) {
    let (ctx, outbox) = setup(factory, "outbox_purge").await;
    let later = msg("orders", "later")
        .deliver_after(3 * HOUR)
        .expect("delay");
    commit(
        &outbox,
        &[
            msg("orders", "s-1"),
            msg("orders", "s-2"),
            msg("orders", "doomed"),
            later,
        ],
    )
    .await;
    let publisher = MemoryPublisher::new();
    publisher.fail("doomed", None);
    drain(&relay(&outbox, &publisher, quick().max_attempts(1))).await;
    assert_eq!(state_of(&*outbox.store, "doomed").await, OutboxState::Dead);

    let options = PurgeOptions::older_than(HOUR).batch_size(1).unpaced();
    let report = outbox.store.purge(&options).await.expect("purge");
    assert_eq!(
        report.total(),
        0,
        "rows sent less than the retention ago were purged"
    );
    ctx.clock.advance(2 * HOUR);
    let report = outbox.store.purge(&options).await.expect("purge");
    assert_eq!(
        report.completed, 2,
        "the two sent rows are purged and counted: {report:?}"
    );
    let mut left: Vec<String> = entries(&*outbox.store)
        .await
        .into_iter()
        .map(|e| e.row.message_id)
        .collect();
    left.sort();
    assert_eq!(left, ["doomed", "later"], "only sent rows may be purged");
    ctx.clock.advance(10 * HOUR);
    assert_eq!(
        outbox.store.purge(&options).await.expect("purge").total(),
        0
    );
}

/// A message id enqueued again (a producer retrying its own transaction, twice in one
/// transaction) is kept once, with what was written first, and published once.
pub async fn outbox_keeps_a_message_id_enqueued_twice_once<F: OutboxFactory>(factory: &F) {
    let (_ctx, outbox) = setup(factory, "outbox_same_id").await;
    let first = msg("orders", "order-9");
    let retry = OutboxMessage::new("orders", "order-9", b"second payload".to_vec()).expect("msg");
    commit(&outbox, std::slice::from_ref(&first)).await;
    commit(&outbox, std::slice::from_ref(&retry)).await;
    commit(&outbox, &[msg("orders", "pair"), msg("orders", "pair")]).await;
    let publisher = MemoryPublisher::new();
    drain(&relay(&outbox, &publisher, quick())).await;
    let mut ids = publisher.message_ids();
    ids.sort();
    assert_eq!(ids, ["order-9", "pair"], "a message id was kept twice");
    let kept = publisher
        .published()
        .into_iter()
        .find(|r| r.message_id == "order-9")
        .expect("published");
    assert_eq!(kept.payload, first.payload(), "the first write is kept");
    // Once sent, the id is still known until purged.
    commit(&outbox, &[retry]).await;
    assert_eq!(outbox.store.stats().await.expect("stats").pending, 0);
}
