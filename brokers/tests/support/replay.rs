//! Helpers the replay tests share: a handler that fails some messages until it is fixed,
//! and a dead-letters session raced by a live redelivery.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use dedup_brokers::replay::{DeadLetter, DeadLetters};
use dedup_brokers::{BrokerError, Delivery, Handle, with_inbox};
use dedup_core::{BoxError, Inbox, InboxConfig, MemoryStore};
use futures::future::BoxFuture;

use super::Runs;

/// The prefix of the message ids the [`fixable`] handler fails while it is broken.
pub const BAD: &str = "bad";

/// A lease-mode handler over `store` allowing one attempt, so a failed message is
/// dead-lettered at its redelivery. While `broken` holds, it fails the messages whose id
/// starts with [`BAD`]. Every other run succeeds and is counted in `runs`.
pub fn fixable(store: &Arc<MemoryStore>, runs: &Runs, broken: &Arc<AtomicBool>) -> impl Handle {
    let inbox = Inbox::from_arc(
        Arc::clone(store),
        InboxConfig {
            max_attempts: Some(1),
            ..InboxConfig::default()
        },
    );
    let (runs, broken) = (Arc::clone(runs), Arc::clone(broken));
    with_inbox(inbox, move |_lease, d: Delivery| {
        let (runs, broken) = (Arc::clone(&runs), Arc::clone(&broken));
        async move {
            let id = d.message_id.unwrap_or_default();
            if broken.load(Ordering::SeqCst) && id.starts_with(BAD) {
                return Err::<Option<Vec<u8>>, BoxError>("the handler's bug".into());
            }
            *runs.lock().unwrap().entry(id).or_default() += 1;
            Ok(None)
        }
    })
}

/// The good runs of `id` so far.
pub fn runs_of(runs: &Runs, id: &str) -> u32 {
    runs.lock().unwrap().get(id).copied().unwrap_or(0)
}

/// A live redelivery of a copy's message, run once.
pub type Redeliver = Box<dyn FnOnce(DeadLetter) -> BoxFuture<'static, ()> + Send>;

/// A session that runs `redeliver` once, just before its first republish (after the
/// replay forgot the key): the message's live redelivery races the replay.
pub struct Racing<S> {
    /// The broker's session.
    pub inner: S,
    /// The live redelivery, taken at the first republish.
    pub redeliver: Option<Redeliver>,
}

#[async_trait]
impl<S: DeadLetters> DeadLetters for Racing<S> {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn take(&mut self, limit: usize) -> Result<Vec<DeadLetter>, BrokerError> {
        self.inner.take(limit).await
    }

    async fn republish(&mut self, letter: &DeadLetter) -> Result<(), BrokerError> {
        if let Some(redeliver) = self.redeliver.take() {
            redeliver(letter.clone()).await;
        }
        self.inner.republish(letter).await
    }

    async fn settle(&mut self, letter: &DeadLetter) -> Result<(), BrokerError> {
        self.inner.settle(letter).await
    }

    async fn give_back(&mut self) -> Result<(), BrokerError> {
        self.inner.give_back().await
    }
}
