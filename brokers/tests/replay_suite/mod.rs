//! The replay scenarios, written once over a [`ReplayBroker`] and run by each broker's
//! replay test through [`replay_scenarios!`].
//!
//! Each dead-letters messages with the [`fixable`] handler, fixes it, replays, and counts
//! the handler's good runs per message id: exactly one each.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedup_brokers::replay::{DeadLetters, Pick, ReplayReport, plan, replay};
use dedup_brokers::{ConsumerConfig, ConsumerStats, ShutdownTrigger, Source, consume, shutdown};
use dedup_core::{Admin, Claim, ClaimOptions, DedupStore, Key, MemoryStore, Status};
use futures::FutureExt;
use tokio::task::JoinHandle;

use crate::support::replay::{Racing, fixable, runs_of};
use crate::support::{Runs, config, wait_until};

/// What a broker gives the scenarios: a fresh endpoint, a consumer of it, and its dead
/// letters through the broker's [`DeadLetters`].
#[async_trait]
pub trait ReplayBroker: Send + Sync + Sized + 'static {
    /// The broker's consumer.
    type Source: Source;

    /// The broker's dead letters.
    type Letters: DeadLetters + 'static;

    /// A fresh endpoint; `None` when the server is not configured (and not strict).
    async fn new() -> Option<Self>;

    /// The consumer name its consumers use (what `dedup-failure-consumer` says).
    fn consumer(&self) -> String;

    /// Publishes one message per id to the origin, as the application does.
    async fn publish(&self, ids: &[String]);

    /// A consumer of the endpoint.
    async fn source(&self, config: &ConsumerConfig) -> Self::Source;

    /// A new reading session of the endpoint's dead letters.
    async fn dead_letters(&self) -> Self::Letters;

    /// Removes the endpoint.
    async fn cleanup(self);
}

/// A consumer running the [`fixable`] handler, broken at first.
pub struct World<B: ReplayBroker> {
    pub fx: Arc<B>,
    pub store: Arc<MemoryStore>,
    pub broken: Arc<AtomicBool>,
    /// Good runs per message id.
    pub runs: Runs,
    stop: ShutdownTrigger,
    task: JoinHandle<Result<ConsumerStats, dedup_brokers::BrokerError>>,
}

impl<B: ReplayBroker> World<B> {
    /// `fx`'s consumer running the broken handler.
    pub async fn start(fx: B) -> Self {
        let store = Arc::new(MemoryStore::new());
        let broken = Arc::new(AtomicBool::new(true));
        let runs = Runs::default();
        let handler = fixable(&store, &runs, &broken);
        let (stop, signal) = shutdown();
        let cfg = config();
        let task = tokio::spawn(consume(fx.source(&cfg).await, cfg, handler, signal));
        World {
            fx: Arc::new(fx),
            store,
            broken,
            runs,
            stop,
            task,
        }
    }

    /// Publishes `ids` and waits until each is among the dead letters; then fixes the
    /// handler.
    pub async fn dead_letter(&self, ids: &[String]) {
        self.fx.publish(ids).await;
        let want: BTreeSet<String> = ids.iter().cloned().collect();
        let mut seen = BTreeSet::new();
        for _ in 0..100 {
            seen = self.dead_ids().await;
            if want.is_subset(&seen) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(want.is_subset(&seen), "dead-lettered: {seen:?}");
        for id in ids {
            assert_eq!(self.status(id).await, Some(Status::DeadLettered), "{id}");
        }
        self.broken.store(false, Ordering::SeqCst);
    }

    /// The message ids among the dead letters now (read, then given back).
    pub async fn dead_ids(&self) -> BTreeSet<String> {
        let mut dead = self.fx.dead_letters().await;
        let mut ids = BTreeSet::new();
        loop {
            let batch = dead.take(100).await.expect("reading the dead letters");
            if batch.is_empty() {
                break;
            }
            ids.extend(batch.into_iter().filter_map(|l| l.message_id));
        }
        dead.give_back()
            .await
            .expect("giving the dead letters back");
        ids
    }

    /// The key's status in the consumer's store.
    pub async fn status(&self, id: &str) -> Option<Status> {
        let key = Key::new(self.fx.consumer(), id).unwrap();
        let now = self.store.now().await.unwrap();
        let record = self.store.get(&key).await.unwrap();
        record.map(|r| Status::of(&r, now))
    }

    /// A replay of `pick` in a new session.
    pub async fn replay(&self, pick: &Pick) -> ReplayReport {
        let mut dead = self.fx.dead_letters().await;
        let consumer = self.fx.consumer();
        replay(&mut dead, &*self.store, &consumer, pick, 1000)
            .await
            .unwrap_or_else(|e| panic!("replay of {pick:?}: {e:?}"))
    }

    /// The dry run of `pick` in a new session.
    pub async fn plan(&self, pick: &Pick) -> ReplayReport {
        let mut dead = self.fx.dead_letters().await;
        let consumer = self.fx.consumer();
        plan(&mut dead, &*self.store, &consumer, pick, 1000)
            .await
            .unwrap_or_else(|e| panic!("plan of {pick:?}: {e:?}"))
    }

    /// Waits until each of `ids` ran, then a while for extra runs; returns the good runs.
    pub async fn runs_after(&self, ids: &[String]) -> BTreeMap<String, u32> {
        wait_until("the replayed messages ran", || {
            let runs = self.runs.lock().unwrap();
            ids.iter().all(|id| runs.contains_key(id))
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.runs.lock().unwrap().clone().into_iter().collect()
    }

    /// Stops the consumer and removes the endpoint.
    pub async fn finish(self) {
        self.stop.shut_down();
        let stats = self.task.await.unwrap();
        stats.expect("the consumer ran until stopped");
        let fx = Arc::into_inner(self.fx).expect("no scenario keeps the fixture");
        fx.cleanup().await;
    }
}

/// `ids` as owned strings.
pub fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

fn once_each(ids: &[&str]) -> BTreeMap<String, u32> {
    ids.iter().map(|id| (id.to_string(), 1)).collect()
}

fn pick(ids: &[&str]) -> Pick {
    Pick::Ids(ids.iter().map(|s| s.to_string()).collect())
}

/// Five messages dead-lettered; replayed by one key, then a set, then all: each runs once,
/// and the copies not picked stay among the dead letters until picked. A replay run again
/// finds nothing.
pub async fn replay_by_key_then_set_then_all_runs_each_once<B: ReplayBroker>(fx: B) {
    let all = ["bad-0", "bad-1", "bad-2", "bad-3", "bad-4"];
    let w = World::start(fx).await;
    w.dead_letter(&strings(&all)).await;

    // The dry run decides as the replay does, and changes nothing.
    let planned = w.plan(&pick(&["bad-0"])).await;
    let every: BTreeSet<String> = strings(&all).into_iter().collect();
    assert_eq!(w.dead_ids().await, every, "a dry run settles nothing");
    assert_eq!(w.status("bad-0").await, Some(Status::DeadLettered));
    let report = w.replay(&pick(&["bad-0"])).await;
    assert_eq!(planned, report, "the dry run foretold the replay");
    assert_eq!(report.replayed, ["bad-0"], "{report:?}");
    assert_eq!(report.not_picked, 4, "{report:?}");
    assert_eq!(
        w.runs_after(&strings(&["bad-0"])).await,
        once_each(&["bad-0"])
    );
    let left: BTreeSet<String> = strings(&all[1..]).into_iter().collect();
    assert_eq!(w.dead_ids().await, left, "the copies not picked stay");

    let report = w.replay(&pick(&["bad-1", "bad-2"])).await;
    let mut replayed = report.replayed.clone();
    replayed.sort();
    assert_eq!(replayed, ["bad-1", "bad-2"], "{report:?}");
    let runs = w.runs_after(&strings(&all[..3])).await;
    assert_eq!(runs, once_each(&all[..3]));
    let left: BTreeSet<String> = strings(&all[3..]).into_iter().collect();
    assert_eq!(w.dead_ids().await, left, "the copies not picked stay");

    let report = w.replay(&Pick::All).await;
    assert_eq!(report.replayed.len(), 2, "{report:?}");
    assert_eq!(w.runs_after(&strings(&all)).await, once_each(&all));
    assert!(w.dead_ids().await.is_empty(), "every copy settled");
    for id in all {
        assert_eq!(w.status(id).await, Some(Status::Completed), "{id}");
    }

    let again = w.replay(&Pick::All).await;
    assert_eq!(again, ReplayReport::default(), "nothing left to replay");
    assert_eq!(w.runs_after(&strings(&all)).await, once_each(&all));
    w.finish().await;
}

/// A replay that stopped after its republish (the copy republished, not settled), then a
/// second replay at once: the message runs once, and the copy is settled.
pub async fn a_replay_run_twice_runs_the_handler_once<B: ReplayBroker>(fx: B) {
    let w = World::start(fx).await;
    w.dead_letter(&strings(&["bad-t"])).await;
    let consumer = w.fx.consumer();
    let mut first = w.fx.dead_letters().await;
    let letters = first.take(10).await.unwrap();
    let letter = letters
        .iter()
        .find(|l| l.message_id.as_deref() == Some("bad-t"))
        .expect("the copy of bad-t");
    let key = Key::new(consumer.as_str(), "bad-t").unwrap();
    w.store.forget(&key, false).await.unwrap();
    first.republish(letter).await.expect("the first republish");
    first.give_back().await.unwrap();
    let back = w.dead_ids().await;
    assert!(
        back.contains("bad-t"),
        "given back, readable by another session: {back:?}"
    );
    drop(first);

    let mut settled = false;
    for _ in 0..20 {
        let report = w.replay(&Pick::All).await;
        assert!(report.replayed.len() + report.already_processed.len() <= 1);
        if w.dead_ids().await.is_empty() {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(settled, "the second replay settles the copy");
    assert_eq!(
        w.runs_after(&strings(&["bad-t"])).await,
        once_each(&["bad-t"])
    );
    w.finish().await;
}

/// A copy whose key a delivery holds is left, its lease live or run out (a redelivery
/// takes a lease that ran out over); the copy stays for a later replay, and no handler
/// runs.
pub async fn a_copy_whose_key_is_in_flight_is_left<B: ReplayBroker>(fx: B) {
    let w = World::start(fx).await;
    let ids = strings(&["bad-f"]);
    w.dead_letter(&ids).await;
    let key = Key::new(w.fx.consumer(), "bad-f").unwrap();
    w.store.forget(&key, false).await.unwrap();
    let lease = Duration::from_millis(300);
    let claim = w.store.claim(&key, &ClaimOptions::lease(lease)).await;
    assert!(matches!(claim, Ok(Claim::Acquired(_))), "{claim:?}");
    for (when, status) in [("live", Status::InFlight), ("run out", Status::Expired)] {
        if status == Status::Expired {
            tokio::time::sleep(lease * 2).await;
        }
        assert_eq!(w.status("bad-f").await, Some(status), "{when}");
        let report = w.replay(&Pick::All).await;
        let left: Vec<&str> = report.left.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(left, ["bad-f"], "lease {when}: {report:?}");
        assert!(report.replayed.is_empty(), "lease {when}: {report:?}");
        let dead: BTreeSet<String> = ids.iter().cloned().collect();
        assert_eq!(w.dead_ids().await, dead, "lease {when}: the copy stays");
    }
    assert_eq!(runs_of(&w.runs, "bad-f"), 0, "no handler ran");
    w.finish().await;
}

/// A replay raced by a live redelivery: the publisher sends the message again after the
/// replay forgot the key, and it runs before the replay republishes. The republished copy
/// is then a duplicate: the handler runs once, and the copy is settled.
pub async fn a_replay_raced_with_a_redelivery_runs_the_handler_once<B: ReplayBroker>(fx: B) {
    let w = World::start(fx).await;
    let ids = strings(&["bad-l"]);
    w.dead_letter(&ids).await;
    let (fx, runs) = (Arc::clone(&w.fx), Arc::clone(&w.runs));
    let mut racing = Racing {
        inner: w.fx.dead_letters().await,
        redeliver: Some(Box::new(move |letter| {
            async move {
                let id = letter.message_id.unwrap();
                fx.publish(std::slice::from_ref(&id)).await;
                wait_until("the live redelivery ran", || runs_of(&runs, &id) == 1).await;
            }
            .boxed()
        })),
    };
    let consumer = w.fx.consumer();
    let report = replay(&mut racing, &*w.store, &consumer, &Pick::All, 1000)
        .await
        .unwrap();
    assert!(
        racing.redeliver.is_none(),
        "the redelivery raced: {report:?}"
    );
    assert_eq!(report.replayed, ids, "{report:?}");
    drop(racing);
    assert_eq!(w.runs_after(&ids).await, once_each(&["bad-l"]));
    assert!(w.dead_ids().await.is_empty(), "the copy is settled");
    w.finish().await;
}

/// One `#[tokio::test]` per replay scenario for a [`ReplayBroker`] type.
macro_rules! replay_scenarios {
    ($broker:ty) => {
        $crate::replay_suite::__replay_tests!($broker;
            replay_by_key_then_set_then_all_runs_each_once,
            a_replay_run_twice_runs_the_handler_once,
            a_replay_raced_with_a_redelivery_runs_the_handler_once,
            a_copy_whose_key_is_in_flight_is_left,
        );
    };
}

macro_rules! __replay_tests {
    ($broker:ty; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let Some(fx) = <$broker as $crate::replay_suite::ReplayBroker>::new().await
                else {
                    return;
                };
                $crate::replay_suite::$scenario(fx).await;
            }
        )*
    };
}

pub(crate) use {__replay_tests, replay_scenarios};
