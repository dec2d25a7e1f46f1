//! The world of one case: the broker's queue, the workers and their stopping points, the
//! ledger of effects, the runs, and the story. Everything that decides "who moves next"
//! is here: workers only ever wait at a stopping point ([`World::gate`]) until the driver
//! (`run.rs`) lets one of them pass.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dedup_core::{Claim, DedupStore, InboxConfig, Key, Lease, ManualClock, Record, RecordState};
use tokio::sync::{Notify, oneshot};

use crate::Message;

/// Where a worker can be stopped: before each store operation, before each effect or
/// probe, before the commit of a transaction, before an ack or a nack.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Point {
    /// Before `claim` (lease mode: the store call; transactional mode: before the
    /// `TxInbox` claims).
    Claim,
    /// Before `claim_many`.
    ClaimMany,
    /// Before `renew`.
    Renew,
    /// Before `commit` (lease mode): after the handler's effects, before the key is done.
    Commit,
    /// Before `commit_many`.
    CommitMany,
    /// Before `release`.
    Release,
    /// Before `get`.
    Get,
    /// Before an effect recorded in the kit's ledger ([`Effects::call`](crate::Effects::call)).
    Effect(String),
    /// Before a probe the handler marks ([`Effects::probe`](crate::Effects::probe)).
    Probe(String),
    /// Transactional mode: after the handler returned, before its transaction commits
    /// (the business rows and the key's completion).
    TxCommit,
    /// Before the consumer acknowledges the delivery.
    Ack,
    /// Before the consumer gives the delivery back (requeue).
    Nack,
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Point::Claim => f.write_str("the claim"),
            Point::ClaimMany => f.write_str("claim_many"),
            Point::Renew => f.write_str("a renewal"),
            Point::Commit => f.write_str("the commit"),
            Point::CommitMany => f.write_str("commit_many"),
            Point::Release => f.write_str("the release"),
            Point::Get => f.write_str("get"),
            Point::Effect(name) => write!(f, "effect {name:?}"),
            Point::Probe(label) => write!(f, "probe {label:?}"),
            Point::TxCommit => f.write_str("the transaction's commit"),
            Point::Ack => f.write_str("the ack"),
            Point::Nack => f.write_str("the nack"),
        }
    }
}

/// How the kit stopped a worker at a [`Point`]: the error every kit call returns to the
/// consumer there. Propagate it (`?`): a killed worker must do nothing more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interrupted {
    /// Killed (the process died) or failed (an injected error).
    pub kind: InterruptKind,
    /// Where.
    pub point: Point,
}

/// The two ways a worker is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InterruptKind {
    /// The worker's process died ([`Step::Kill`](crate::Step::Kill)).
    Killed,
    /// The operation failed ([`Step::Fail`](crate::Step::Fail)).
    Failed,
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            InterruptKind::Killed => write!(f, "killed by the test kit before {}", self.point),
            InterruptKind::Failed => {
                write!(f, "failure injected by the test kit at {}", self.point)
            }
        }
    }
}

impl std::error::Error for Interrupted {}

/// The driver's answer at a stopping point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Go,
    Kill,
    Fail,
}

/// A worker waiting at a stopping point.
pub(crate) struct Arrival {
    point: Point,
    /// Inside a transaction: no other worker moves until this one leaves it.
    pub(crate) in_tx: bool,
    reply: oneshot::Sender<Verdict>,
}

/// Who is acting: a worker's incarnation (a killed worker's replacement is the next) and
/// the run (one delivery taken by it).
#[derive(Clone, Debug)]
pub(crate) struct Actor {
    pub(crate) worker: usize,
    pub(crate) incarnation: u32,
    pub(crate) run: usize,
    pub(crate) message: usize,
}

/// One worker slot.
#[derive(Default)]
pub(crate) struct Slot {
    pub(crate) incarnation: u32,
    /// The run under way (its task may have finished with detached work still arriving).
    pub(crate) run: Option<usize>,
    pub(crate) pending: VecDeque<Arrival>,
    pub(crate) finished: bool,
    pub(crate) dead: bool,
}

impl Slot {
    pub(crate) fn idle(&self) -> bool {
        self.run.is_none() || (self.finished && self.pending.is_empty())
    }
}

/// One delivery taken by one worker.
#[derive(Clone, Debug)]
pub(crate) struct RunInfo {
    pub(crate) worker: usize,
    pub(crate) message: usize,
    /// The handler started (lease mode: the inbox called it; transactional mode: inside
    /// the transaction).
    pub(crate) entered: bool,
    /// This run completed the key (a commit answered `Ok`, or its transaction committed).
    pub(crate) committed: bool,
    pub(crate) killed: bool,
    /// Sequence numbers of failures injected into this run and of its releases.
    pub(crate) interrupts: Vec<u64>,
    pub(crate) acked: bool,
    pub(crate) nacked: bool,
    pub(crate) requeued: bool,
}

/// One call to the kit's ledger.
#[derive(Clone, Debug)]
pub(crate) struct EffectRec {
    pub(crate) seq: u64,
    pub(crate) run: usize,
    pub(crate) message: usize,
    pub(crate) name: String,
    pub(crate) key: Option<String>,
    /// `false` when the key was used before (the external system did not repeat it).
    pub(crate) applied: bool,
}

/// Everything one case changes.
pub(crate) struct State {
    pub(crate) seq: u64,
    /// Bumped by anything that moves a message forward (a claim acquired, an effect, a
    /// commit, a release, an ack, a handler started): the drain moves the clock when
    /// rounds pass without it.
    pub(crate) progress: u64,
    pub(crate) story: Vec<String>,
    pub(crate) queue: VecDeque<usize>,
    pub(crate) deliveries: Vec<u32>,
    pub(crate) acks: Vec<u32>,
    pub(crate) slots: Vec<Slot>,
    pub(crate) runs: Vec<RunInfo>,
    pub(crate) effects: Vec<EffectRec>,
    keys_used: BTreeSet<(String, String)>,
    /// Leases held by runs under way (renewed when the clock moves, as the inbox renews
    /// while its handler runs), by run.
    pub(crate) held: BTreeMap<usize, Lease>,
    pub(crate) panics: Vec<(usize, String)>,
    /// Where kills and injected failures hit (the point's description), for the report.
    pub(crate) kills_at: Vec<String>,
    pub(crate) failures_at: Vec<String>,
}

impl State {
    pub(crate) fn say(&mut self, line: String) {
        self.seq += 1;
        self.story.push(line);
    }
}

/// The shared world of one case.
pub(crate) struct World {
    state: Mutex<State>,
    changed: Notify,
    pub(crate) clock: Arc<ManualClock>,
    /// The store under test, without stopping points (the driver's renewals, the checks).
    pub(crate) store: Arc<dyn DedupStore>,
    pub(crate) config: InboxConfig,
    pub(crate) consumer: String,
    pub(crate) messages: Vec<Message>,
}

impl World {
    pub(crate) fn new(
        clock: Arc<ManualClock>,
        store: Arc<dyn DedupStore>,
        config: InboxConfig,
        consumer: String,
        messages: Vec<Message>,
        workers: usize,
    ) -> Self {
        let n = messages.len();
        World {
            state: Mutex::new(State {
                seq: 0,
                progress: 0,
                story: Vec::new(),
                queue: (0..n).collect(),
                deliveries: vec![0; n],
                acks: vec![0; n],
                slots: (0..workers).map(|_| Slot::default()).collect(),
                runs: Vec::new(),
                effects: Vec::new(),
                keys_used: BTreeSet::new(),
                held: BTreeMap::new(),
                panics: Vec::new(),
                kills_at: Vec::new(),
                failures_at: Vec::new(),
            }),
            changed: Notify::new(),
            clock,
            store,
            config,
            consumer,
            messages,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn notify(&self) {
        self.changed.notify_waiters();
    }

    /// Wait until `cond` holds (checked after every change), at most `STALL`.
    pub(crate) async fn wait_until(
        &self,
        mut cond: impl FnMut(&State) -> bool,
        what: impl Fn() -> String,
    ) -> Result<(), String> {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if cond(&self.lock()) {
                return Ok(());
            }
            if tokio::time::timeout(STALL, notified).await.is_err() {
                return Err(what());
            }
        }
    }

    /// The name of message `m` in stories.
    pub(crate) fn m(&self, m: usize) -> String {
        self.messages[m].name()
    }

    pub(crate) fn key(&self, m: usize) -> Key {
        Key::new(&self.consumer, self.messages[m].id()).expect("the kit's keys are valid")
    }

    /// Stop `actor` at `point` until the driver decides.
    pub(crate) async fn gate(
        &self,
        actor: &Actor,
        point: Point,
        in_tx: bool,
    ) -> Result<(), Interrupted> {
        let rx = self.arrive(actor, point.clone(), in_tx)?;
        verdict(rx.await.unwrap_or(Verdict::Kill), point)
    }

    /// [`gate`](Self::gate) from a blocking thread (a synchronous SQLite handler).
    pub(crate) fn gate_blocking(
        &self,
        actor: &Actor,
        point: Point,
        in_tx: bool,
    ) -> Result<(), Interrupted> {
        let rx = self.arrive(actor, point.clone(), in_tx)?;
        verdict(rx.blocking_recv().unwrap_or(Verdict::Kill), point)
    }

    fn arrive(
        &self,
        actor: &Actor,
        point: Point,
        in_tx: bool,
    ) -> Result<oneshot::Receiver<Verdict>, Interrupted> {
        let mut st = self.lock();
        let slot = &mut st.slots[actor.worker];
        if slot.incarnation != actor.incarnation || slot.dead {
            return Err(Interrupted {
                kind: InterruptKind::Killed,
                point,
            });
        }
        let (reply, rx) = oneshot::channel();
        slot.pending.push_back(Arrival {
            point,
            in_tx,
            reply,
        });
        drop(st);
        self.notify();
        Ok(rx)
    }

    /// The worker other than `w` standing inside a transaction, if any: nothing else may
    /// move then (SQLite has one writer; the kit serialises PostgreSQL the same way).
    pub(crate) fn in_tx_other_than(&self, st: &State, w: usize) -> bool {
        st.slots
            .iter()
            .enumerate()
            .any(|(i, s)| i != w && s.pending.front().is_some_and(|a| a.in_tx))
    }

    /// Let worker `w`'s oldest waiting arrival go (or fail). `None` when none waits.
    pub(crate) fn release_front(&self, st: &mut State, w: usize, fail: bool) -> Option<Point> {
        let arrival = st.slots[w].pending.pop_front()?;
        let _ = arrival
            .reply
            .send(if fail { Verdict::Fail } else { Verdict::Go });
        Some(arrival.point)
    }

    /// Where worker `w` stands.
    pub(crate) fn front(&self, st: &State, w: usize) -> Option<Point> {
        st.slots[w].pending.front().map(|a| a.point.clone())
    }

    /// Answer every waiting arrival of `w` with "killed".
    pub(crate) fn kill_pending(&self, st: &mut State, w: usize) {
        for arrival in st.slots[w].pending.drain(..) {
            let _ = arrival.reply.send(Verdict::Kill);
        }
    }

    /// Say `line` as `actor` (prefixed with its worker), bumping progress if `progress`.
    pub(crate) fn tell(&self, actor: &Actor, line: String, progress: bool) {
        let mut st = self.lock();
        if progress {
            st.progress += 1;
        }
        st.say(format!("w{}: {line}", actor.worker));
    }

    /// A store operation's outcome, told and tracked (leases held, commits, releases).
    pub(crate) fn claimed(&self, actor: &Actor, result: &dedup_core::Result<Claim>) {
        let m = self.m(actor.message);
        let mut st = self.lock();
        let (line, progress) = match result {
            Ok(Claim::Acquired(lease)) => {
                st.held.insert(actor.run, lease.clone());
                (
                    format!(
                        "claims {m}: acquired (attempt {}, fence {})",
                        lease.attempt, lease.fence
                    ),
                    true,
                )
            }
            Ok(Claim::InFlight { attempt, .. }) => (
                format!("claims {m}: in flight elsewhere (attempt {attempt}): busy"),
                false,
            ),
            Ok(Claim::Completed { .. }) => (format!("claims {m}: already completed"), false),
            Err(e) => (format!("claims {m}: error: {e}"), false),
        };
        if progress {
            st.progress += 1;
        }
        st.say(format!("w{}: {line}", actor.worker));
    }

    pub(crate) fn committed(&self, actor: &Actor, result: &dedup_core::Result<()>) {
        let m = self.m(actor.message);
        let mut st = self.lock();
        match result {
            Ok(()) => {
                st.progress += 1;
                st.runs[actor.run].committed = true;
                st.held.remove(&actor.run);
                st.say(format!("w{}: commits {m}: done", actor.worker));
            }
            Err(e) => st.say(format!("w{}: commits {m}: error: {e}", actor.worker)),
        }
    }

    pub(crate) fn released(&self, actor: &Actor, result: &dedup_core::Result<()>) {
        let m = self.m(actor.message);
        let mut st = self.lock();
        match result {
            Ok(()) => {
                st.progress += 1;
                let seq = st.seq;
                st.runs[actor.run].interrupts.push(seq);
                st.held.remove(&actor.run);
                st.say(format!("w{}: releases {m}", actor.worker));
            }
            Err(e) => st.say(format!("w{}: releases {m}: error: {e}", actor.worker)),
        }
    }

    pub(crate) fn renewed(&self, actor: &Actor, result: &dedup_core::Result<Lease>) {
        let m = self.m(actor.message);
        let mut st = self.lock();
        match result {
            Ok(lease) => {
                st.held.insert(actor.run, lease.clone());
                st.say(format!("w{}: renews its lease of {m}", actor.worker));
            }
            Err(e) => st.say(format!("w{}: renews {m}: error: {e}", actor.worker)),
        }
    }

    pub(crate) fn got(&self, actor: &Actor, result: &dedup_core::Result<Option<Record>>) {
        let m = self.m(actor.message);
        let what = match result {
            Ok(None) => "absent".to_owned(),
            Ok(Some(r)) => match r.state {
                RecordState::InFlight { .. } => format!("in flight (attempt {})", r.attempt),
                RecordState::Completed { .. } => "completed".to_owned(),
            },
            Err(e) => format!("error: {e}"),
        };
        self.tell(actor, format!("reads {m}: {what}"), false);
    }

    /// Record a call to the ledger: applied unless its key was used before.
    pub(crate) fn effect(&self, actor: &Actor, name: &str, key: Option<&str>) {
        let m = self.m(actor.message);
        let mut st = self.lock();
        let applied = match key {
            Some(k) => st.keys_used.insert((name.to_owned(), k.to_owned())),
            None => true,
        };
        st.seq += 1;
        let seq = st.seq;
        st.effects.push(EffectRec {
            seq,
            run: actor.run,
            message: actor.message,
            name: name.to_owned(),
            key: key.map(str::to_owned),
            applied,
        });
        st.progress += 1;
        let how = match (key, applied) {
            (None, _) => String::new(),
            (Some(_), true) => " (with the idempotency key)".to_owned(),
            (Some(_), false) => {
                " (with an idempotency key already used: the system does not repeat it)".to_owned()
            }
        };
        st.say(format!("w{}: effect {name:?} for {m}{how}", actor.worker));
    }

    /// The consumer acknowledged (`ack`) or gave back (`nack`) its delivery.
    pub(crate) fn settled(&self, actor: &Actor, ack: bool) {
        let m = self.m(actor.message);
        let mut st = self.lock();
        if ack {
            st.acks[actor.message] += 1;
            st.runs[actor.run].acked = true;
            st.progress += 1;
            st.say(format!("w{}: acks {m}", actor.worker));
        } else if !st.runs[actor.run].nacked {
            st.runs[actor.run].nacked = true;
            st.queue.push_back(actor.message);
            st.say(format!(
                "w{}: nacks {m}: the broker queues it again",
                actor.worker
            ));
        }
    }

    /// The run's task ended: a delivery neither acknowledged nor given back returns to the
    /// queue (the broker redelivers what a dead or returning worker did not ack).
    pub(crate) fn finished(&self, actor: &Actor, panic: Option<String>) {
        let m = self.m(actor.message);
        let mut st = self.lock();
        st.held.remove(&actor.run);
        let run = &mut st.runs[actor.run];
        let requeue = !run.acked && !run.nacked && !run.requeued;
        run.requeued |= requeue;
        if requeue {
            st.queue.push_back(actor.message);
            st.say(format!(
                "broker: {m} was not acknowledged by w{}: queued again",
                actor.worker
            ));
        }
        if let Some(p) = panic {
            st.say(format!("w{}: the consumer panicked: {p}", actor.worker));
            st.panics.push((actor.worker, p));
        }
        let slot = &mut st.slots[actor.worker];
        if slot.incarnation == actor.incarnation && slot.run == Some(actor.run) {
            slot.finished = true;
        }
        drop(st);
        self.notify();
    }

    /// The handler of `actor`'s run started under `lease`.
    pub(crate) fn entered(&self, actor: &Actor, lease: &Lease, tx: bool) {
        let m = self.m(actor.message);
        let mut st = self.lock();
        st.runs[actor.run].entered = true;
        st.progress += 1;
        let where_ = if tx { " in a transaction" } else { "" };
        st.say(format!(
            "w{}: handler starts for {m}{where_} (attempt {}, fence {})",
            actor.worker, lease.attempt, lease.fence
        ));
    }

    /// `actor`'s run completed its key inside its transaction.
    pub(crate) fn tx_committed(&self, actor: &Actor) {
        let m = self.m(actor.message);
        let mut st = self.lock();
        st.runs[actor.run].committed = true;
        st.progress += 1;
        st.say(format!(
            "w{}: transaction commits: {m}'s rows and its completion",
            actor.worker
        ));
    }

    /// A failure injected into `actor`'s run (the store call, effect or ack failed).
    pub(crate) fn failed_at(&self, st: &mut State, w: usize, point: &Point) {
        if let Some(run) = st.slots[w].run {
            let m = self.m(st.runs[run].message);
            let seq = st.seq + 1;
            st.runs[run].interrupts.push(seq);
            st.failures_at.push(point.to_string());
            st.say(format!("w{w}: {point} for {m} fails (injected)"));
        }
    }
}

fn verdict(v: Verdict, point: Point) -> Result<(), Interrupted> {
    match v {
        Verdict::Go => Ok(()),
        Verdict::Kill => Err(Interrupted {
            kind: InterruptKind::Killed,
            point,
        }),
        Verdict::Fail => Err(Interrupted {
            kind: InterruptKind::Failed,
            point,
        }),
    }
}

/// How long the driver waits for a worker to reach its next stopping point before it
/// reports the consumer stuck (a consumer waiting on something the kit does not control).
pub(crate) const STALL: Duration = Duration::from_secs(30);
