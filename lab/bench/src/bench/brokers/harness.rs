//! What every broker's rows share: the ways a run consumes, the [`Broker`] trait each
//! broker implements, the hand-written loops' step and slots, and the adapter's run.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use dedup_brokers::{
    ConsumerConfig, Delivery, Handle, InboxHandler, ShutdownTrigger, shutdown, with_inbox,
};
use dedup_core::{BoxError, Handled, Inbox, InboxError, Key, Lease, MemoryStore};
use futures::future::{BoxFuture, Ready, ready};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::bench::Result;
use crate::bench::driver::Run;

/// The way a run consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Raw,
    InboxLoop,
    Adapter,
}

pub(super) const KINDS: [(Kind, &str); 3] = [
    (Kind::Raw, "raw"),
    (Kind::InboxLoop, "loop"),
    (Kind::Adapter, "adapter"),
];

/// The payload every message carries.
pub(super) const PAYLOAD: &[u8] = br#"{"order_id":"o-1","item":"book","amount":100}"#;

/// How long a run may take before it counts as stuck.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// One broker's way of publishing and consuming.
pub(super) trait Broker: Send + Sync + 'static {
    /// Publish `n` messages with ids `{tag}-0...` to a destination of tag `tag` of its
    /// own (not measured), and consume them the `kind` way with `in_flight` at most.
    fn consume(
        &self,
        kind: Kind,
        tag: String,
        n: usize,
        in_flight: usize,
    ) -> BoxFuture<'static, Result<Run>>;

    /// How the broker is set up, for the rows.
    fn setup(&self) -> String;
}

pub(super) async fn timed(run: BoxFuture<'static, Result<Run>>) -> Result<Run> {
    tokio::time::timeout(RUN_TIMEOUT, run)
        .await
        .map_err(|_| format!("a consumer run took over {RUN_TIMEOUT:?}"))?
}

/// The hand-written loop's step: `Inbox::handle` around an empty handler; the message
/// must be new.
pub(super) async fn handle_once(
    inbox: &Inbox<MemoryStore>,
    consumer: &str,
    id: Option<&str>,
) -> Result<()> {
    let key = Key::new(consumer, id.ok_or("a message without an id")?)?;
    match inbox
        .handle(&key, None, |_lease| async { Ok::<_, BoxError>(None) })
        .await?
    {
        Handled::Processed { .. } => Ok(()),
        other => Err(format!("{key:?} should have been new: {other:?}").into()),
    }
}

/// The hand-written loop's admission floor, the adapter's default
/// ([`ConsumerConfig::max_age`]): a message the broker stored longer ago than that may have
/// lost its inbox record to a purge, so a loop keeping the adapter's guarantee refuses it.
/// The bench's messages are fresh: a refusal fails the run. `published`: the broker's
/// stored time (`None`: it gives none, and the adapter admits the message too).
pub(super) fn admit(published: Option<SystemTime>) -> Result<()> {
    let Some(published) = published else {
        return Ok(());
    };
    let age = SystemTime::now()
        .duration_since(published)
        .unwrap_or_default();
    match ConsumerConfig::default().max_age {
        Some(max_age) if age > max_age => {
            Err(format!("published {age:?} ago, past the admission floor {max_age:?}").into())
        }
        _ => Ok(()),
    }
}

/// A stored time given in milliseconds since the Unix epoch.
pub(super) fn at_millis(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

/// The empty handler the adapter runs under `with_inbox` (a plain `fn`, as the hand-written
/// loop's is inline).
type EmptyWork = fn(Lease, Delivery) -> Ready<Result<Option<Vec<u8>>, BoxError>>;

/// The handler every adapter run takes: `with_inbox` around the empty handler, counted.
pub(super) type AdapterHandler = Counting<InboxHandler<MemoryStore, EmptyWork>>;

/// A handler counting what `inner` handled; the `n`th handled message stamps the end of the
/// run and stops the consumer. The consumer owns it as it owns a user's handler (no `Arc`,
/// no `dyn`): only the count is shared with the run.
pub(super) struct Counting<H> {
    inner: H,
    count: Arc<Count>,
}

/// What a [`Counting`] handler shares with its run.
pub(super) struct Count {
    handled: AtomicUsize,
    n: usize,
    ended: std::sync::Mutex<Option<Instant>>,
    stop: ShutdownTrigger,
}

#[async_trait]
impl<H: Handle> Handle for Counting<H> {
    async fn handle(&self, key: &Key, delivery: &Delivery) -> Result<Handled, InboxError> {
        let handled = self.inner.handle(key, delivery).await?;
        let count = &*self.count;
        if count.handled.fetch_add(1, Ordering::SeqCst) + 1 == count.n {
            *count.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            count.stop.shut_down();
        }
        Ok(handled)
    }
}

/// Run an adapter: `consume(handler, shutdown)` until `n` messages were handled; the time
/// from the start to the `n`th.
pub(super) async fn adapter_run<F, Fut>(n: usize, consume: F) -> Result<Run>
where
    F: FnOnce(AdapterHandler, dedup_brokers::Shutdown) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let (stop, stopped) = shutdown();
    let empty: EmptyWork = |_lease, _delivery| ready(Ok(None));
    let count = Arc::new(Count {
        handled: AtomicUsize::new(0),
        n,
        ended: std::sync::Mutex::new(None),
        stop,
    });
    let handler = Counting {
        inner: with_inbox(Inbox::new(MemoryStore::new()), empty),
        count: Arc::clone(&count),
    };
    let started = Instant::now();
    consume(handler, stopped).await?;
    let ended = count
        .ended
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .ok_or("the consumer stopped before handling every message")?;
    Ok(Run {
        elapsed: ended - started,
        samples: Vec::new(),
    })
}

/// How the hand-written loops (raw and inbox_loop) run each message's work: inline with one
/// in flight, else as a task holding one of `in_flight` slots, as a hand-written consumer
/// with that many in flight would.
pub(super) struct Workers {
    slots: Arc<Semaphore>,
    tasks: JoinSet<Result<()>>,
    inline: bool,
}

impl Workers {
    pub(super) fn new(in_flight: usize) -> Self {
        Workers {
            slots: Arc::new(Semaphore::new(in_flight.max(1))),
            tasks: JoinSet::new(),
            inline: in_flight <= 1,
        }
    }

    /// Wait for a free slot, then take every free one (a finished task's error fails the
    /// run here).
    pub(super) async fn free(&mut self) -> Result<Vec<OwnedSemaphorePermit>> {
        let mut slots = vec![Arc::clone(&self.slots).acquire_owned().await?];
        while let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() {
            slots.push(slot);
        }
        while let Some(done) = self.tasks.try_join_next() {
            done??;
        }
        Ok(slots)
    }

    /// Run `work` in `slot`.
    pub(super) async fn run(
        &mut self,
        slot: OwnedSemaphorePermit,
        work: impl Future<Output = Result<()>> + Send + 'static,
    ) -> Result<()> {
        if self.inline {
            return work.await;
        }
        self.tasks.spawn(async move {
            let done = work.await;
            drop(slot);
            done
        });
        Ok(())
    }

    /// Wait for every task.
    pub(super) async fn finish(mut self) -> Result<()> {
        while let Some(done) = self.tasks.join_next().await {
            done??;
        }
        Ok(())
    }
}

pub(super) fn config(in_flight: usize) -> ConsumerConfig {
    ConsumerConfig {
        in_flight,
        ..ConsumerConfig::default()
    }
}
