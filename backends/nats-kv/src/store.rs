//! [`NatsKvStore`]: the type, its constructors and accessors, and the one read-decide-write
//! step every operation is made of; its [`Storage`](dedup_core::backend::Storage)
//! implementation is in [`storage`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dedup_core::backend::transition::Write;
use dedup_core::{Error, Key, LeaseToken, Record, RecordState, Result, Timestamp};

use crate::NatsKvConfig;
use crate::clock::ServerClock;
use crate::decode;
use crate::error::backend;
use crate::held::Held;
use crate::messages::{Messages, Stored, Written};
use crate::schema::{self, Subjects};

mod storage;

/// How many times one operation reads again after a conflicting write before it gives up
/// with a retryable error. Each conflict means another client changed the key in between;
/// the next read sees that change, and most operations then answer without writing.
const MAX_CONFLICTS: usize = 64;

/// A [`DedupStore`](dedup_core::DedupStore) keeping one value per key in a NATS JetStream
/// key-value bucket: a claim of a fresh key is one create, every other write one update
/// conditional on the revision it read (compare-and-set).
///
/// Cheap to clone: clones share the connection and the clock's sample. See the crate docs
/// for the layout, time, expiry and what a cluster keeps through a node's loss.
///
/// # Examples
///
/// ```no_run
/// use dedup_core::{Claim, ClaimOptions, DedupStore, Key};
/// use dedup_nats_kv::{NatsKvConfig, NatsKvStore};
///
/// # async fn run() -> dedup_core::Result<()> {
/// let config = NatsKvConfig {
///     bucket: "billing".into(),
///     replicas: Some(3),
///     ..NatsKvConfig::default()
/// };
/// let servers = ["nats://n1:4222", "nats://n2:4222", "nats://n3:4222"].map(String::from);
/// let store = NatsKvStore::connect(&servers, config).await?;
/// let key = Key::new("billing", "order-17")?;
/// if let Claim::Acquired(lease) = store.claim(&key, &ClaimOptions::default()).await? {
///     // ... charge the card, passing lease.fence downstream ...
///     store.commit(&lease, Some(b"charged")).await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct NatsKvStore {
    messages: Messages,
    subjects: Subjects,
    config: Arc<NatsKvConfig>,
    server_clock: Arc<ServerClock>,
    /// The live leases this store handed out, for commits and renewals without a read.
    held: Arc<Held>,
}

impl fmt::Debug for NatsKvStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsKvStore")
            .field("config", &self.config)
            .finish()
    }
}

impl NatsKvStore {
    /// Connect to the servers (`nats://[user:password@]host:port`, any of a cluster's
    /// nodes) and open `config.bucket`, making it when missing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad configuration or an existing bucket that cannot
    /// hold the store (see [`NatsKvConfig::bucket`]); a retryable [`Error::Backend`] when
    /// no server answers within `connect_timeout`.
    pub async fn connect(servers: &[String], config: NatsKvConfig) -> Result<Self> {
        config.validate()?;
        let messages = crate::connect::open(servers, &config).await?;
        Ok(NatsKvStore {
            messages,
            subjects: Subjects::new(&config.bucket, &config.prefix),
            config: Arc::new(config),
            server_clock: Arc::default(),
            held: Arc::default(),
        })
    }

    /// The configuration this store was opened with.
    pub fn config(&self) -> &NatsKvConfig {
        &self.config
    }

    /// The subject holding `key`'s record (see the crate docs, "Layout"). For operators
    /// and tests; never write to it yourself.
    pub fn subject(&self, key: &Key) -> String {
        self.subjects.record(key)
    }

    pub(crate) fn messages(&self) -> &Messages {
        &self.messages
    }

    pub(crate) fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// The store's "now": the injected clock's, or the server's.
    pub(crate) async fn now(&self) -> Result<Timestamp> {
        match &self.config.clock {
            Some(clock) => Ok(clock.now()),
            None => self.server_clock.now(&self.messages).await,
        }
    }

    /// What `subject` holds, as `key`'s record: the revision (0 when the subject holds
    /// nothing) and the record (`None` when absent or a tombstone).
    pub(crate) async fn read(&self, key: &Key) -> Result<(u64, Option<Record>)> {
        let stored = self.messages.read(&self.subjects.record(key)).await?;
        Ok(match stored {
            None => (0, None),
            Some(s) => (s.revision, self.record_of(key, &s)?),
        })
    }

    /// The record a stored message holds for `key`.
    pub(crate) fn record_of(&self, key: &Key, stored: &Stored) -> Result<Option<Record>> {
        stored
            .value
            .as_ref()
            .map(|v| decode::record(key, v))
            .transpose()
    }

    /// How long the server keeps `record` once written at `now`: the retention after its
    /// lease expires (in flight) or after now (completed).
    fn ttl(&self, record: &Record, now: Timestamp) -> Duration {
        let until = match &record.state {
            RecordState::InFlight { expires_at, .. } => expires_at.since(now),
            RecordState::Completed { .. } => Duration::ZERO,
        };
        until.saturating_add(self.config.retention)
    }

    /// Write `record` if `key` is still at `revision`.
    pub(crate) async fn put(
        &self,
        key: &Key,
        record: &Record,
        revision: u64,
        now: Timestamp,
    ) -> Result<Written> {
        let value = schema::encode(record);
        let ttl = self.ttl(record, now);
        let subject = self.subjects.record(key);
        let written = self
            .messages
            .write(&subject, value, revision, Some(ttl))
            .await?;
        match written {
            Written::Done(at) => self.held.wrote(&subject, at, record, now),
            Written::Conflict => self.held.forget(&subject),
        }
        Ok(written)
    }

    /// [`apply`](Self::apply) for the holder of the lease with `token`: when this store
    /// wrote that lease's record, `decide` first runs on the record as written, and its
    /// write is conditional on that revision (one round trip). Anything else (the key was
    /// written since, or `decide` writes nothing) goes through `apply`.
    pub(crate) async fn apply_held<T>(
        &self,
        key: &Key,
        token: LeaseToken,
        mut decide: impl FnMut(Option<&Record>, Timestamp) -> Result<(T, Write)> + Send,
    ) -> Result<T> {
        if let Some((revision, record)) = self.held.get(&self.subjects.record(key), token) {
            let now = self.now().await?;
            if let Ok((answer, Write::Put(new))) = decide(Some(&record), now)
                && let Written::Done(_) = self.put(key, &new, revision, now).await?
            {
                return Ok(answer);
            }
        }
        self.apply(key, decide).await
    }

    /// One operation on `key`: read its record, let `decide` say the answer and what to
    /// write at the store's "now", and write it on the revision read. A conflicting write
    /// (the key changed in between) starts again from the read, so the answer always
    /// comes from the record the write replaced.
    pub(crate) async fn apply<T>(
        &self,
        key: &Key,
        mut decide: impl FnMut(Option<&Record>, Timestamp) -> Result<(T, Write)> + Send,
    ) -> Result<T> {
        for _ in 0..MAX_CONFLICTS {
            let (revision, record) = self.read(key).await?;
            let now = self.now().await?;
            let (answer, write) = decide(record.as_ref(), now)?;
            let Write::Put(new) = write else {
                return Ok(answer);
            };
            if let Written::Done(_) = self.put(key, &new, revision, now).await? {
                return Ok(answer);
            }
        }
        Err(too_contended(key))
    }
}

/// The error when an operation lost [`MAX_CONFLICTS`] races in a row.
pub(crate) fn too_contended(key: &Key) -> Error {
    backend(
        true,
        std::io::Error::other(format!(
            "{key}: the key changed under {MAX_CONFLICTS} writes in a row"
        )),
    )
    .during(BACKEND_OPERATION)
}

/// What [`too_contended`] names as the operation.
const BACKEND_OPERATION: &str = "writing a record";
