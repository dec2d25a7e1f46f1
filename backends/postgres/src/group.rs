//! Group commit: concurrent single claims of one store run as one statement per round, and
//! so do concurrent single commits (see [`GroupCommit`](crate::GroupCommit)).
//!
//! A caller queues its request and then waits for a *round* (one of
//! [`GroupCommit::rounds`](crate::GroupCommit::rounds) permits). Whoever gets a permit
//! while its own request is still queued takes every request queued so far (up to
//! [`GroupCommit::max_requests`](crate::GroupCommit::max_requests), oldest first) and runs
//! them as one batch (the store's `claim_many` / `commit_many` path, so one statement for
//! distinct keys, and the rounds of [`crate::rounds`] for a key asked for twice, in queue
//! order). Each caller gets its own result once the statement holding its request
//! committed. A caller whose request another round took simply waits for its answer.
//!
//! - A lone caller finds a free permit and runs its request at once, alone, on the single
//!   statement: no wait, no extra work. It does not even queue it
//!   ([`Grouper::alone`]): nothing queued and a permit free, it holds the permit and runs.
//! - A group runs in a task of its own, so a caller that stops waiting (its future
//!   dropped) never stops the others' statement; a request whose caller stopped waiting
//!   before its round started is left out.
//! - A round that fails as a whole does not decide its members' results: every request it
//!   had not answered runs again alone (see `PostgresStore::claim_group` in `store/grouped.rs`).
//!
//! The queue knows nothing of the store: the caller passes the function that runs a group.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use dedup_core::{Error, Result};
use tokio::sync::{Semaphore, oneshot};

use crate::error::BACKEND;

/// A queued request and where its answer goes.
struct Waiting<Req, Out> {
    id: u64,
    req: Req,
    reply: oneshot::Sender<Result<Out>>,
}

/// One kind of request (claims, or commits) of one store, queued for rounds.
pub(crate) struct Grouper<Req, Out> {
    queued: Mutex<Queue<Req, Out>>,
    rounds: Arc<Semaphore>,
    max_requests: usize,
}

struct Queue<Req, Out> {
    next_id: u64,
    waiting: Vec<Waiting<Req, Out>>,
}

impl<Req, Out> Grouper<Req, Out>
where
    Req: Send + 'static,
    Out: Send + 'static,
{
    /// At most `rounds` rounds at once, each of at most `max_requests` requests (both at
    /// least 1).
    pub(crate) fn new(rounds: usize, max_requests: usize) -> Self {
        Grouper {
            queued: Mutex::new(Queue {
                next_id: 0,
                waiting: Vec::new(),
            }),
            rounds: Arc::new(Semaphore::new(rounds.max(1))),
            max_requests: max_requests.max(1),
        }
    }

    /// Queue `req` and return its result once the round holding it ran. `run` runs a
    /// group: it must return one result per request, in order (a missing one is reported
    /// to its caller as a lost write).
    pub(crate) async fn submit<Run, Fut>(&self, req: Req, run: Run) -> Result<Out>
    where
        Run: Fn(Vec<Req>) -> Fut,
        Fut: Future<Output = Vec<Result<Out>>> + Send + 'static,
    {
        let (reply, mut answer) = oneshot::channel();
        let id = self.push(req, reply);
        loop {
            tokio::select! {
                biased;
                done = &mut answer => return done.unwrap_or_else(|_| Err(lost())),
                permit = Arc::clone(&self.rounds).acquire_owned() => {
                    let Ok(permit) = permit else {
                        // Never closed; wait for the answer all the same.
                        return (&mut answer).await.unwrap_or_else(|_| Err(lost()));
                    };
                    let Some(group) = self.take(id) else {
                        // Another round took ours: its answer will come.
                        drop(permit);
                        return answer.await.unwrap_or_else(|_| Err(lost()));
                    };
                    let alone = matches!(&group[..], [only] if only.id == id);
                    let (reqs, replies): (Vec<Req>, Vec<_>) =
                        group.into_iter().map(|w| (w.req, w.reply)).unzip();
                    // Boxed, so moving it into `round` and `round` into a task or this
                    // future copies a pointer, not the whole group future.
                    let running = Box::pin(run(reqs));
                    let round = async move {
                        let results = running.await;
                        drop(permit);
                        for (reply, result) in replies.into_iter().zip(results) {
                            // A caller that stopped waiting gets nothing; its write stands.
                            let _ = reply.send(result);
                        }
                    };
                    if alone {
                        // Nobody else waits on it: run it here (no task to spawn).
                        round.await;
                    } else {
                        tokio::spawn(round);
                    }
                }
            }
        }
    }

    /// A round for one request alone, taken at once: when nothing is queued and a round is
    /// free, the caller runs its request itself while it holds the returned permit, as a
    /// lone [`submit`](Self::submit) would, without queueing it (no channel, no group to
    /// build). `None`: others wait or every round runs; [`submit`](Self::submit) then.
    pub(crate) fn alone(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let queue = self.queue();
        if !queue.waiting.is_empty() {
            return None;
        }
        self.rounds.try_acquire().ok()
    }

    fn push(&self, req: Req, reply: oneshot::Sender<Result<Out>>) -> u64 {
        let mut queue = self.queue();
        let id = queue.next_id;
        queue.next_id += 1;
        queue.waiting.push(Waiting { id, req, reply });
        id
    }

    /// The oldest queued requests (at most `max_requests`, leaving out those whose caller
    /// stopped waiting), or `None` when request `id` is no longer queued (a round took it).
    fn take(&self, id: u64) -> Option<Vec<Waiting<Req, Out>>> {
        let mut queue = self.queue();
        if !queue.waiting.iter().any(|w| w.id == id) {
            return None;
        }
        queue.waiting.retain(|w| !w.reply.is_closed());
        let n = queue.waiting.len().min(self.max_requests);
        Some(queue.waiting.drain(..n).collect())
    }

    /// Take a round permit (tests: hold every permit to make the callers queue).
    #[cfg(test)]
    pub(crate) async fn hold(&self) -> tokio::sync::OwnedSemaphorePermit {
        Arc::clone(&self.rounds)
            .acquire_owned()
            .await
            .expect("never closed")
    }

    /// Requests queued (tests).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queue().waiting.len()
    }

    fn queue(&self) -> MutexGuard<'_, Queue<Req, Out>> {
        // Only push and drain happen under this lock: a panic cannot leave it inconsistent.
        self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The answer of a request whose round ended without one (a panic in the round).
fn lost() -> Error {
    Error::backend(
        BACKEND,
        true,
        "the grouped statement holding this request ended without an answer",
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A caller runs alone, unqueued, only when nothing is queued and a round is free; it
    /// holds that round while it runs.
    #[tokio::test]
    async fn a_caller_runs_alone_only_when_nobody_waits_and_a_round_is_free() {
        let grouper = Grouper::<u32, u32>::new(2, 100);
        let first = grouper.alone().expect("nothing queued, two rounds free");
        let second = grouper.alone().expect("one round still free");
        assert!(grouper.alone().is_none(), "every round runs");
        drop((first, second));
        let (reply, _answer) = oneshot::channel();
        grouper.push(7, reply);
        assert!(grouper.alone().is_none(), "a request waits: it goes first");
        assert_eq!(grouper.take(0).map(|g| g.len()), Some(1));
        assert!(grouper.alone().is_some(), "the queue is empty again");
    }

    /// Requests queued while a round runs go together in the next round, each with its own
    /// answer; a caller that stops waiting is left out of the next round and does not stop
    /// it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_requests_run_together_and_a_cancelled_caller_is_left_out() {
        let grouper = Arc::new(Grouper::<u32, u32>::new(1, 100));
        let groups = Arc::new(Mutex::new(Vec::<Vec<u32>>::new()));
        let (release, released) = tokio::sync::watch::channel(false);
        let run = {
            let groups = Arc::clone(&groups);
            move |reqs: Vec<u32>| {
                let groups = Arc::clone(&groups);
                let mut released = released.clone();
                async move {
                    groups.lock().unwrap().push(reqs.clone());
                    // The first round waits until the others are queued.
                    let _ = released.wait_for(|r| *r).await;
                    reqs.into_iter().map(|r| Ok(r * 10)).collect()
                }
            }
        };
        let first = {
            let (g, run) = (Arc::clone(&grouper), run.clone());
            tokio::spawn(async move { g.submit(1, run).await })
        };
        while groups.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let later: Vec<_> = (2..=4)
            .map(|r| {
                let (g, run) = (Arc::clone(&grouper), run.clone());
                tokio::spawn(async move { g.submit(r, run).await })
            })
            .collect();
        let cancelled = {
            let (g, run) = (Arc::clone(&grouper), run.clone());
            tokio::spawn(async move { g.submit(5, run).await })
        };
        while grouper.queue().waiting.len() < 4 {
            tokio::task::yield_now().await;
        }
        cancelled.abort();
        let _ = cancelled.await;
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 10);
        for (task, r) in later.into_iter().zip(2..) {
            assert_eq!(task.await.unwrap().unwrap(), r * 10);
        }
        let mut groups = groups.lock().unwrap().clone();
        groups[1].sort_unstable();
        assert_eq!(groups, [vec![1], vec![2, 3, 4]]);
    }

    /// A caller whose round's leader stops waiting still gets its answer: the round runs
    /// in a task of its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_leader_does_not_stop_its_round() {
        let grouper = Arc::new(Grouper::<u32, u32>::new(1, 100));
        let started = Arc::new(AtomicUsize::new(0));
        let run = {
            let started = Arc::clone(&started);
            move |reqs: Vec<u32>| {
                let started = Arc::clone(&started);
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    reqs.into_iter().map(Ok).collect()
                }
            }
        };
        // Hold the only permit, queue two requests behind it.
        let permit = Arc::clone(&grouper.rounds).acquire_owned().await.unwrap();
        let leader = {
            let (g, run) = (Arc::clone(&grouper), run.clone());
            tokio::spawn(async move { g.submit(1, run).await })
        };
        // Queued, so already waiting for the permit: first in line (the semaphore is fair).
        while grouper.queue().waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        let member = {
            let (g, run) = (Arc::clone(&grouper), run.clone());
            tokio::spawn(async move { g.submit(2, run).await })
        };
        while grouper.queue().waiting.len() < 2 {
            tokio::task::yield_now().await;
        }
        drop(permit);
        while started.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // Both are in the running round: stop one of them.
        leader.abort();
        assert_eq!(member.await.unwrap().unwrap(), 2);
        assert_eq!(started.load(Ordering::SeqCst), 1);
    }
}
