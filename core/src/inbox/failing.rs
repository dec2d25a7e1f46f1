//! What the inboxes do with a failed attempt: keep its cause on the record (released for a
//! retry, stored as the key's result, or with the dead letter), and say so (see
//! `report.rs`). Shared by the lease-mode [`Inbox`] and the [`TxEngine`](super::TxEngine).

use super::report::{Mode, attempt_failed, dead_letter_counted, failure_stored, log_dead_letter};
use super::{Handled, Inbox, InboxError, Transient};
use crate::{DedupStore, Failure, Lease, Timestamp, Verdict};

impl<S: DedupStore + ?Sized + 'static> Inbox<S> {
    /// Complete a key that used up its attempts as dead-lettered, without running the
    /// handler, keeping its last failed attempt's cause (read from the record; a cause of
    /// kind `attempts` when no attempt ended with an error).
    pub(super) async fn dead_letter<T>(
        &self,
        lease: &Lease,
        mode: Mode,
    ) -> Result<Handled<T>, InboxError> {
        let attempts = lease.attempt - 1;
        let kept = match self.store.get(&lease.key).await {
            Ok(record) => record.and_then(|r| r.last_failure),
            Err(e) => {
                tracing::warn!(consumer = lease.key.consumer(), message_id = lease.key.message_id(), error = %crate::error_chain(&e), "dedup inbox: the last failure could not be read for the dead letter");
                None
            }
        };
        let why = if self.store.capabilities().failure_causes {
            "none kept an error (they crashed, timed out or were dropped)"
        } else {
            "this store keeps no cause (the failed attempts' log lines have them)"
        };
        let cause = kept.unwrap_or_else(|| {
            Failure::new(
                "attempts",
                vec![format!("no attempt left after {attempts} attempts; {why}")],
                lease.attempt,
                now(),
                None,
            )
            .with_worker(self.worker.as_deref())
            .fit()
        });
        self.commit(lease, Some(&Verdict::dead_letter(attempts, Some(&cause))))
            .await?;
        log_dead_letter(&lease.key, lease.attempt, attempts, &cause);
        dead_letter_counted(&lease.key, attempts, Some(cause), false, mode)
    }

    /// The failure `error` caused at `lease`'s attempt, now, on this worker: kind
    /// `transient` for an error marked [`Transient`], `handler` otherwise.
    pub(super) fn failure_of(
        &self,
        error: &(dyn std::error::Error + 'static),
        lease: &Lease,
    ) -> Failure {
        let kind = if Transient::is_in(error) {
            "transient"
        } else {
            "handler"
        };
        Failure::of_error(kind, error, lease.attempt, now(), self.worker.as_deref())
    }

    /// Release `lease` after a failed attempt, keeping `failure` on the record, and say so.
    /// A store that cannot keep it still gets the lease back (a plain release).
    pub(super) async fn release_failed(&self, lease: &Lease, failure: &Failure, mode: Mode) {
        attempt_failed(
            &lease.key,
            mode,
            failure,
            "the lease was released for a retry",
        );
        if !self.store.capabilities().failure_causes {
            let _ = self.store.release(lease).await;
            return;
        }
        match self.store.release_failed(lease, failure).await {
            Ok(()) => {}
            Err(e) if e.is_lease_lost() => {}
            Err(e) => {
                tracing::warn!(consumer = lease.key.consumer(), message_id = lease.key.message_id(), error = %crate::error_chain(&e), "dedup inbox: the failure could not be kept on the record; releasing without it");
                let _ = self.store.release(lease).await;
            }
        }
    }

    /// Commit `failure` as the key's result ([`FailurePolicy::Store`]), and say so.
    pub(super) async fn store_failure<T>(
        &self,
        lease: &Lease,
        failure: Failure,
        mode: Mode,
    ) -> Result<Handled<T>, InboxError> {
        self.commit(lease, Some(&Verdict::failed(&failure))).await?;
        attempt_failed(
            &lease.key,
            mode,
            &failure,
            "it is stored as the key's result",
        );
        failure_stored(&lease.key, mode, &failure);
        Ok(Handled::Failed {
            error: failure.message(),
            replay: false,
        })
    }
}

/// "Now" by this worker's clock, for a [`Failure`]'s time.
pub(super) fn now() -> Timestamp {
    Timestamp::from_system_time(std::time::SystemTime::now())
}
