//! Proof that the outbox clauses can fail: each runs against an outbox with one deliberate
//! fault, and each fault must be caught by the clause named for it. The same outbox without
//! a fault passes every clause (`memory.rs`), so each failure is the fault's doing.
//!
//! The broken outboxes are hand-written `OutboxStore`s (as a layer over a store is): only
//! such a type can skip an input check, and the faults `Skips*` do, calling the
//! `OutboxStorage` beneath directly; the suite catches each. A backend implements
//! `OutboxStorage` and gets its `OutboxStore` from the front door, whose checks it cannot
//! skip: `a_storage_that_checks_nothing_gets_no_bad_input_through_the_front_door` runs
//! every clause over a storage that checks nothing and records any bad input reaching it.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dedup_conformance::TestContext;
use dedup_conformance::TxEnd;
use dedup_conformance::clauses::outbox_clauses;
use dedup_conformance::outbox::{OpenTx, OutboxFactory, OutboxProducer, OutboxUnderTest};
use dedup_core::backend::OutboxStorage;
use dedup_core::backend::check::{self, MAX_OUTBOX_LIST, MAX_OUTBOX_TAKE};
use dedup_core::outbox::{
    AfterFailure, DestinationStats, Held, MAX_DELAY, MAX_ERROR_LEN, MemoryOutbox, OutboxEntry,
    OutboxMessage, OutboxQuery, OutboxState, OutboxStats, OutboxStore,
};
use dedup_core::{LeaseToken, PurgeOptions, PurgeReport, Result};
use futures::FutureExt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// A rolled-back transaction's rows are committed.
    PublishesRolledBack,
    /// The last message of every enqueue is dropped.
    LosesRows,
    /// A take also returns rows other relays hold.
    TakesHeldRows,
    /// Marks use the newest holder's token, whatever token the caller gave.
    UnfencedMarks,
    /// Ordering keys are dropped on enqueue.
    NoOrdering,
    /// A take skips rows with ids below the greatest id it has taken.
    WatermarkById,
    /// A row told to die is retried instead.
    NeverDies,
    /// Purges ignore the retention.
    PurgesEarly,
    /// A message id seen before is enqueued again under a fresh suffix.
    KeepsDuplicates,
    /// A take of zero rows is answered instead of refused.
    AcceptsZeroTake,
    /// Marks and hand-backs of more ids than a take may hold reach the storage unchecked.
    SkipsIdCheck,
    /// A retry delay over `MAX_DELAY` reaches the storage unchecked.
    SkipsDelayCheck,
    /// Invalid purge options reach the storage unchecked.
    SkipsPurgeCheck,
    /// A hand-back counts the attempt.
    HandBackCounts,
    /// An operator's retry answers true and changes nothing.
    RetryIgnored,
    /// Delays are dropped on enqueue.
    IgnoresDelay,
    /// Per-destination stats count held rows as pending.
    HeldCountedAsPending,
    /// No fault (the producer of the front-door proof).
    Honest,
}

#[derive(Debug)]
struct Broken {
    inner: MemoryOutbox,
    fault: Fault,
    holders: Mutex<HashMap<i64, LeaseToken>>,
    watermark: Mutex<i64>,
}

#[async_trait]
impl OutboxStore for Broken {
    fn backend(&self) -> &'static str {
        "broken"
    }

    async fn take(&self, limit: usize, hold: Duration) -> Result<Held> {
        if self.fault == Fault::AcceptsZeroTake && limit == 0 {
            return OutboxStore::take(&self.inner, 1, hold).await.map(|mut h| {
                h.rows.clear();
                h
            });
        }
        let mut held = OutboxStore::take(&self.inner, limit, hold).await?;
        match self.fault {
            Fault::TakesHeldRows => {
                let taken: Vec<i64> = held.rows.iter().map(|r| r.id).collect();
                let others = OutboxStore::list(
                    &self.inner,
                    &OutboxQuery {
                        state: Some(OutboxState::Held),
                        limit: 1000,
                        ..OutboxQuery::default()
                    },
                )
                .await?;
                held.rows.extend(
                    others
                        .into_iter()
                        .filter(|e| !taken.contains(&e.row.id))
                        .map(|e| e.row),
                );
            }
            Fault::WatermarkById => {
                let mut mark = self.watermark.lock().unwrap();
                // Rows below the watermark are left held and unread, as a relay reading
                // by increasing id would never look at them again.
                let keep: Vec<_> = held.rows.drain(..).filter(|r| r.id >= *mark).collect();
                *mark = keep.iter().map(|r| r.id).max().unwrap_or(*mark).max(*mark);
                held.rows = keep;
            }
            _ => {}
        }
        let mut holders = self.holders.lock().unwrap();
        for r in &held.rows {
            holders.insert(r.id, held.token);
        }
        Ok(held)
    }

    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>> {
        if self.fault == Fault::SkipsIdCheck {
            return OutboxStorage::mark_sent(&self.inner, token, ids).await;
        }
        if self.fault == Fault::UnfencedMarks {
            let holders = self.holders.lock().unwrap().clone();
            let mut marked = Vec::new();
            for id in ids {
                if let Some(t) = holders.get(id) {
                    marked.extend(OutboxStore::mark_sent(&self.inner, t, &[*id]).await?);
                }
            }
            return Ok(marked);
        }
        OutboxStore::mark_sent(&self.inner, token, ids).await
    }

    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> Result<bool> {
        if self.fault == Fault::SkipsDelayCheck {
            return OutboxStorage::mark_failed(&self.inner, token, id, error, after).await;
        }
        let after = match (self.fault, after) {
            (Fault::NeverDies, AfterFailure::Dead) => AfterFailure::RetryAfter(Duration::ZERO),
            _ => after,
        };
        OutboxStore::mark_failed(&self.inner, token, id, error, after).await
    }

    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64> {
        if self.fault == Fault::SkipsIdCheck {
            return OutboxStorage::hand_back(&self.inner, token, ids).await;
        }
        if self.fault == Fault::HandBackCounts {
            let mut n = 0;
            for id in ids {
                if OutboxStore::mark_failed(
                    &self.inner,
                    token,
                    *id,
                    "handed back",
                    AfterFailure::RetryAfter(Duration::ZERO),
                )
                .await?
                {
                    n += 1;
                }
            }
            return Ok(n);
        }
        OutboxStore::hand_back(&self.inner, token, ids).await
    }

    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        if self.fault == Fault::SkipsPurgeCheck {
            return OutboxStorage::purge(&self.inner, options).await;
        }
        if self.fault == Fault::PurgesEarly {
            let mut early = options.clone();
            early.retention = Duration::ZERO;
            return OutboxStore::purge(&self.inner, &early).await;
        }
        OutboxStore::purge(&self.inner, options).await
    }

    async fn stats(&self) -> Result<OutboxStats> {
        OutboxStore::stats(&self.inner).await
    }

    async fn stats_by_destination(&self) -> Result<Vec<DestinationStats>> {
        let mut all = OutboxStore::stats_by_destination(&self.inner).await?;
        if self.fault == Fault::HeldCountedAsPending {
            for d in &mut all {
                d.stats.pending += std::mem::take(&mut d.stats.held);
            }
        }
        Ok(all)
    }

    async fn list(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>> {
        OutboxStore::list(&self.inner, query).await
    }

    async fn retry(&self, id: i64) -> Result<bool> {
        if self.fault == Fault::RetryIgnored {
            return Ok(true);
        }
        OutboxStore::retry(&self.inner, id).await
    }
}

struct Producer {
    inner: MemoryOutbox,
    fault: Fault,
    seen: Mutex<HashMap<String, u32>>,
}

impl Producer {
    fn distort(&self, messages: &[OutboxMessage]) -> Vec<OutboxMessage> {
        let mut out: Vec<OutboxMessage> = messages
            .iter()
            .map(|m| {
                let mut seen = self.seen.lock().unwrap();
                let n = seen.entry(m.message_id().to_owned()).or_default();
                *n += 1;
                let id = if self.fault == Fault::KeepsDuplicates && *n > 1 {
                    format!("{}#{n}", m.message_id())
                } else {
                    m.message_id().to_owned()
                };
                let mut copy =
                    OutboxMessage::new(m.destination(), id, m.payload().to_vec()).unwrap();
                for (name, value) in m.headers() {
                    copy = copy.header(name, value).unwrap();
                }
                if let Some(key) = m.ordering_key_str()
                    && self.fault != Fault::NoOrdering
                {
                    copy = copy.ordering_key(key).unwrap();
                }
                if self.fault != Fault::IgnoresDelay {
                    copy = copy.deliver_after(m.delay()).unwrap();
                }
                copy
            })
            .collect();
        if self.fault == Fault::LosesRows {
            out.pop();
        }
        out
    }
}

struct Open(dedup_core::outbox::MemoryOutboxTx);

#[async_trait]
impl OpenTx for Open {
    async fn commit(self: Box<Self>) -> Result<()> {
        self.0.commit();
        Ok(())
    }
}

#[async_trait]
impl OutboxProducer for Producer {
    async fn enqueue(&self, messages: &[OutboxMessage], end: TxEnd) -> Result<()> {
        let mut tx = self.inner.begin();
        tx.enqueue(&self.distort(messages))?;
        match (end, self.fault) {
            (TxEnd::Commit, _) | (TxEnd::Rollback, Fault::PublishesRolledBack) => tx.commit(),
            (TxEnd::Rollback, _) => tx.rollback(),
        }
        Ok(())
    }

    async fn enqueue_open(&self, messages: &[OutboxMessage]) -> Result<Option<Box<dyn OpenTx>>> {
        let mut tx = self.inner.begin();
        tx.enqueue(&self.distort(messages))?;
        Ok(Some(Box::new(Open(tx))))
    }
}

/// One broken outbox: the store relays use and the producer that writes to it.
type Pair = (Arc<Broken>, Arc<Producer>);

#[derive(Clone)]
struct BrokenFactory {
    fault: Fault,
    stores: Arc<Mutex<HashMap<String, Pair>>>,
}

#[async_trait]
impl OutboxFactory for BrokenFactory {
    async fn open(&self, ctx: &TestContext) -> OutboxUnderTest {
        let (store, producer) = self
            .stores
            .lock()
            .unwrap()
            .entry(ctx.namespace.clone())
            .or_insert_with(|| {
                let inner = MemoryOutbox::with_clock(ctx.clock.clone());
                (
                    Arc::new(Broken {
                        inner: inner.clone(),
                        fault: self.fault,
                        holders: Mutex::default(),
                        watermark: Mutex::new(0),
                    }),
                    Arc::new(Producer {
                        inner,
                        fault: self.fault,
                        seen: Mutex::default(),
                    }),
                )
            })
            .clone();
        OutboxUnderTest { store, producer }
    }
}

async fn caught(fault: Fault, expected: &str) {
    let factory = BrokenFactory {
        fault,
        stores: Arc::default(),
    };
    let mut failed = Vec::new();
    for clause in outbox_clauses::<BrokenFactory>() {
        if AssertUnwindSafe((clause.run)(&factory))
            .catch_unwind()
            .await
            .is_err()
        {
            failed.push(clause.name);
        }
    }
    println!("{fault:?} is caught by {failed:#?}");
    assert!(
        failed.contains(&expected),
        "{fault:?} was not caught by {expected}; it was caught by {failed:?}"
    );
}

macro_rules! proofs {
    ($($test:ident: $fault:ident => $clause:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            caught(Fault::$fault, stringify!($clause)).await;
        }
    )*};
}

proofs! {
    publishing_rolled_back_rows_is_caught: PublishesRolledBack => outbox_never_publishes_a_rolled_back_row;
    losing_rows_is_caught: LosesRows => outbox_publishes_every_committed_row;
    taking_held_rows_is_caught: TakesHeldRows => outbox_two_relays_never_hold_one_row;
    taking_held_rows_is_caught_as_an_early_republish: TakesHeldRows => outbox_republishes_with_the_same_id_after_a_relay_died_before_its_mark;
    unfenced_marks_are_caught: UnfencedMarks => outbox_a_relay_whose_hold_was_taken_over_changes_nothing;
    dropped_ordering_is_caught: NoOrdering => outbox_keeps_order_per_ordering_key;
    dropped_ordering_is_caught_by_racing_relays: NoOrdering => outbox_racing_relays_never_hold_two_rows_of_one_key;
    a_watermark_relay_is_caught: WatermarkById => outbox_does_not_skip_a_row_that_committed_late;
    rows_that_never_die_are_caught: NeverDies => outbox_a_failing_row_dies_after_the_limit_and_later_rows_are_published;
    early_purges_are_caught: PurgesEarly => outbox_purges_sent_rows_after_retention_only;
    kept_duplicates_are_caught: KeepsDuplicates => outbox_keeps_a_message_id_enqueued_twice_once;
    an_accepted_zero_take_is_caught: AcceptsZeroTake => outbox_refuses_bad_input_and_writes_nothing;
    a_counting_hand_back_is_caught: HandBackCounts => outbox_hand_back_makes_rows_due_without_counting_the_attempt;
    an_ignored_retry_is_caught: RetryIgnored => outbox_retry_makes_a_dead_row_pending_again;
    ignored_delays_are_caught: IgnoresDelay => outbox_delayed_rows_wait_until_due;
    held_rows_counted_as_pending_are_caught: HeldCountedAsPending => outbox_stats_by_destination_add_up_to_the_stats;
    a_skipped_id_check_is_caught: SkipsIdCheck => outbox_refuses_bad_input_and_writes_nothing;
    a_skipped_delay_check_is_caught: SkipsDelayCheck => outbox_refuses_bad_input_and_writes_nothing;
    a_skipped_purge_check_is_caught: SkipsPurgeCheck => outbox_refuses_bad_input_and_writes_nothing;
}

/// An outbox storage that checks nothing itself: it serves every call from a
/// `MemoryOutbox`'s storage, unchecked, and records each input that a check should have
/// refused. Behind the front door it is a correct `OutboxStore`.
#[derive(Debug)]
struct Lax {
    inner: MemoryOutbox,
    bad: Arc<Mutex<Vec<String>>>,
}

impl Lax {
    fn bad_if(&self, bad: bool, what: String) {
        if bad {
            self.bad.lock().unwrap().push(what);
        }
    }
}

#[async_trait]
impl OutboxStorage for Lax {
    fn backend(&self) -> &'static str {
        "lax"
    }
    async fn take(&self, limit: usize, hold: Duration) -> Result<Held> {
        let bad = check::outbox_take(limit, hold).is_err();
        self.bad_if(bad, format!("take {limit} {hold:?}"));
        OutboxStorage::take(&self.inner, limit, hold).await
    }
    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>> {
        self.bad_if(
            ids.len() > MAX_OUTBOX_TAKE,
            format!("mark_sent {}", ids.len()),
        );
        OutboxStorage::mark_sent(&self.inner, token, ids).await
    }
    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> Result<bool> {
        let late = matches!(after, AfterFailure::RetryAfter(d) if d > MAX_DELAY);
        self.bad_if(
            late || error.len() > MAX_ERROR_LEN,
            format!("mark_failed {after:?} {}", error.len()),
        );
        OutboxStorage::mark_failed(&self.inner, token, id, error, after).await
    }
    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64> {
        self.bad_if(
            ids.len() > MAX_OUTBOX_TAKE,
            format!("hand_back {}", ids.len()),
        );
        OutboxStorage::hand_back(&self.inner, token, ids).await
    }
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        self.bad_if(check::purge(options).is_err(), format!("purge {options:?}"));
        OutboxStorage::purge(&self.inner, options).await
    }
    async fn stats(&self) -> Result<OutboxStats> {
        OutboxStorage::stats(&self.inner).await
    }
    async fn stats_by_destination(&self) -> Result<Vec<DestinationStats>> {
        OutboxStorage::stats_by_destination(&self.inner).await
    }
    async fn list(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>> {
        let bad = query.limit == 0 || query.limit > MAX_OUTBOX_LIST;
        self.bad_if(bad, format!("list {}", query.limit));
        OutboxStorage::list(&self.inner, query).await
    }
    async fn retry(&self, id: i64) -> Result<bool> {
        OutboxStorage::retry(&self.inner, id).await
    }
}

/// One lax outbox: the storage behind the front door and the producer that writes to it.
type LaxPair = (Arc<Lax>, Arc<Producer>);

#[derive(Clone, Default)]
struct LaxFactory {
    stores: Arc<Mutex<HashMap<String, LaxPair>>>,
    bad: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl OutboxFactory for LaxFactory {
    async fn open(&self, ctx: &TestContext) -> OutboxUnderTest {
        let (store, producer) = self
            .stores
            .lock()
            .unwrap()
            .entry(ctx.namespace.clone())
            .or_insert_with(|| {
                let inner = MemoryOutbox::with_clock(ctx.clock.clone());
                (
                    Arc::new(Lax {
                        inner: inner.clone(),
                        bad: Arc::clone(&self.bad),
                    }),
                    Arc::new(Producer {
                        inner,
                        fault: Fault::Honest,
                        seen: Mutex::default(),
                    }),
                )
            })
            .clone();
        OutboxUnderTest { store, producer }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storage_that_checks_nothing_gets_no_bad_input_through_the_front_door() {
    let factory = LaxFactory::default();
    let mut failed = Vec::new();
    for clause in outbox_clauses::<LaxFactory>() {
        if AssertUnwindSafe((clause.run)(&factory))
            .catch_unwind()
            .await
            .is_err()
        {
            failed.push(clause.name);
        }
    }
    assert!(failed.is_empty(), "clauses failed: {failed:?}");
    assert!(
        factory.stores.lock().unwrap().len() >= outbox_clauses::<LaxFactory>().len(),
        "every clause opened an outbox"
    );
    assert_eq!(
        *factory.bad.lock().unwrap(),
        Vec::<String>::new(),
        "bad input reached the storage"
    );
}
