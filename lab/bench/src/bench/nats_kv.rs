//! NATS JetStream KV (one server or a cluster): the store under key prefixes of its own in
//! the URL's bucket, and the raw baseline as the same key-value operations, on a client of
//! its own with the store's connection settings: async-nats's key-value `create` with a
//! TTL (a publish expecting no message on the key), then the update `update` publishes
//! (expecting the revision the create made), with the TTL too, as the store's commit has.
//! A duplicate is a create that fails.
//!
//! The rows are named by the bucket's replicas: `nats-kv` (R1) and `nats-kv-r3` (R3, on a
//! 3-node cluster). At the end, the run's keys are purged from the bucket, one purge per
//! prefix. A run that dies leaves them to expire by their TTL ([`RETENTION`]; the purge
//! store's after a day).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::kv::{CreateErrorKind, Store as Kv};
use async_nats::jetstream::stream::{Info, Stream};
use async_nats::{ConnectOptions, ServerAddr};
use dedup_core::{Clock, ManualClock};
use dedup_nats_kv::{NatsKvConfig, NatsKvStore, NatsKvTarget};
use futures::FutureExt;
use futures::future::{BoxFuture, try_join_all};

use super::target::{Raw, Target};
use super::{Bench, NOT_SHARED, Names, Result, token};

/// How long the bench's keys live: the store's retention and the raw creates' TTL.
const RETENTION: Duration = Duration::from_secs(600);

/// The purge store's retention: longer than the time its manual clock jumps ahead, so
/// the prefilled records are still there (by that clock) when purge runs.
const PURGE_STORE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How often the raw client pings its server: the store's setting.
const PING_EVERY: Duration = Duration::from_secs(2);

/// The NATS KV bench (one server or a cluster), chosen by the store URL's descriptor.
pub(crate) static BENCH: Bench = Bench {
    descriptor: &dedup_nats_kv::DESCRIPTOR,
    settings: false,
    open: |target, _, names, _| {
        async move {
            let target = target.downcast::<NatsKvTarget>().map_err(|_| NOT_SHARED)?;
            open(&target, names).await
        }
        .boxed()
    },
    temporary: None,
};

/// A key prefix of this run (one token: letters, digits, `-`).
fn prefix(names: &Names, part: &str) -> String {
    format!("bench-{}-{part}", names.run)
}

/// The row name of a bucket with `replicas` replicas.
fn backend(replicas: usize) -> &'static str {
    match replicas {
        1 => "nats-kv",
        2 => "nats-kv-r2",
        3 => "nats-kv-r3",
        4 => "nats-kv-r4",
        _ => "nats-kv-r5",
    }
}

/// Connect the store, the purge store and the baseline to the target's servers.
pub(crate) async fn open(target: &NatsKvTarget, names: &Names) -> Result<Target> {
    let config = NatsKvConfig {
        prefix: prefix(names, "lib"),
        retention: RETENTION,
        ..target.config.clone()
    };
    // The store makes the bucket when missing, so it opens first.
    let store = NatsKvStore::connect(&target.servers, config.clone()).await?;
    let clock = Arc::new(ManualClock::starting_now());
    let purge_store = NatsKvStore::connect(
        &target.servers,
        NatsKvConfig {
            prefix: prefix(names, "purge"),
            retention: PURGE_STORE_RETENTION,
            clock: Some(Arc::clone(&clock) as Arc<dyn Clock>),
            ..config.clone()
        },
    )
    .await?;
    let addrs = target
        .servers
        .iter()
        .map(|s| s.parse::<ServerAddr>())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let client = ConnectOptions::new()
        .ping_interval(PING_EVERY)
        .connection_timeout(config.connect_timeout)
        .request_timeout(Some(config.request_timeout))
        .connect(addrs)
        .await?;
    let mut js = jetstream::new(client.clone());
    js.set_timeout(config.request_timeout);
    let (stream, info) = answering(&js, &format!("KV_{}", config.bucket)).await?;
    let kv = js.get_key_value(config.bucket.as_str()).await?;
    let replicas = info.config.num_replicas;
    let server = client.server_info();
    let setup = format!(
        "nats-server {}, {} server URL(s); bucket {} R{replicas}{}; one client each (store, \
         raw: async-nats key-value create, then the update with the TTL)",
        server.version,
        target.servers.len(),
        config.bucket,
        info.cluster
            .as_ref()
            .and_then(|c| c.leader.as_ref())
            .map(|l| format!(", stream leader {l}"))
            .unwrap_or_default(),
    );
    let subjects = ["lib", "purge", "raw"]
        .iter()
        .map(|part| format!("$KV.{}.{}.>", config.bucket, prefix(names, part)))
        .collect();
    let raw = NatsKvRaw {
        inner: Arc::new(Inner {
            kv,
            js,
            subject: format!("$KV.{}.", config.bucket),
            stream,
            prefix: prefix(names, "raw"),
            subjects,
        }),
    };
    Ok(Target {
        backend: backend(replicas),
        store: Arc::new(store),
        purge_store: Arc::new(purge_store),
        clock,
        raw: Arc::new(raw),
        tx: None,
        setup,
    })
}

/// How long a bucket just made may take to elect its stream's leader (seen up to about
/// 20 seconds on a fresh 3-node cluster under load).
const LEADER_WAIT: Duration = Duration::from_secs(40);

/// The bucket's stream once it has a leader, and its info: a fresh bucket's first calls
/// would otherwise time out, in the warm-up or the measure.
async fn answering(js: &jetstream::Context, name: &str) -> Result<(Stream, Info)> {
    let start = std::time::Instant::now();
    loop {
        let found = async {
            let mut stream = js.get_stream(name).await?;
            let info = stream.info().await?.clone();
            Ok::<_, super::BoxError>((stream, info))
        }
        .await;
        match found {
            Ok((stream, info))
                if info.config.num_replicas == 1
                    || info.cluster.as_ref().is_some_and(|c| c.leader.is_some()) =>
            {
                return Ok((stream, info));
            }
            Err(e) if start.elapsed() > LEADER_WAIT => return Err(e),
            Ok(_) if start.elapsed() > LEADER_WAIT => {
                return Err(format!("stream {name}: no leader after {LEADER_WAIT:?}").into());
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// The URL of a `nats-kv://` store through `proxy` (`host:port`): its first server
/// replaced by the proxy, the others left out, the query kept. `None` for another URL.
pub(crate) fn through(url: &str, proxy: &str) -> Option<String> {
    let rest = url.strip_prefix("nats-kv://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    Some(format!("nats-kv://{proxy}{}", &rest[end..]))
}

/// The `host:port` of the first server of a `nats-kv://` URL.
pub(crate) fn first_server(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("nats-kv://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let first = rest[..end].split(',').next()?;
    Some(first.rsplit_once('@').map_or(first, |(_, a)| a))
}

/// The raw baseline.
struct NatsKvRaw {
    inner: Arc<Inner>,
}

struct Inner {
    kv: Kv,
    js: jetstream::Context,
    /// `$KV.<bucket>.`: a key's subject is this and the key.
    subject: String,
    stream: Stream,
    prefix: String,
    /// The subjects of every key this run wrote (purged at cleanup).
    subjects: Vec<String>,
}

impl Inner {
    fn key(&self, consumer: &str, message_id: &str) -> String {
        format!("{}.{consumer}.{message_id}", self.prefix)
    }

    /// The claim: a create with the retention as TTL. `Some(revision)` when it made the
    /// key, `None` when the key exists.
    async fn create(&self, key: &str, token: &str) -> Result<Option<u64>> {
        let value = format!("i:{token}").into();
        match self.kv.create_with_ttl(key, value, RETENTION).await {
            Ok(revision) => Ok(Some(revision)),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The commit: an update expecting the create's revision, with the TTL (what
    /// `Store::update` publishes, which takes no TTL, and the header `create_with_ttl`
    /// adds). Refused, it does what the store does on a conflict: reads the key and writes
    /// on the revision read while the key still holds this claim. A loaded 3-node stream
    /// was seen refusing the revision its create had just been acknowledged with ("wrong
    /// last sequence", 10164).
    async fn update(&self, key: &str, token: &str, revision: u64) -> Result<()> {
        let (claimed, committed) = (format!("i:{token}"), format!("c:{token}"));
        let mut revision = revision;
        for _ in 0..UPDATE_TRIES {
            let refused = match self.publish_update(key, token, revision).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            match self.kv.entry(key).await? {
                Some(entry) if entry.value == claimed.as_bytes() => revision = entry.revision,
                Some(entry) if entry.value == committed.as_bytes() => return Ok(()),
                _ => return Err(refused),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(format!("raw update of {key}: refused {UPDATE_TRIES} times").into())
    }

    async fn publish_update(&self, key: &str, token: &str, revision: u64) -> Result<()> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            revision.to_string().as_str(),
        );
        headers.insert(
            async_nats::header::NATS_MESSAGE_TTL,
            RETENTION.as_secs().to_string().as_str(),
        );
        self.js
            .publish_with_headers(
                format!("{}{key}", self.subject),
                headers,
                format!("c:{token}").into(),
            )
            .await?
            .await?;
        Ok(())
    }
}

/// How many times the raw update is tried before the bench reports it failed.
const UPDATE_TRIES: usize = 10;

impl Raw for NatsKvRaw {
    fn claim_commit(
        &self,
        _worker: usize,
        consumer: Arc<str>,
        message_id: String,
    ) -> BoxFuture<'static, Result<bool>> {
        let inner = Arc::clone(&self.inner);
        async move {
            let key = inner.key(&consumer, &message_id);
            let token = token();
            let Some(revision) = inner.create(&key, &token).await? else {
                return Ok(false);
            };
            inner.update(&key, &token, revision).await?;
            Ok(true)
        }
        .boxed()
    }

    fn batch(
        &self,
        _worker: usize,
        consumer: Arc<str>,
        message_ids: Vec<String>,
    ) -> BoxFuture<'static, Result<()>> {
        // As the store runs a batch: every item at once over the one connection.
        let inner = Arc::clone(&self.inner);
        async move {
            let keys: Vec<(String, String)> = message_ids
                .iter()
                .map(|id| (inner.key(&consumer, id), token()))
                .collect();
            let inner = &inner;
            let revisions: Vec<u64> = try_join_all(keys.iter().map(|(key, token)| async move {
                match inner.create(key, token).await? {
                    Some(revision) => Ok::<u64, super::BoxError>(revision),
                    None => Err(format!("raw create of fresh key {key}: it exists").into()),
                }
            }))
            .await?;
            try_join_all(
                keys.iter()
                    .zip(revisions)
                    .map(|((key, token), revision)| inner.update(key, token, revision)),
            )
            .await?;
            Ok(())
        }
        .boxed()
    }

    fn cleanup(&self) -> BoxFuture<'static, Result<()>> {
        let inner = Arc::clone(&self.inner);
        async move {
            for subject in &inner.subjects {
                inner.stream.purge().filter(subject.as_str()).await?;
            }
            Ok(())
        }
        .boxed()
    }
}
