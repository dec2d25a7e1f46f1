//! Proof that the outbox clauses can fail: each runs against an outbox with one deliberate
//! fault, and each fault must be caught by the clause named for it. The same outbox without
//! a fault passes every clause (`memory.rs`), so each failure is the fault's doing.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dedup_conformance::TestContext;
use dedup_conformance::TxEnd;
use dedup_conformance::clauses::outbox_clauses;
use dedup_conformance::outbox::{OpenTx, OutboxFactory, OutboxProducer, OutboxUnderTest};
use dedup_core::outbox::{
    AfterFailure, Held, MemoryOutbox, OutboxEntry, OutboxMessage, OutboxQuery, OutboxState,
    OutboxStats, OutboxStore,
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
    /// A hand-back counts the attempt.
    HandBackCounts,
    /// An operator's retry answers true and changes nothing.
    RetryIgnored,
    /// Delays are dropped on enqueue.
    IgnoresDelay,
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
            return self.inner.take(1, hold).await.map(|mut h| {
                h.rows.clear();
                h
            });
        }
        let mut held = self.inner.take(limit, hold).await?;
        match self.fault {
            Fault::TakesHeldRows => {
                let taken: Vec<i64> = held.rows.iter().map(|r| r.id).collect();
                let others = self
                    .inner
                    .list(&OutboxQuery {
                        state: Some(OutboxState::Held),
                        limit: 1000,
                        ..OutboxQuery::default()
                    })
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
        if self.fault == Fault::UnfencedMarks {
            let holders = self.holders.lock().unwrap().clone();
            let mut marked = Vec::new();
            for id in ids {
                if let Some(t) = holders.get(id) {
                    marked.extend(self.inner.mark_sent(t, &[*id]).await?);
                }
            }
            return Ok(marked);
        }
        self.inner.mark_sent(token, ids).await
    }

    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> Result<bool> {
        let after = match (self.fault, after) {
            (Fault::NeverDies, AfterFailure::Dead) => AfterFailure::RetryAfter(Duration::ZERO),
            _ => after,
        };
        self.inner.mark_failed(token, id, error, after).await
    }

    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64> {
        if self.fault == Fault::HandBackCounts {
            let mut n = 0;
            for id in ids {
                if self
                    .inner
                    .mark_failed(
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
        self.inner.hand_back(token, ids).await
    }

    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        if self.fault == Fault::PurgesEarly {
            let mut early = options.clone();
            early.retention = Duration::ZERO;
            return self.inner.purge(&early).await;
        }
        self.inner.purge(options).await
    }

    async fn stats(&self) -> Result<OutboxStats> {
        self.inner.stats().await
    }

    async fn list(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>> {
        self.inner.list(query).await
    }

    async fn retry(&self, id: i64) -> Result<bool> {
        if self.fault == Fault::RetryIgnored {
            return Ok(true);
        }
        self.inner.retry(id).await
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
    a_watermark_relay_is_caught: WatermarkById => outbox_does_not_skip_a_row_that_committed_late;
    rows_that_never_die_are_caught: NeverDies => outbox_a_failing_row_dies_after_the_limit_and_later_rows_are_published;
    early_purges_are_caught: PurgesEarly => outbox_purges_sent_rows_after_retention_only;
    kept_duplicates_are_caught: KeepsDuplicates => outbox_keeps_a_message_id_enqueued_twice_once;
    an_accepted_zero_take_is_caught: AcceptsZeroTake => outbox_refuses_bad_input_and_writes_nothing;
    a_counting_hand_back_is_caught: HandBackCounts => outbox_hand_back_makes_rows_due_without_counting_the_attempt;
    an_ignored_retry_is_caught: RetryIgnored => outbox_retry_makes_a_dead_row_pending_again;
    ignored_delays_are_caught: IgnoresDelay => outbox_delayed_rows_wait_until_due;
}
