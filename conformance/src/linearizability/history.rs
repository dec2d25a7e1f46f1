//! Recording concurrent histories: [`Recorder`] wraps any store and logs every call with
//! its invocation and response instants and its answer.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, Clock, CommitRequest, DedupStore, Error,
    ItemResult, Key, Lease, PurgeOptions, PurgeReport, Record, Result, Timestamp,
};

/// One call made on the store, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// `claim(key, options)`.
    Claim {
        /// The key.
        key: Key,
        /// The options.
        options: ClaimOptions,
    },
    /// `commit(lease, outcome)`.
    Commit {
        /// The lease.
        lease: Lease,
        /// The outcome.
        outcome: Option<Vec<u8>>,
    },
    /// `renew(lease, extend_by)`.
    Renew {
        /// The lease.
        lease: Lease,
        /// The extension.
        extend_by: Duration,
    },
    /// `release(lease)`.
    Release {
        /// The lease.
        lease: Lease,
    },
    /// `get(key)`.
    Get {
        /// The key.
        key: Key,
    },
}

impl Call {
    /// The key the call acts on (histories are checked key by key).
    pub fn key(&self) -> &Key {
        match self {
            Call::Claim { key, .. } | Call::Get { key } => key,
            Call::Commit { lease, .. } | Call::Renew { lease, .. } | Call::Release { lease } => {
                &lease.key
            }
        }
    }
}

/// What a call answered, with errors reduced to their kind (so answers compare with `==`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A claim's result.
    Claim(Claim),
    /// A renewed lease.
    Lease(Lease),
    /// `Ok(())` from commit or release.
    Done,
    /// What `get` returned.
    Record(Option<Record>),
    /// `Err(LeaseLost)`.
    LeaseLost,
    /// `Err(FingerprintMismatch)`.
    FingerprintMismatch,
    /// `Err(InvalidInput)`.
    InvalidInput,
    /// Any other error (a backend failure): the call's effect is unknown, and the checker
    /// refuses such histories (see the module docs).
    Failed(String),
}

impl Answer {
    /// The answer of a call that returned `result`, `ok` mapping its success value.
    pub fn of<T>(result: &Result<T>, ok: impl FnOnce(&T) -> Answer) -> Answer {
        match result {
            Ok(value) => ok(value),
            Err(e) => Answer::error(e),
        }
    }

    /// The answer of a call that failed with `e`.
    pub fn error(e: &Error) -> Answer {
        match e {
            Error::LeaseLost { .. } => Answer::LeaseLost,
            Error::FingerprintMismatch { .. } => Answer::FingerprintMismatch,
            Error::InvalidInput { .. } => Answer::InvalidInput,
            other => Answer::Failed(format!("{other}")),
        }
    }
}

/// One completed call: who made it, when (invocation and response), and what it answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    /// The recording task (see [`Recorder::for_task`]).
    pub task: usize,
    /// The call.
    pub call: Call,
    /// Its answer.
    pub answer: Answer,
    /// When it was invoked, since the recording started (monotonic clock).
    pub invoked: Duration,
    /// When it returned, since the recording started (monotonic clock).
    pub returned: Duration,
    /// The recorder's clock (the store's clock, or the same wall clock the server reads)
    /// just before the call and just after it: the store's "now" for this call lies in
    /// between.
    pub clock_window: (Timestamp, Timestamp),
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        write!(
            f,
            "[{:>9.3} .. {:>9.3} ms] task {:>2}  ",
            ms(self.invoked),
            ms(self.returned),
            self.task
        )?;
        let base = self.clock_window.0;
        let at = |t: Timestamp| t.as_millis() - base.as_millis();
        match &self.call {
            Call::Claim { options, .. } => write!(f, "claim(lease {:?})", options.lease)?,
            Call::Commit { lease, outcome } => write!(
                f,
                "commit(fence {}, token {}, outcome {:?})",
                lease.fence,
                short(lease),
                outcome.as_deref().map(String::from_utf8_lossy)
            )?,
            Call::Renew { lease, extend_by } => write!(
                f,
                "renew(fence {}, token {}, by {extend_by:?})",
                lease.fence,
                short(lease)
            )?,
            Call::Release { lease } => {
                write!(f, "release(fence {}, token {})", lease.fence, short(lease))?
            }
            Call::Get { .. } => write!(f, "get()")?,
        }
        write!(f, " -> ")?;
        match &self.answer {
            Answer::Claim(Claim::Acquired(lease)) | Answer::Lease(lease) => write!(
                f,
                "lease(fence {}, attempt {}, token {}, expires now{:+}ms)",
                lease.fence,
                lease.attempt,
                short(lease),
                at(lease.expires_at)
            ),
            Answer::Claim(Claim::InFlight {
                expires_at,
                attempt,
            }) => write!(
                f,
                "InFlight(attempt {attempt}, expires now{:+}ms)",
                at(*expires_at)
            ),
            Answer::Claim(Claim::Completed {
                processed_at,
                outcome,
            }) => write!(
                f,
                "Completed(at now{:+}ms, outcome {:?})",
                at(*processed_at),
                outcome.as_deref().map(String::from_utf8_lossy)
            ),
            other => write!(f, "{other:?}"),
        }
    }
}

fn short(lease: &Lease) -> String {
    lease.token.to_string()[..8].to_owned()
}

/// A recorded concurrent history: every completed call, in the order they returned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// The calls.
    pub operations: Vec<Operation>,
}

struct Log {
    started: Instant,
    clock: Arc<dyn Clock>,
    operations: Mutex<Vec<Operation>>,
}

/// Wraps a store and records every single-key call made through it (from any number of
/// tasks) into one [`History`].
///
/// `clock` stamps each call's window: give the store's own clock (an injected one), or
/// [`SystemClock`](dedup_core::SystemClock) for a store that reads its server's clock on
/// this machine. Batches and purge span keys and are refused with
/// [`Error::Unsupported`]: a history must never miss a write.
pub struct Recorder<S> {
    store: S,
    task: usize,
    log: Arc<Log>,
}

impl<S: DedupStore> Recorder<S> {
    /// Start recording calls made on `store`, stamped with `clock`.
    pub fn new(store: S, clock: Arc<dyn Clock>) -> Self {
        Recorder {
            store,
            task: 0,
            log: Arc::new(Log {
                started: Instant::now(),
                clock,
                operations: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A recorder on `store` (another handle on the same records, or the same one) that
    /// logs into this recorder's history under task number `task`.
    pub fn for_task<T: DedupStore>(&self, store: T, task: usize) -> Recorder<T> {
        Recorder {
            store,
            task,
            log: self.log.clone(),
        }
    }

    /// The calls recorded so far (by every recorder sharing this one's log).
    pub fn history(&self) -> History {
        History {
            operations: self
                .log
                .operations
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    async fn record<T>(
        &self,
        call: Call,
        answer: impl FnOnce(&T) -> Answer,
        run: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let before = self.log.clock.now();
        let invoked = self.log.started.elapsed();
        let result = run.await;
        let returned = self.log.started.elapsed();
        let after = self.log.clock.now();
        let operation = Operation {
            task: self.task,
            call,
            answer: Answer::of(&result, answer),
            invoked,
            returned,
            clock_window: (before, after),
        };
        self.log
            .operations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(operation);
        result
    }
}

#[async_trait]
impl<S: DedupStore> DedupStore for Recorder<S> {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        let call = Call::Claim {
            key: key.clone(),
            options: options.clone(),
        };
        let run = self.store.claim(key, options);
        self.record(call, |c| Answer::Claim(c.clone()), run).await
    }

    async fn claim_many(&self, _: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        Err(Error::Unsupported("batches are not recorded"))
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        let call = Call::Renew {
            lease: lease.clone(),
            extend_by,
        };
        let run = self.store.renew(lease, extend_by);
        self.record(call, |l| Answer::Lease(l.clone()), run).await
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        let call = Call::Commit {
            lease: lease.clone(),
            outcome: outcome.map(<[u8]>::to_vec),
        };
        let run = self.store.commit(lease, outcome);
        self.record(call, |()| Answer::Done, run).await
    }

    async fn commit_many(&self, _: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        Err(Error::Unsupported("batches are not recorded"))
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let call = Call::Release {
            lease: lease.clone(),
        };
        let run = self.store.release(lease);
        self.record(call, |()| Answer::Done, run).await
    }

    async fn release_failed(&self, _: &Lease, _: &dedup_core::Failure) -> Result<()> {
        Err(Error::Unsupported("failures are not recorded"))
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let call = Call::Get { key: key.clone() };
        let run = self.store.get(key);
        self.record(call, |r| Answer::Record(r.clone()), run).await
    }

    async fn purge(&self, _: &PurgeOptions) -> Result<PurgeReport> {
        Err(Error::Unsupported("purge is not recorded"))
    }

    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
}
