//! The relay's listener after its wake-ups are lost (a database outage): it polls, tries
//! to listen again with backoff, and logs once when they are lost (with the cause chain)
//! and once when it listens again, not at every try. A capturing subscriber, for this
//! thread only.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::OutboxStorage;
use dedup_core::outbox::{
    AfterFailure, DestinationStats, Held, MemoryOutbox, MemoryPublisher, OutboxEntry, OutboxQuery,
    OutboxStats, Relay, RelayConfig,
};
use dedup_core::test_util::Capture;
use dedup_core::{Error, LeaseToken, PurgeOptions, PurgeReport, Result};
use futures::StreamExt;
use futures::stream::BoxStream;
use tracing::Level;

/// A memory outbox whose wake-ups are lost after one notification, cannot be opened for
/// the next `down` tries, then work again (and stay quiet).
#[derive(Debug)]
struct Outage {
    inner: MemoryOutbox,
    tries: AtomicU32,
    down: u32,
    /// When each try came (tokio's clock).
    at: Mutex<Vec<tokio::time::Instant>>,
}

impl Outage {
    fn new(down: u32) -> Self {
        Outage {
            inner: MemoryOutbox::new(),
            tries: AtomicU32::new(0),
            down,
            at: Mutex::default(),
        }
    }
}

fn reset() -> Error {
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
    Error::backend("outage", true, io)
}

#[async_trait]
impl OutboxStorage for Outage {
    fn backend(&self) -> &'static str {
        "outage"
    }
    async fn take(&self, limit: usize, hold: Duration) -> Result<Held> {
        OutboxStorage::take(&self.inner, limit, hold).await
    }
    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>> {
        OutboxStorage::mark_sent(&self.inner, token, ids).await
    }
    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> Result<bool> {
        OutboxStorage::mark_failed(&self.inner, token, id, error, after).await
    }
    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64> {
        OutboxStorage::hand_back(&self.inner, token, ids).await
    }
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        OutboxStorage::purge(&self.inner, options).await
    }
    async fn stats(&self) -> Result<OutboxStats> {
        OutboxStorage::stats(&self.inner).await
    }
    async fn stats_by_destination(&self) -> Result<Vec<DestinationStats>> {
        OutboxStorage::stats_by_destination(&self.inner).await
    }
    async fn list(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>> {
        OutboxStorage::list(&self.inner, query).await
    }
    async fn retry(&self, id: i64) -> Result<bool> {
        OutboxStorage::retry(&self.inner, id).await
    }
    async fn wakeups(&self) -> Result<Option<BoxStream<'static, Result<()>>>> {
        let try_ = self.tries.fetch_add(1, Ordering::SeqCst);
        self.at.lock().unwrap().push(tokio::time::Instant::now());
        if try_ == 0 {
            return Ok(Some(futures::stream::iter([Ok(()), Err(reset())]).boxed()));
        }
        if try_ <= self.down {
            return Err(reset());
        }
        Ok(Some(futures::stream::pending().boxed()))
    }
}

/// `store` after a relay polling every second ran over it for a minute of tokio's paused
/// time.
fn a_minute_of_relay_over(store: Outage) -> Arc<Outage> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let store = Arc::new(store);
    runtime.block_on(async {
        let relay = Relay::new(store.clone(), Arc::new(MemoryPublisher::new()))
            .with_config(RelayConfig::default().poll_interval(Duration::from_secs(1)))
            .start()
            .expect("the relay starts");
        tokio::time::sleep(Duration::from_secs(60)).await;
        relay.stop().await;
    });
    store
}

/// This file's tests, one at a time. A relay logging with no subscriber on one thread,
/// beside the test that captures logs on another, made that test miss a line under load:
/// `tracing` decides per call site, for every thread at once, whether a line is wanted.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn lost_wakeups_are_logged_once_retried_with_backoff_and_logged_once_back() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let capture = Capture::default();
    let _guard = capture.install();
    // Backoff 100, 200, 400, 800 ms, then the poll interval: well inside a minute.
    let store = a_minute_of_relay_over(Outage::new(5));
    assert_eq!(
        store.tries.load(Ordering::SeqCst),
        7,
        "the first listen, 5 failed tries, the one that works; then no more"
    );
    // The events seen at `WARN` and `INFO`: level, message and cause.
    let logged: Vec<_> = (capture.events().into_iter())
        .filter(|e| e.level == Level::WARN || e.level == Level::INFO)
        .map(|e| {
            let field = |name| e.field(name).unwrap_or_default().to_owned();
            (e.level, field("message"), field("cause"))
        })
        .collect();
    let listener: Vec<_> = logged
        .iter()
        .filter(|(_, message, _)| message.contains("notifications"))
        .collect();
    assert_eq!(listener.len(), 2, "{logged:#?}");
    let (level, message, cause) = listener[0];
    assert_eq!(*level, Level::WARN);
    assert!(message.contains("cannot listen"), "{message}");
    assert!(cause.contains("reset by peer"), "the cause chain: {cause}");
    let (level, message, _) = listener[1];
    assert_eq!(*level, Level::INFO);
    assert!(
        message.contains("listening for notifications again"),
        "{message}"
    );
}

#[test]
fn tries_to_listen_again_wait_twice_as_long_each_time_up_to_the_poll_interval() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let store = a_minute_of_relay_over(Outage::new(5));
    let at = store.at.lock().unwrap().clone();
    let gaps: Vec<u128> = at.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
    assert_eq!(
        gaps,
        [100, 200, 400, 800, 1000, 1000],
        "the first delay, doubling, then at most the poll interval"
    );
}
