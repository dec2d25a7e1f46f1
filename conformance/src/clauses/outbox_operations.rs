//! The outbox's operations one by one: bad input refused before anything is written,
//! fenced marks, the hand-back, the operator's retry, delayed rows, stats and listings.
//! The shared helpers are in `outbox.rs`.

use std::collections::HashSet;
use std::time::Duration;

use dedup_core::backend::check::{MAX_OUTBOX_LIST, MAX_OUTBOX_TAKE};
use dedup_core::outbox::{
    AfterFailure, MAX_DELAY, MAX_PAYLOAD_LEN, OutboxMessage, OutboxQuery, OutboxState,
};
use dedup_core::{Error, PurgeOptions};

use super::outbox::{commit, entries, msg, setup, state_of};
use crate::TxEnd;
use crate::outbox::OutboxFactory;
use crate::support::LEASE;

/// Bad input is a typed error and writes nothing: an empty destination, a payload over the
/// limit, bad headers; a take of zero rows, or of more than `MAX_OUTBOX_TAKE`, or with a
/// zero hold; a listing over its limit; a purge with invalid options; marks and hand-backs
/// of more ids than a take may hold, and a retry delay over `MAX_DELAY`, on a row held
/// meanwhile: it stays held as it was, sent or failed by none of them.
pub async fn outbox_refuses_bad_input_and_writes_nothing<F: OutboxFactory>(factory: &F) {
    let (_ctx, outbox) = setup(factory, "outbox_bad_input").await;
    let invalid = |r: dedup_core::Result<OutboxMessage>, what: &str| match r {
        Err(Error::InvalidInput { .. }) => {}
        other => panic!("{what}: expected InvalidInput, got {other:?}"),
    };
    invalid(
        OutboxMessage::new("", "id", b"x".to_vec()),
        "empty destination",
    );
    invalid(
        OutboxMessage::new("orders", "id", vec![0u8; MAX_PAYLOAD_LEN + 1]),
        "oversized payload",
    );
    invalid(
        msg("orders", "id").header("no spaces", "v"),
        "bad header name",
    );
    invalid(
        msg("orders", "id").header("x-ok", "a\r\nb"),
        "header value with CRLF",
    );
    let refused = |what: &str, result: dedup_core::Result<()>| {
        assert!(
            matches!(result, Err(Error::InvalidInput { .. })),
            "{what}: expected InvalidInput, got {result:?}"
        );
    };
    let store = &outbox.store;
    refused("take of 0 rows", store.take(0, LEASE).await.map(|_| ()));
    refused(
        "take over its limit",
        store.take(MAX_OUTBOX_TAKE + 1, LEASE).await.map(|_| ()),
    );
    refused("zero hold", store.take(1, Duration::ZERO).await.map(|_| ()));
    refused(
        "listing over its limit",
        store
            .list(&OutboxQuery {
                limit: MAX_OUTBOX_LIST + 1,
                ..OutboxQuery::default()
            })
            .await
            .map(|_| ()),
    );
    refused(
        "purge batch of 0 rows",
        store
            .purge(&PurgeOptions::older_than(Duration::ZERO).batch_size(0))
            .await
            .map(|_| ()),
    );
    outbox
        .producer
        .enqueue(&[], TxEnd::Commit)
        .await
        .expect("an empty enqueue is fine");
    let stats = store.stats().await.expect("stats");
    assert_eq!(
        stats.pending + stats.held + stats.sent + stats.dead,
        0,
        "bad input wrote rows: {stats:?}"
    );

    commit(&outbox, &[msg("orders", "held")]).await;
    let held = store.take(1, LEASE).await.expect("take");
    let id = held.rows.first().expect("the row is due").id;
    let too_many: Vec<i64> = std::iter::once(id)
        .chain((1..=MAX_OUTBOX_TAKE as i64).map(|n| -n))
        .collect();
    refused(
        "mark_sent of too many ids",
        store.mark_sent(&held.token, &too_many).await.map(|_| ()),
    );
    refused(
        "hand_back of too many ids",
        store.hand_back(&held.token, &too_many).await.map(|_| ()),
    );
    let too_late = AfterFailure::RetryAfter(MAX_DELAY + Duration::from_secs(1));
    refused(
        "a retry delay over MAX_DELAY",
        store
            .mark_failed(&held.token, id, "refused", too_late)
            .await
            .map(|_| ()),
    );
    let row = entries(&**store)
        .await
        .into_iter()
        .find(|e| e.row.id == id)
        .expect("the row is listed");
    assert_eq!(
        (row.state, row.row.attempts, row.last_error.as_deref()),
        (OutboxState::Held, 1, None),
        "refused marks changed the row: {row:?}"
    );
    assert_eq!(
        store
            .mark_sent(&held.token, &[id])
            .await
            .expect("mark_sent"),
        [id],
        "the hold is intact"
    );
}

/// A relay whose hold ran out and was taken over can no longer mark, fail or hand back its
/// rows; the new holder can.
pub async fn outbox_a_relay_whose_hold_was_taken_over_changes_nothing<F: OutboxFactory>(
    factory: &F,
) {
    let (ctx, outbox) = setup(factory, "outbox_fenced").await;
    commit(&outbox, &[msg("orders", "x")]).await;
    let stale = outbox.store.take(1, LEASE).await.expect("take");
    let id = stale.rows[0].id;
    ctx.clock.advance(LEASE + Duration::from_secs(1));
    let fresh = outbox.store.take(1, LEASE).await.expect("take over");
    assert_eq!(fresh.rows.len(), 1, "an expired hold is taken over");
    assert_eq!(fresh.rows[0].attempts, 2, "the takeover counts an attempt");
    let s = &*outbox.store;
    assert!(
        s.mark_sent(&stale.token, &[id])
            .await
            .expect("mark")
            .is_empty(),
        "stale mark_sent"
    );
    assert!(
        !s.mark_failed(&stale.token, id, "boom", AfterFailure::Dead)
            .await
            .expect("mark_failed"),
        "stale mark_failed"
    );
    assert_eq!(
        s.hand_back(&stale.token, &[id]).await.expect("hand back"),
        0,
        "stale hand_back"
    );
    assert_eq!(state_of(s, "x").await, OutboxState::Held);
    assert_eq!(s.mark_sent(&fresh.token, &[id]).await.expect("mark"), [id]);
    assert_eq!(state_of(s, "x").await, OutboxState::Sent);
}

/// A row handed back is due at once and its attempt is not counted.
pub async fn outbox_hand_back_makes_rows_due_without_counting_the_attempt<F: OutboxFactory>(
    factory: &F,
) {
    let (_ctx, outbox) = setup(factory, "outbox_hand_back").await;
    commit(&outbox, &[msg("orders", "y")]).await;
    let held = outbox.store.take(1, LEASE).await.expect("take");
    assert_eq!(held.rows[0].attempts, 1);
    assert_eq!(
        outbox
            .store
            .hand_back(&held.token, &[held.rows[0].id])
            .await
            .expect("hand back"),
        1
    );
    let again = outbox.store.take(1, LEASE).await.expect("take again");
    assert_eq!(again.rows.len(), 1, "a handed-back row is due at once");
    assert_eq!(
        again.rows[0].attempts, 1,
        "the handed-back attempt was counted"
    );
}

/// An operator's retry makes a dead row pending again with its attempts reset; it refuses
/// sent and unknown rows.
pub async fn outbox_retry_makes_a_dead_row_pending_again<F: OutboxFactory>(factory: &F) {
    let (_ctx, outbox) = setup(factory, "outbox_retry").await;
    commit(&outbox, &[msg("orders", "dead"), msg("orders", "sent")]).await;
    let s = &*outbox.store;
    let held = s.take(10, LEASE).await.expect("take");
    let id_of = |name: &str| {
        held.rows
            .iter()
            .find(|r| r.message_id == name)
            .expect("row")
            .id
    };
    assert!(
        s.mark_failed(&held.token, id_of("dead"), "gone", AfterFailure::Dead)
            .await
            .expect("fail")
    );
    assert_eq!(
        s.mark_sent(&held.token, &[id_of("sent")])
            .await
            .expect("sent")
            .len(),
        1
    );
    assert!(
        !s.retry(id_of("sent")).await.expect("retry sent"),
        "a sent row was retried"
    );
    assert!(
        !s.retry(i64::MAX).await.expect("retry unknown"),
        "an unknown row was retried"
    );
    assert!(
        s.retry(id_of("dead")).await.expect("retry dead"),
        "a dead row was not retried"
    );
    let again = s.take(10, LEASE).await.expect("take");
    assert_eq!(again.rows.len(), 1);
    assert_eq!(again.rows[0].message_id, "dead");
    assert_eq!(again.rows[0].attempts, 1, "attempts start again");
}

/// A message written with a delay is not taken before it is due.
pub async fn outbox_delayed_rows_wait_until_due<F: OutboxFactory>(factory: &F) {
    let (ctx, outbox) = setup(factory, "outbox_delay").await;
    let delayed = msg("orders", "d")
        .deliver_after(Duration::from_secs(60))
        .expect("delay");
    commit(&outbox, &[delayed]).await;
    assert!(
        outbox
            .store
            .take(10, LEASE)
            .await
            .expect("take")
            .rows
            .is_empty(),
        "taken early"
    );
    ctx.clock.advance(Duration::from_secs(61));
    assert_eq!(
        outbox.store.take(10, LEASE).await.expect("take").rows.len(),
        1,
        "not taken when due"
    );
}

/// `stats` counts rows by state and ages the oldest unsent one; `list` filters by state
/// and destination and pages by id.
pub async fn outbox_stats_and_list_agree_with_the_rows<F: OutboxFactory>(factory: &F) {
    let (ctx, outbox) = setup(factory, "outbox_stats").await;
    commit(
        &outbox,
        &[
            msg("orders", "o-1"),
            msg("mail", "m-1"),
            msg("orders", "o-2"),
        ],
    )
    .await;
    ctx.clock.advance(Duration::from_secs(30));
    let s = &*outbox.store;
    let held = s.take(1, LEASE).await.expect("take");
    s.mark_sent(&held.token, &[held.rows[0].id])
        .await
        .expect("mark");
    let stats = s.stats().await.expect("stats");
    assert_eq!(
        (stats.pending, stats.held, stats.sent, stats.dead),
        (2, 0, 1, 0),
        "{stats:?}"
    );
    assert!(
        stats.oldest_unsent_age() >= Duration::from_secs(30),
        "oldest unsent age {:?}",
        stats.oldest_unsent_age()
    );
    let pending = s
        .list(&OutboxQuery {
            state: Some(OutboxState::Pending),
            ..OutboxQuery::default()
        })
        .await
        .expect("list");
    assert_eq!(pending.len(), 2);
    let mail = s
        .list(&OutboxQuery {
            destination: Some("mail".to_owned()),
            ..OutboxQuery::default()
        })
        .await
        .expect("list");
    assert_eq!(
        mail.iter()
            .map(|e| e.row.message_id.as_str())
            .collect::<Vec<_>>(),
        ["m-1"]
    );
    let all = entries(s).await;
    let page = s
        .list(&OutboxQuery {
            after_id: Some(all[0].row.id),
            limit: 1,
            ..OutboxQuery::default()
        })
        .await
        .expect("page");
    assert_eq!(page.len(), 1);
    assert_eq!(
        page[0].row.id, all[1].row.id,
        "pages continue after the given id"
    );
    let ids: HashSet<i64> = all.iter().map(|e| e.row.id).collect();
    assert_eq!(ids.len(), 3);
}

/// `stats_by_destination` counts each destination's rows by state, with its own lag (the
/// age of its oldest pending or held row, by the store's clock), one entry per destination
/// that has rows, in destination (byte) order, destinations differing only in case apart;
/// the entries add up to `stats`.
pub async fn outbox_stats_by_destination_add_up_to_the_stats<F: OutboxFactory>(factory: &F) {
    let (ctx, outbox) = setup(factory, "outbox_stats_by_destination").await;
    let s = &*outbox.store;
    let none = s
        .stats_by_destination()
        .await
        .expect("stats by destination");
    assert!(
        none.is_empty(),
        "an empty outbox has no destination: {none:?}"
    );
    commit(
        &outbox,
        &[
            msg("orders", "o-1"),
            msg("orders", "o-2"),
            msg("mail", "m-1"),
            msg("Mail", "M-1"),
        ],
    )
    .await;
    ctx.clock.advance(Duration::from_secs(30));
    commit(&outbox, &[msg("audit", "a-1")]).await;
    // By due time then id: o-1 is sent, o-2 dies, m-1 stays held.
    let held = s.take(1, LEASE).await.expect("take");
    s.mark_sent(&held.token, &[held.rows[0].id])
        .await
        .expect("mark sent");
    let held = s.take(1, LEASE).await.expect("take");
    s.mark_failed(&held.token, held.rows[0].id, "refused", AfterFailure::Dead)
        .await
        .expect("mark dead");
    let held = s.take(1, LEASE).await.expect("take");
    assert_eq!(held.rows[0].message_id, "m-1", "{held:?}");
    ctx.clock.advance(Duration::from_secs(10));

    let by_destination = s
        .stats_by_destination()
        .await
        .expect("stats by destination");
    let seen: Vec<_> = by_destination
        .iter()
        .map(|d| {
            let st = &d.stats;
            let lag = st.oldest_unsent_age();
            (
                d.destination.as_str(),
                (st.pending, st.held, st.sent, st.dead),
                lag,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("Mail", (1, 0, 0, 0), Duration::from_secs(40)),
            ("audit", (1, 0, 0, 0), Duration::from_secs(10)),
            ("mail", (0, 1, 0, 0), Duration::from_secs(40)),
            ("orders", (0, 0, 1, 1), Duration::ZERO),
        ],
        "per destination (pending, held, sent, dead) and lag"
    );
    assert!(
        by_destination.iter().all(|d| d.stats.now == ctx.now()),
        "counted at the store's now: {by_destination:?}"
    );
    let whole = s.stats().await.expect("stats");
    let sum = by_destination.iter().fold((0, 0, 0, 0), |a, d| {
        let st = &d.stats;
        (
            a.0 + st.pending,
            a.1 + st.held,
            a.2 + st.sent,
            a.3 + st.dead,
        )
    });
    assert_eq!(
        sum,
        (whole.pending, whole.held, whole.sent, whole.dead),
        "the destinations add up to the whole table: {whole:?}"
    );
}
