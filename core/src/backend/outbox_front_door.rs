//! The outbox's front door: every [`OutboxStorage`] is an [`OutboxStore`], each method's
//! input checked by [`check`](super::check) before the backend runs, and a backend error
//! saying which operation failed ([`Error::during`](crate::Error::during)). The same
//! design, and the same coherence price, as the inbox's (`front_door.rs`).

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::{OutboxStorage, check};
use crate::outbox::{
    AfterFailure, DestinationStats, Held, OutboxEntry, OutboxQuery, OutboxStats, OutboxStore,
    cut_error,
};
use crate::{LeaseToken, PurgeOptions, PurgeReport, Result};

/// What each operation is called in its errors.
pub(crate) mod during {
    /// `take`.
    pub const TAKE: &str = "taking outbox rows";
    /// `mark_sent`.
    pub const MARK_SENT: &str = "marking outbox rows sent";
    /// `mark_failed`.
    pub const MARK_FAILED: &str = "marking an outbox row failed";
    /// `hand_back`.
    pub const HAND_BACK: &str = "handing outbox rows back";
    /// `purge`.
    pub const PURGE: &str = "purging sent outbox rows";
    /// `stats`.
    pub const STATS: &str = "reading outbox stats";
    /// `stats_by_destination`.
    pub const STATS_BY_DESTINATION: &str = "reading outbox stats by destination";
    /// `list`.
    pub const LIST: &str = "listing outbox rows";
    /// `retry`.
    pub const RETRY: &str = "retrying an outbox row";
    /// `wakeups`, and the errors its stream yields.
    pub const WAKEUPS: &str = "listening for outbox notifications";
}

#[async_trait]
impl<S: OutboxStorage> OutboxStore for S {
    fn backend(&self) -> &'static str {
        OutboxStorage::backend(self)
    }

    async fn take(&self, limit: usize, hold: Duration) -> Result<Held> {
        check::outbox_take(limit, hold)?;
        OutboxStorage::take(self, limit, hold)
            .await
            .map_err(|e| e.during(during::TAKE))
    }

    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>> {
        check::outbox_ids(ids)?;
        OutboxStorage::mark_sent(self, token, ids)
            .await
            .map_err(|e| e.during(during::MARK_SENT))
    }

    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> Result<bool> {
        check::outbox_after_failure(after)?;
        OutboxStorage::mark_failed(self, token, id, cut_error(error), after)
            .await
            .map_err(|e| e.during(during::MARK_FAILED))
    }

    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64> {
        check::outbox_ids(ids)?;
        OutboxStorage::hand_back(self, token, ids)
            .await
            .map_err(|e| e.during(during::HAND_BACK))
    }

    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        check::purge(options)?;
        OutboxStorage::purge(self, options)
            .await
            .map_err(|e| e.during(during::PURGE))
    }

    async fn stats(&self) -> Result<OutboxStats> {
        OutboxStorage::stats(self)
            .await
            .map_err(|e| e.during(during::STATS))
    }

    async fn stats_by_destination(&self) -> Result<Vec<DestinationStats>> {
        OutboxStorage::stats_by_destination(self)
            .await
            .map_err(|e| e.during(during::STATS_BY_DESTINATION))
    }

    async fn list(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>> {
        let limit = check::outbox_list_limit(query.limit)?;
        let query = OutboxQuery {
            limit,
            ..query.clone()
        };
        OutboxStorage::list(self, &query)
            .await
            .map_err(|e| e.during(during::LIST))
    }

    async fn retry(&self, id: i64) -> Result<bool> {
        OutboxStorage::retry(self, id)
            .await
            .map_err(|e| e.during(during::RETRY))
    }

    async fn wakeups(&self) -> Result<Option<BoxStream<'static, Result<()>>>> {
        let stream = OutboxStorage::wakeups(self)
            .await
            .map_err(|e| e.during(during::WAKEUPS))?;
        Ok(stream.map(|s| {
            s.map(|item| item.map_err(|e| e.during(during::WAKEUPS)))
                .boxed()
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::Error;
    use crate::outbox::{MAX_DELAY, MAX_ERROR_LEN};

    /// A storage that records what reached it and fails every call.
    #[derive(Debug, Default)]
    struct Down {
        seen: Mutex<Vec<String>>,
    }

    impl Down {
        fn fail<T>(&self, call: String) -> Result<T> {
            self.seen.lock().unwrap().push(call);
            Err(Error::backend("down", true, "connection refused"))
        }
    }

    #[async_trait]
    impl OutboxStorage for Down {
        fn backend(&self) -> &'static str {
            "down"
        }
        async fn take(&self, limit: usize, hold: Duration) -> Result<Held> {
            self.fail(format!("take {limit} {hold:?}"))
        }
        async fn mark_sent(&self, _: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>> {
            self.fail(format!("mark_sent {}", ids.len()))
        }
        async fn mark_failed(
            &self,
            _: &LeaseToken,
            id: i64,
            error: &str,
            after: AfterFailure,
        ) -> Result<bool> {
            self.fail(format!("mark_failed {id} {} {after:?}", error.len()))
        }
        async fn hand_back(&self, _: &LeaseToken, ids: &[i64]) -> Result<u64> {
            self.fail(format!("hand_back {}", ids.len()))
        }
        async fn purge(&self, _: &PurgeOptions) -> Result<PurgeReport> {
            self.fail("purge".into())
        }
        async fn stats(&self) -> Result<OutboxStats> {
            self.fail("stats".into())
        }
        async fn stats_by_destination(&self) -> Result<Vec<DestinationStats>> {
            self.fail("stats_by_destination".into())
        }
        async fn list(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>> {
            self.fail(format!("list {}", query.limit))
        }
        async fn retry(&self, id: i64) -> Result<bool> {
            self.fail(format!("retry {id}"))
        }
        async fn wakeups(&self) -> Result<Option<BoxStream<'static, Result<()>>>> {
            let lost = Err(Error::backend("down", true, "connection reset"));
            Ok(Some(futures::stream::iter([Ok(()), lost]).boxed()))
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn every_backend_error_names_its_operation() {
        block_on(async {
            let down = Down::default();
            let store: &dyn OutboxStore = &down;
            let token = LeaseToken::random();
            let retry = AfterFailure::RetryAfter(Duration::from_secs(1));
            let hold = Duration::from_secs(30);
            let named = [
                (store.take(1, hold).await.err(), during::TAKE),
                (store.mark_sent(&token, &[1]).await.err(), during::MARK_SENT),
                (
                    store.mark_failed(&token, 1, "e", retry).await.err(),
                    during::MARK_FAILED,
                ),
                (store.hand_back(&token, &[1]).await.err(), during::HAND_BACK),
                (
                    store
                        .purge(&PurgeOptions::older_than(Duration::from_secs(60)))
                        .await
                        .err(),
                    during::PURGE,
                ),
                (store.stats().await.err(), during::STATS),
                (
                    store.stats_by_destination().await.err(),
                    during::STATS_BY_DESTINATION,
                ),
                (
                    store.list(&OutboxQuery::default()).await.err(),
                    during::LIST,
                ),
                (store.retry(1).await.err(), during::RETRY),
            ];
            for (error, operation) in named {
                let error = error.expect("the storage fails");
                assert_eq!(error.operation(), Some(operation), "{error:?}");
            }
            let mut wakeups = store.wakeups().await.unwrap().unwrap();
            assert!(matches!(wakeups.next().await, Some(Ok(()))));
            let lost = wakeups.next().await.unwrap().unwrap_err();
            assert_eq!(lost.operation(), Some(during::WAKEUPS), "{lost:?}");
        });
    }

    #[test]
    fn the_store_is_named_by_its_backend() {
        let store: &dyn OutboxStore = &Down::default();
        assert_eq!(store.backend(), "down");
    }

    #[test]
    fn bad_input_never_reaches_the_storage() {
        block_on(async {
            let down = Down::default();
            let store: &dyn OutboxStore = &down;
            let token = LeaseToken::random();
            let too_many = vec![1; check::MAX_OUTBOX_TAKE + 1];
            let too_late = AfterFailure::RetryAfter(MAX_DELAY + Duration::from_secs(1));
            let bad_purge = PurgeOptions::older_than(Duration::from_secs(60)).batch_size(0);
            let refused = [
                store.take(0, Duration::from_secs(1)).await.err(),
                store
                    .take(check::MAX_OUTBOX_TAKE + 1, Duration::from_secs(1))
                    .await
                    .err(),
                store.take(1, Duration::ZERO).await.err(),
                store.mark_sent(&token, &too_many).await.err(),
                store.mark_failed(&token, 1, "e", too_late).await.err(),
                store.hand_back(&token, &too_many).await.err(),
                store.purge(&bad_purge).await.err(),
                store
                    .list(&OutboxQuery {
                        limit: check::MAX_OUTBOX_LIST + 1,
                        ..OutboxQuery::default()
                    })
                    .await
                    .err(),
            ];
            for error in refused {
                assert!(
                    matches!(error, Some(Error::InvalidInput { .. })),
                    "{error:?}"
                );
            }
            assert_eq!(*down.seen.lock().unwrap(), Vec::<String>::new());
        });
    }

    #[test]
    fn the_storage_gets_a_cut_error_and_the_listing_limit_to_use() {
        block_on(async {
            let down = Down::default();
            let store: &dyn OutboxStore = &down;
            let long = "é".repeat(MAX_ERROR_LEN);
            let _ = store
                .mark_failed(&LeaseToken::random(), 7, &long, AfterFailure::Dead)
                .await;
            let _ = store.list(&OutboxQuery::default()).await;
            assert_eq!(
                *down.seen.lock().unwrap(),
                [
                    format!("mark_failed 7 {MAX_ERROR_LEN} Dead"),
                    "list 100".to_owned()
                ]
            );
        });
    }
}
