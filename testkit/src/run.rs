//! The driver of one case: applies the schedule's steps one at a time, drains, and
//! collects what the checks need. Only one worker moves at a time: a step lets one worker
//! pass its stopping point and waits until it stands at the next one (or is done).

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::task::JoinHandle;

use crate::consumer::{Consumer, Cx};
use crate::schedule::{Schedule, Step};
use crate::world::{Actor, STALL, World};

/// Rounds of the drain after which a consumer that still has not acknowledged everything
/// is reported stuck.
const MAX_DRAIN_ROUNDS: usize = 400;
/// Drain rounds without progress before the clock moves (a dead worker's lease must run
/// out before its message can be taken over).
const IDLE_ROUNDS_BEFORE_EXPIRE: usize = 4;

/// Runs one case.
pub(crate) struct Driver {
    pub(crate) world: Arc<World>,
    consumer: Arc<dyn Consumer>,
    tasks: Vec<Option<JoinHandle<()>>>,
    /// A problem of the run itself (a worker that never reached a stopping point).
    pub(crate) stuck: Option<String>,
}

impl Driver {
    pub(crate) fn new(world: Arc<World>, consumer: Arc<dyn Consumer>, workers: usize) -> Self {
        Driver {
            world,
            consumer,
            tasks: (0..workers).map(|_| None).collect(),
            stuck: None,
        }
    }

    /// The steps, then the drain.
    pub(crate) async fn run(&mut self, schedule: &Schedule) {
        {
            let mut st = self.world.lock();
            let names: Vec<String> = (0..self.world.messages.len())
                .map(|m| self.world.m(m))
                .collect();
            st.say(format!("broker: delivers {}", names.join(", ")));
        }
        for step in &schedule.steps {
            if self.halted() {
                return;
            }
            self.step(*step).await;
        }
        self.drain().await;
    }

    async fn step(&mut self, step: Step) {
        match step {
            Step::Run(w) => self.advance(w).await,
            Step::Kill(w) => self.kill(w).await,
            Step::Fail(w) => self.fail(w).await,
            Step::Expire => self.expire().await,
            Step::Duplicate(m) => {
                let mut st = self.world.lock();
                st.queue.push_back(m);
                let name = self.world.m(m);
                st.say(format!("broker: delivers {name} again"));
            }
        }
    }

    /// Let worker `w` move: pass its stopping point, or take the next delivery.
    async fn advance(&mut self, w: usize) {
        let start = {
            let mut st = self.world.lock();
            if self.world.in_tx_other_than(&st, w) {
                return;
            }
            if self.world.release_front(&mut st, w, false).is_some() {
                false
            } else if st.slots[w].idle() {
                true
            } else {
                // Running but not stopped: wait for it below.
                false
            }
        };
        if start {
            self.reap(w).await;
            if !self.start(w) {
                return;
            }
        }
        self.wait_stopped(w).await;
    }

    /// Take the next delivery on worker `w`; `false` when the queue is empty.
    fn start(&mut self, w: usize) -> bool {
        let mut st = self.world.lock();
        let Some(message) = st.queue.pop_front() else {
            return false;
        };
        st.deliveries[message] += 1;
        let delivery = st.deliveries[message];
        let run = st.runs.len();
        st.runs.push(crate::world::RunInfo {
            worker: w,
            message,
            entered: false,
            committed: false,
            killed: false,
            interrupts: Vec::new(),
            acked: false,
            nacked: false,
            requeued: false,
        });
        let slot = &mut st.slots[w];
        slot.run = Some(run);
        slot.finished = false;
        let actor = Actor {
            worker: w,
            incarnation: slot.incarnation,
            run,
            message,
        };
        let name = self.world.m(message);
        let nth = if delivery == 1 {
            String::new()
        } else {
            format!(" (delivery {delivery})")
        };
        st.say(format!("w{w}: takes {name}{nth}"));
        drop(st);
        let cx = Cx::new(Arc::clone(&self.world), actor.clone(), delivery);
        let work = self.consumer.consume(cx);
        let world = Arc::clone(&self.world);
        self.tasks[w] = Some(tokio::spawn(async move {
            let ended = std::panic::AssertUnwindSafe(work).catch_unwind().await;
            let panic = match ended {
                Ok(_) => None,
                Err(p) => Some(
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "a panic".to_owned()),
                ),
            };
            world.finished(&actor, panic);
        }));
        true
    }

    /// Wait until worker `w` stands at a stopping point or its run ended.
    async fn wait_stopped(&mut self, w: usize) {
        let world = Arc::clone(&self.world);
        let waited = world
            .wait_until(
                |st| !st.slots[w].pending.is_empty() || st.slots[w].finished,
                || format!("w{w} did not reach a stopping point of the kit within {STALL_S} s: the consumer waits on something the kit does not control"),
            )
            .await;
        if let Err(e) = waited {
            self.stuck.get_or_insert(e);
        }
    }

    /// Await a finished run's task and free the slot.
    async fn reap(&mut self, w: usize) {
        if let Some(task) = self.tasks[w].take() {
            let _ = tokio::time::timeout(STALL, task).await;
        }
        let mut st = self.world.lock();
        let slot = &mut st.slots[w];
        slot.run = None;
        slot.finished = false;
    }

    async fn kill(&mut self, w: usize) {
        {
            let mut st = self.world.lock();
            if self.world.in_tx_other_than(&st, w) || st.slots[w].idle() {
                return;
            }
            let Some(run) = st.slots[w].run else {
                return;
            };
            let name = self.world.m(st.runs[run].message);
            let at = match self.world.front(&st, w) {
                Some(point) => format!("before {point}"),
                None => "after its work".to_owned(),
            };
            st.kills_at.push(at.clone());
            let in_tx = st.slots[w].pending.front().is_some_and(|a| a.in_tx);
            let rollback = if in_tx {
                ", inside its transaction, which rolls back"
            } else {
                ""
            };
            st.runs[run].killed = true;
            st.slots[w].dead = true;
            st.held.remove(&run);
            st.say(format!(
                "w{w}: dies {at} ({name}){rollback}; a fresh worker takes its place"
            ));
            self.world.kill_pending(&mut st, w);
        }
        self.world.notify();
        // The dead run's task ends on its own: every later stopping point answers
        // "killed" at once.
        if let Some(task) = self.tasks[w].take()
            && tokio::time::timeout(STALL, task).await.is_err()
        {
            self.stuck.get_or_insert(format!(
                "w{w} did not end within {STALL_S} s of being killed: the consumer ignores the kit's Interrupted errors"
            ));
        }
        let mut st = self.world.lock();
        self.world.kill_pending(&mut st, w);
        let slot = &mut st.slots[w];
        slot.incarnation += 1;
        slot.dead = false;
        slot.run = None;
        slot.finished = false;
    }

    async fn fail(&mut self, w: usize) {
        {
            let mut st = self.world.lock();
            if self.world.in_tx_other_than(&st, w) {
                return;
            }
            let Some(point) = self.world.front(&st, w) else {
                return;
            };
            self.world.failed_at(&mut st, w, &point);
            self.world.release_front(&mut st, w, true);
        }
        self.wait_stopped(w).await;
    }

    /// Move the clock past the lease; renew live workers' leases (standing in for the
    /// inbox's renewal task, whose timer the kit turns off).
    async fn expire(&mut self) {
        let lease = self.world.config.lease;
        self.world.clock.advance(lease + Duration::from_millis(1));
        let held: Vec<_> = {
            let mut st = self.world.lock();
            st.say(format!(
                "clock: +{} ms, past the lease: leases no running handler renews run out",
                lease.as_millis() + 1
            ));
            st.held.iter().map(|(k, l)| (*k, l.clone())).collect()
        };
        for (run, lease) in held {
            let renewed = self
                .world
                .store
                .renew(&lease, self.world.config.lease)
                .await;
            let mut st = self.world.lock();
            let (worker, message) = (st.runs[run].worker, st.runs[run].message);
            let name = self.world.m(message);
            match renewed {
                Ok(l) => {
                    st.held.insert(run, l);
                    st.say(format!("w{worker}: its lease of {name} is renewed"));
                }
                Err(e) => {
                    st.held.remove(&run);
                    st.say(format!("w{worker}: renewing {name} fails: {e}"));
                }
            }
        }
    }

    /// Take turns until every delivery is acknowledged; move the clock when rounds pass
    /// without progress.
    async fn drain(&mut self) {
        {
            self.world
                .lock()
                .say("drain: workers take turns until every delivery is acknowledged".to_owned());
        }
        let workers = self.tasks.len();
        let mut idle_rounds = 0;
        for _ in 0..MAX_DRAIN_ROUNDS {
            if self.halted() {
                return;
            }
            let (done, before) = {
                let st = self.world.lock();
                let done = st.queue.is_empty() && st.slots.iter().all(|s| s.idle());
                (done, st.progress)
            };
            if done {
                for w in 0..workers {
                    self.reap(w).await;
                }
                return;
            }
            for w in 0..workers {
                self.advance(w).await;
            }
            if self.world.lock().progress == before {
                idle_rounds += 1;
                if idle_rounds >= IDLE_ROUNDS_BEFORE_EXPIRE {
                    self.expire().await;
                    idle_rounds = 0;
                }
            } else {
                idle_rounds = 0;
            }
        }
        self.stuck.get_or_insert(format!(
            "the deliveries were not all acknowledged after {MAX_DRAIN_ROUNDS} rounds of the drain"
        ));
    }

    /// Whether the case cannot go on: a worker stuck, or a consumer that panicked.
    pub(crate) fn halted(&self) -> bool {
        self.stuck.is_some() || !self.world.lock().panics.is_empty()
    }

    /// End every task still running (a stuck or panicked case).
    pub(crate) fn abort(&mut self) {
        let mut st = self.world.lock();
        for w in 0..self.tasks.len() {
            st.slots[w].dead = true;
            self.world.kill_pending(&mut st, w);
            if let Some(t) = self.tasks[w].take() {
                t.abort();
            }
        }
    }
}

const STALL_S: u64 = STALL.as_secs();
