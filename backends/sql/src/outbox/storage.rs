//! [`OutboxStorage`] and [`PurgeBatches`] for [`SqlOutbox`]: the dialect's statements, and
//! the decisions around them (one check of the table, results in the order promised, the
//! counts folded into [`OutboxStats`]).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_core::backend::{OutboxStorage, PurgeBatch, PurgeBatches, PurgeStep};
use dedup_core::outbox::{
    AfterFailure, DestinationStats, DestinationTally, Held, OutboxEntry, OutboxQuery, OutboxState,
    OutboxStats,
};
use dedup_core::{
    Error, LeaseToken, PurgeOptions, PurgeReport, Result, Timestamp, duration_millis,
};
use futures::stream::BoxStream;

use super::SqlOutbox;
use super::dialect::{FailedPublish, OutboxDialect, RowFilter};
use super::row::{StateCounts, sql_limit};
use crate::error::SqlBackend;

/// `ids` that are in `marked`, in the caller's order, each once.
fn in_callers_order(ids: &[i64], marked: &[i64]) -> Vec<i64> {
    let mut out = Vec::with_capacity(marked.len());
    for &id in ids {
        if marked.contains(&id) && !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

/// The counts by state as [`OutboxStats`]; a state this build does not know is a
/// non-retryable error of `backend`.
fn fold_stats(counts: StateCounts, backend: &'static str) -> Result<OutboxStats> {
    let mut stats = OutboxStats {
        now: Timestamp::from_millis(counts.now_ms),
        ..OutboxStats::default()
    };
    for count in counts.states {
        stats.count_state(
            backend,
            &count.state,
            u64::try_from(count.rows).unwrap_or(0),
            count.oldest.map(Timestamp::from_millis),
        )?;
    }
    Ok(stats)
}

/// The counts by destination and state as [`DestinationStats`], in destination order; a
/// count without its destination, or of a state this build does not know, is a
/// non-retryable error of `backend`.
fn fold_destinations(counts: StateCounts, backend: &'static str) -> Result<Vec<DestinationStats>> {
    let mut tally = DestinationTally::at(Timestamp::from_millis(counts.now_ms));
    for count in counts.states {
        let destination = count.destination.ok_or_else(|| {
            Error::backend(backend, false, "an outbox count by destination without one")
        })?;
        tally.add(
            backend,
            &destination,
            &count.state,
            u64::try_from(count.rows).unwrap_or(0),
            count.oldest.map(Timestamp::from_millis),
        )?;
    }
    Ok(tally.finish())
}

#[async_trait]
impl<D: OutboxDialect> OutboxStorage for SqlOutbox<D> {
    fn backend(&self) -> &'static str {
        D::Backend::NAME
    }

    async fn take(&self, limit: usize, hold: Duration) -> Result<Held> {
        self.ensure().await?;
        let token = LeaseToken::random();
        let hold_ms = duration_millis(hold);
        let taken = self.dialect.take(&token, sql_limit(limit), hold_ms).await?;
        let mut rows = taken
            .rows
            .into_iter()
            .map(|raw| raw.decode(D::Backend::NAME))
            .collect::<Result<Vec<OutboxEntry>>>()?;
        rows.sort_by_key(|e| (e.due_at, e.row.id));
        Ok(Held {
            token,
            until: Timestamp::from_millis(taken.now_ms.saturating_add(hold_ms)),
            rows: rows.into_iter().map(|e| e.row).collect(),
        })
    }

    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.ensure().await?;
        let marked = self.dialect.mark_sent(token, ids).await?;
        Ok(in_callers_order(ids, &marked))
    }

    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> Result<bool> {
        self.ensure().await?;
        let (dead, delay) = match after {
            AfterFailure::Dead => (true, 0),
            AfterFailure::RetryAfter(delay) => (false, duration_millis(delay)),
        };
        let failed = FailedPublish {
            id,
            error,
            dead,
            delay_ms: delay,
        };
        self.dialect.mark_failed(token, &failed).await
    }

    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        self.ensure().await?;
        self.dialect.hand_back(token, ids).await
    }

    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        dedup_core::backend::purge::run(self, options).await
    }

    async fn stats(&self) -> Result<OutboxStats> {
        self.ensure().await?;
        let counts = self.dialect.count_states().await?;
        fold_stats(counts, D::Backend::NAME)
    }

    async fn stats_by_destination(&self) -> Result<Vec<DestinationStats>> {
        self.ensure().await?;
        let counts = self.dialect.count_destinations().await?;
        fold_destinations(counts, D::Backend::NAME)
    }

    async fn list(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>> {
        self.ensure().await?;
        let filter = RowFilter {
            state: query.state.map(OutboxState::as_str),
            destination: query.destination.as_deref(),
            after_id: query.after_id.unwrap_or(i64::MIN),
            limit: sql_limit(query.limit),
        };
        let rows = self.dialect.list(&filter).await?;
        rows.into_iter()
            .map(|raw| raw.decode(D::Backend::NAME))
            .collect()
    }

    async fn retry(&self, id: i64) -> Result<bool> {
        self.ensure().await?;
        self.dialect.retry(id).await
    }

    async fn wakeups(&self) -> Result<Option<BoxStream<'static, Result<()>>>> {
        self.dialect.wakeups().await
    }
}

#[async_trait]
impl<D: OutboxDialect> PurgeBatches for SqlOutbox<D> {
    type PurgeCursor = ();

    /// One statement deleting at most `step.limit` rows sent before the cutoff, oldest
    /// first. Removed rows count as `completed`.
    async fn purge_batch(&self, step: &PurgeStep, _: &mut ()) -> Result<PurgeBatch> {
        self.ensure().await?;
        let started = Instant::now();
        let removed = self
            .dialect
            .purge_sent(step.retention, sql_limit(step.limit))
            .await?;
        Ok(PurgeBatch {
            completed: removed,
            exhausted: removed < step.limit as u64,
            work: Some(started.elapsed()),
            ..PurgeBatch::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::StateCount;

    #[test]
    fn marked_ids_come_back_in_the_callers_order_once() {
        assert_eq!(in_callers_order(&[3, 1, 3, 2], &[1, 2, 3]), [3, 1, 2]);
        assert_eq!(in_callers_order(&[5, 6], &[6]), [6]);
    }

    #[test]
    fn counts_fold_and_an_unknown_state_is_refused() {
        let count = |state: &str, rows, oldest| StateCount {
            destination: None,
            state: state.into(),
            rows,
            oldest,
        };
        let stats = fold_stats(
            StateCounts {
                now_ms: 100,
                states: vec![
                    count("pending", 2, Some(40)),
                    count("held", 1, Some(30)),
                    count("sent", 5, Some(10)),
                ],
            },
            "test",
        )
        .unwrap();
        assert_eq!(
            (stats.pending, stats.held, stats.sent, stats.dead),
            (2, 1, 5, 0)
        );
        assert_eq!(stats.oldest_unsent, Some(Timestamp::from_millis(30)));
        let err = fold_stats(
            StateCounts {
                now_ms: 0,
                states: vec![count("lost", 1, None)],
            },
            "test",
        )
        .unwrap_err();
        let debug = format!("{err:?}");
        assert!(
            debug.contains("unknown state") && debug.contains("lost"),
            "{debug}"
        );
    }

    #[test]
    fn counts_by_destination_fold_in_destination_order() {
        let count = |destination: &str, state: &str, rows, oldest| StateCount {
            destination: Some(destination.into()),
            state: state.into(),
            rows,
            oldest,
        };
        let by = fold_destinations(
            StateCounts {
                now_ms: 100,
                states: vec![
                    count("orders", "pending", 2, Some(40)),
                    count("mail", "sent", 3, Some(10)),
                    count("orders", "held", 1, Some(30)),
                ],
            },
            "test",
        )
        .unwrap();
        let seen: Vec<_> = by
            .iter()
            .map(|d| {
                let s = &d.stats;
                (
                    d.destination.as_str(),
                    s.pending,
                    s.held,
                    s.sent,
                    s.oldest_unsent_age(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("mail", 0, 0, 3, Duration::ZERO),
                ("orders", 2, 1, 0, Duration::from_millis(70)),
            ]
        );
        let unnamed = StateCount {
            destination: None,
            ..count("x", "pending", 1, None)
        };
        let err = fold_destinations(
            StateCounts {
                now_ms: 0,
                states: vec![unnamed],
            },
            "test",
        )
        .unwrap_err();
        assert!(format!("{err:?}").contains("without one"), "{err:?}");
    }
}
