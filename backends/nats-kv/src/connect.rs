//! Connecting: the client over the listed servers, the JetStream context, and the bucket's
//! stream, made when missing and checked when it exists.
//!
//! A bucket this store makes is a key-value bucket the `nats kv` tools read: the stream
//! `KV_<bucket>` over `$KV.<bucket>.>`, one value per key, per-message TTLs allowed, and
//! deletes allowed (a removal deletes one message by its sequence).

use std::time::Duration;

use async_nats::jetstream::stream::{Config as StreamConfig, DiscardPolicy, Stream};
use async_nats::jetstream::{self, Context};
use async_nats::{ConnectOptions, ServerAddr};
use dedup_core::{Error, Result};

use crate::NatsKvConfig;
use crate::error::{backend, transport};
use crate::messages::Messages;

/// How often the client pings its server.
const PING_EVERY: Duration = Duration::from_secs(2);

/// Connect to `servers` (any of a cluster's nodes; the rest is discovered) and open the
/// configured bucket.
pub(crate) async fn open(servers: &[String], config: &NatsKvConfig) -> Result<Messages> {
    let addrs = servers
        .iter()
        .map(|s| s.parse::<ServerAddr>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::invalid("server", format!("{e}")))?;
    if addrs.is_empty() {
        return Err(Error::invalid("server", "no server given"));
    }
    let connecting = ConnectOptions::new()
        // A server that stops answering (lost, or cut off) is left for another after two
        // unanswered pings: seconds, not the client's default of minutes.
        .ping_interval(PING_EVERY)
        .connection_timeout(config.connect_timeout)
        .request_timeout(Some(config.request_timeout))
        .connect(addrs);
    let client = tokio::time::timeout(config.connect_timeout, connecting)
        .await
        .map_err(|e| transport(e).during("connecting"))?
        .map_err(|e| transport(e).during("connecting"))?;
    let mut js = jetstream::new(client);
    js.set_timeout(config.request_timeout);
    let name = format!("KV_{}", config.bucket);
    let stream = bucket(&js, &name, config)
        .await
        .map_err(|e| e.during("opening the bucket"))?;
    Ok(Messages::new(js, stream, name))
}

/// The stream of the bucket: made when missing, checked when it exists.
async fn bucket(js: &Context, name: &str, config: &NatsKvConfig) -> Result<Stream> {
    let wanted = StreamConfig {
        name: name.to_owned(),
        subjects: vec![format!("$KV.{}.>", config.bucket)],
        max_messages_per_subject: 1,
        discard: DiscardPolicy::New,
        num_replicas: config.replicas.unwrap_or(1),
        allow_rollup: true,
        deny_delete: false,
        allow_direct: true,
        allow_message_ttl: true,
        ..StreamConfig::default()
    };
    let stream = js
        .get_or_create_stream(wanted)
        .await
        .map_err(|e| backend(true, e))?;
    let found = &stream.cached_info().config;
    let refuse = |reason: String| {
        Err(Error::invalid(
            "bucket",
            format!("{} {reason}", config.bucket),
        ))
    };
    if found.max_messages_per_subject != 1 {
        return refuse(format!(
            "keeps {} values per key; the store needs exactly one (history 1)",
            found.max_messages_per_subject
        ));
    }
    if !found.allow_message_ttl {
        return refuse("does not allow per-message TTLs (allow_msg_ttl)".into());
    }
    if found.deny_delete {
        return refuse("denies deletes; the store removes records by sequence".into());
    }
    if let Some(asked) = config.replicas.filter(|n| *n != found.num_replicas) {
        return refuse(format!(
            "has {} replicas; the store was asked for {asked}",
            found.num_replicas
        ));
    }
    Ok(stream)
}
