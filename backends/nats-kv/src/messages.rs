//! The bucket's stream, message by message: the only place that speaks to the server.
//!
//! Every read goes to the stream leader (`$JS.API.STREAM.MSG.GET`, never a direct get,
//! which any replica may answer with a stale value). Every write is one publish whose
//! `Nats-Expected-Last-Subject-Sequence` is the revision the decision was made on, so a
//! write on a changed key is refused ([`Written::Conflict`]) and nothing is written. A
//! removal deletes one message by its sequence, which fails when the key was written since.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{Context, PublishError, PublishErrorKind};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::response::Response;
use async_nats::jetstream::stream::{
    DeleteMessageErrorKind, LastRawMessageErrorKind, RawMessageErrorKind, Stream,
};
use bytes::Bytes;
use dedup_core::{Result, Timestamp};

use crate::error::{api, backend, publish, transport, unreadable};

/// `KV-Operation` values that mark a key deleted (a tombstone, not a value).
const TOMBSTONES: [&str; 2] = ["DEL", "PURGE"];

/// The codes of a delete whose message is gone already.
const GONE: [ErrorCode; 2] = [ErrorCode(10043), ErrorCode(10057)];

/// What a subject holds.
#[derive(Debug)]
pub(crate) struct Stored {
    /// The message's sequence: the key's revision, the condition of the next write.
    pub(crate) revision: u64,
    /// The value; `None` for a tombstone (the key is absent).
    pub(crate) value: Option<Bytes>,
    /// The subject (for scans over a filter).
    pub(crate) subject: String,
}

/// What a conditional write did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Written {
    /// Written, at this revision.
    Done(u64),
    /// The key changed since the revision given: nothing written.
    Conflict,
}

/// One bucket's stream and the JetStream context that reaches it.
#[derive(Clone, Debug)]
pub(crate) struct Messages {
    js: Context,
    stream: Stream,
    stream_name: String,
}

impl Messages {
    pub(crate) fn new(js: Context, stream: Stream, stream_name: String) -> Self {
        Messages {
            js,
            stream,
            stream_name,
        }
    }

    /// The latest message on `subject`; `None` when it has none.
    pub(crate) async fn read(&self, subject: &str) -> Result<Option<Stored>> {
        match self.stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => Ok(Some(stored(message))),
            Err(e) => match e.kind() {
                LastRawMessageErrorKind::NoMessageFound => Ok(None),
                LastRawMessageErrorKind::JetStream(inner) => Err(api(inner)),
                _ => Err(transport(e)),
            },
        }
    }

    /// The first message at or after sequence `from` on a subject matching `filter`.
    pub(crate) async fn next(&self, filter: &str, from: u64) -> Result<Option<Stored>> {
        let request = self
            .stream
            .raw_message_builder()
            .sequence(from.max(1))
            .next_by_subject(filter);
        match request.send().await {
            Ok(message) => Ok(Some(stored(message))),
            Err(e) => match e.kind() {
                RawMessageErrorKind::NoMessageFound => Ok(None),
                RawMessageErrorKind::JetStream(inner) => Err(api(inner)),
                _ => Err(transport(e)),
            },
        }
    }

    /// Write `value` on `subject` if the subject's last revision is still `revision` (0:
    /// the subject holds no message), to expire after `ttl` by the server's clock (none:
    /// never).
    pub(crate) async fn write(
        &self,
        subject: &str,
        value: Vec<u8>,
        revision: u64,
        ttl: Option<Duration>,
    ) -> Result<Written> {
        let mut headers = HeaderMap::new();
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence",
            revision.to_string().as_str(),
        );
        if let Some(ttl) = ttl {
            headers.insert("Nats-TTL", ttl_header(ttl).as_str());
        }
        let ack = self
            .js
            .publish_with_headers(subject.to_owned(), headers, Bytes::from(value))
            .await
            .map_err(publish)?;
        match ack.await {
            Ok(ack) => Ok(Written::Done(ack.sequence)),
            Err(e) if is_conflict(&e) => Ok(Written::Conflict),
            Err(e) => Err(publish(e)),
        }
    }

    /// Write `value` on `subject` whatever it held, never to expire.
    pub(crate) async fn overwrite(&self, subject: &str, value: Vec<u8>) -> Result<()> {
        let ack = self
            .js
            .publish(subject.to_owned(), Bytes::from(value))
            .await
            .map_err(publish)?;
        ack.await.map_err(publish)?;
        Ok(())
    }

    /// Remove the message at `revision`: `false` when it is gone (replaced by a later write
    /// of its key, or removed already), and nothing is removed.
    pub(crate) async fn remove(&self, revision: u64) -> Result<bool> {
        match self.stream.delete_message(revision).await {
            Ok(done) => Ok(done),
            Err(e) => match e.kind() {
                // "sequence not found", "no message found": the revision is gone.
                DeleteMessageErrorKind::JetStream(inner) if GONE.contains(&inner.error_code()) => {
                    Ok(false)
                }
                DeleteMessageErrorKind::JetStream(inner) => Err(api(inner)),
                _ => Err(transport(e)),
            },
        }
    }

    /// The stream leader's clock now (the `ts` of a stream info answer).
    pub(crate) async fn server_time(&self) -> Result<Timestamp> {
        #[derive(serde::Deserialize)]
        struct Info {
            ts: String,
        }
        let info: Info = self.stream_info().await?;
        let at =
            time::OffsetDateTime::parse(&info.ts, &time::format_description::well_known::Rfc3339)
                .map_err(|e| backend(false, e))?;
        let ms = at.unix_timestamp_nanos() / 1_000_000;
        i64::try_from(ms)
            .map(Timestamp::from_millis)
            .map_err(|_| unreadable("server time"))
    }

    /// The sequence of the stream's last message now (its state's `last_seq`; 0 when it
    /// never had one).
    pub(crate) async fn last_sequence(&self) -> Result<u64> {
        #[derive(serde::Deserialize)]
        struct State {
            last_seq: u64,
        }
        #[derive(serde::Deserialize)]
        struct Info {
            state: State,
        }
        let info: Info = self.stream_info().await?;
        Ok(info.state.last_seq)
    }

    /// The fields of a stream info answer that `T` names.
    async fn stream_info<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        let subject = format!("STREAM.INFO.{}", self.stream_name);
        let answer: Response<T> = self
            .js
            .request(subject, &serde_json::json!({}))
            .await
            .map_err(transport)?;
        match answer {
            Response::Ok(info) => Ok(info),
            Response::Err { error } => Err(api(error)),
        }
    }
}

/// A stream message as what its subject holds.
fn stored(message: StreamMessage) -> Stored {
    let tombstone = message
        .headers
        .get("KV-Operation")
        .is_some_and(|op| TOMBSTONES.contains(&op.as_str()));
    Stored {
        revision: message.sequence,
        value: (!tombstone).then_some(message.payload),
        subject: message.subject.to_string(),
    }
}

/// Whether a publish was refused because its subject's last sequence was not the expected
/// one. async-nats names the code 10071 so; a clustered stream answers 10164 ("wrong last
/// sequence" too), which it reports as `Other` with the API error as source.
fn is_conflict(e: &PublishError) -> bool {
    const WRONG_LAST_SEQUENCE: [ErrorCode; 2] = [ErrorCode(10071), ErrorCode(10164)];
    e.kind() == PublishErrorKind::WrongLastSequence
        || std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>())
            .is_some_and(|api| WRONG_LAST_SEQUENCE.contains(&api.error_code()))
}

/// `Nats-TTL` for `ttl`: whole seconds, rounded up, at least one (the server's unit).
fn ttl_header(ttl: Duration) -> String {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    format!("{}s", secs.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_are_whole_seconds_rounded_up() {
        assert_eq!(ttl_header(Duration::ZERO), "1s");
        assert_eq!(ttl_header(Duration::from_millis(1)), "1s");
        assert_eq!(ttl_header(Duration::from_millis(1001)), "2s");
        assert_eq!(ttl_header(Duration::from_secs(60)), "60s");
    }
}
