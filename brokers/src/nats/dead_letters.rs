//! [`NatsDeadLetters`]: the messages of the stream capturing a dead-letter subject, read
//! back for a replay.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use async_nats::jetstream::Context;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{RawMessageErrorKind, Stream};
use async_trait::async_trait;

use super::errors::stream_lookup;
use super::pending::text_headers;
use super::publisher::{headers, send};
use super::{MSG_ID_HEADER, ORIGIN_HEADER};
use crate::BrokerError;
use crate::replay::{DeadLetter, DeadLetters};

/// [`NatsDeadLetters::duplicate_wait`] unless set.
const DEFAULT_DUPLICATE_WAIT: Duration = Duration::from_secs(150);

/// The dead letters of a [`NatsConsumer`](super::NatsConsumer): the messages of the
/// JetStream stream that captures its dead-letter subject.
///
/// - Take: the stream's messages by sequence, from a cursor, up to the last sequence there
///   was when the session first read. A copy dead-lettered again during a replay waits for
///   the next session.
/// - Origin: the copy's [`ORIGIN_HEADER`], the subject the consumer read the original
///   from. Copies dead-lettered before the header existed cannot be replayed.
/// - Republish: to the origin subject, with `Nats-Msg-Id` the message id, the payload and
///   the headers, less the failure headers, the reason and [`ORIGIN_HEADER`]. The stream's
///   ack is the confirm.
/// - Settle: the copy's message deleted by sequence.
/// - Give back: nothing to do, a stream holds no delivery.
///
/// JetStream drops a publish whose `Nats-Msg-Id` the stream saw within its duplicate window
/// (2 minutes by default), even when that message was consumed or deleted since: the
/// message's first publish, or a live redelivery racing the replay. The message id is
/// kept all the same: the consumer's inbox keys on it, so a replay cannot run a message
/// twice. A republish the origin stream drops as a duplicate is sent again until the
/// stream takes it, for at most twice the stream's window and a second. A stream whose
/// window is longer than [`duplicate_wait`](Self::duplicate_wait) fails the republish at
/// once; the copy stays among the dead letters for a later replay.
pub struct NatsDeadLetters {
    js: Context,
    stream: Stream,
    name: String,
    /// The next sequence to read.
    cursor: u64,
    /// The last sequence this session reads, once known.
    end: Option<u64>,
    /// The sequences taken and not settled.
    taken: BTreeSet<u64>,
    /// How long a republish may wait out a duplicate window.
    duplicate_wait: Duration,
}

impl std::fmt::Debug for NatsDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsDeadLetters")
            .field("stream", &self.name)
            .field("cursor", &self.cursor)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl NatsDeadLetters {
    /// The dead letters in the JetStream stream `stream`, read and republished through `js`.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Refused`] when the stream does not exist; [`BrokerError::Broker`]
    /// when the server does not answer.
    pub async fn new(js: Context, stream: impl Into<String>) -> Result<Self, BrokerError> {
        let name = stream.into();
        let found = js
            .get_stream(&name)
            .await
            .map_err(|e| stream_lookup(format!("stream {name}"), e))?;
        Ok(NatsDeadLetters {
            js,
            stream: found,
            name,
            cursor: 1,
            end: None,
            taken: BTreeSet::new(),
            duplicate_wait: DEFAULT_DUPLICATE_WAIT,
        })
    }

    /// Opens `url`: a NATS URL with `?stream=` naming the stream that captures the
    /// dead-letter subject.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Config`] for a URL without the stream; [`BrokerError::Broker`] when
    /// the server cannot be reached; as [`new`](Self::new).
    pub async fn open(url: &str) -> Result<Self, BrokerError> {
        let (url, stream) = crate::replay::url_param(url, "stream")?;
        let client = async_nats::connect(url.as_str())
            .await
            .map_err(|e| BrokerError::broker("connecting to NATS for the dead letters", e))?;
        Self::new(async_nats::jetstream::new(client), stream).await
    }

    /// The session's last sequence, read once.
    async fn end(&mut self) -> Result<u64, BrokerError> {
        if let Some(end) = self.end {
            return Ok(end);
        }
        let info = self
            .stream
            .get_info()
            .await
            .map_err(|e| BrokerError::broker(format!("reading stream {}", self.name), e))?;
        self.end = Some(info.state.last_sequence);
        Ok(info.state.last_sequence)
    }

    /// The first message at or after the cursor, if any is left.
    async fn next(&mut self, end: u64) -> Result<Option<StreamMessage>, BrokerError> {
        if self.cursor > end {
            return Ok(None);
        }
        let got = self
            .stream
            .raw_message_builder()
            .sequence(self.cursor)
            .next_by_subject(">")
            .send()
            .await;
        match got {
            Ok(m) if m.sequence <= end => {
                self.cursor = m.sequence + 1;
                Ok(Some(m))
            }
            Ok(_) => Ok(None),
            Err(e) if matches!(e.kind(), RawMessageErrorKind::NoMessageFound) => Ok(None),
            Err(e) => Err(BrokerError::broker(
                format!("reading {} from sequence {}", self.name, self.cursor),
                e,
            )),
        }
        .inspect(|m| {
            if m.is_none() {
                self.cursor = end + 1;
            }
        })
    }

    /// The duplicate window of `stream`, the origin stream that dropped a republish.
    async fn window_of(&self, stream: &str) -> Result<Duration, BrokerError> {
        let context = || format!("reading the duplicate window of stream {stream}");
        let mut found = self
            .js
            .get_stream(stream)
            .await
            .map_err(|e| stream_lookup(context(), e))?;
        let info = found
            .info()
            .await
            .map_err(|e| BrokerError::broker(context(), e))?;
        Ok(info.config.duplicate_window)
    }

    /// How long a republish may wait out the origin stream's duplicate window (2 minutes
    /// and 30 seconds by default: JetStream's default window, and its timer). A stream
    /// whose window is longer fails the republish at once.
    pub fn duplicate_wait(mut self, wait: Duration) -> Self {
        self.duplicate_wait = wait;
        self
    }
}

fn letter(m: StreamMessage) -> DeadLetter {
    let headers = text_headers(&m.headers);
    let origin = headers
        .iter()
        .find(|(n, _)| n == ORIGIN_HEADER)
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    DeadLetter {
        message_id: m.headers.get(MSG_ID_HEADER).map(|v| v.as_str().to_owned()),
        headers,
        payload: m.payload,
        origin,
        key: None,
        place: m.sequence.to_string(),
    }
}

#[async_trait]
impl DeadLetters for NatsDeadLetters {
    fn describe(&self) -> String {
        format!("NATS stream {:?}", self.name)
    }

    async fn take(&mut self, limit: usize) -> Result<Vec<DeadLetter>, BrokerError> {
        let end = self.end().await?;
        let mut taken = Vec::new();
        while taken.len() < limit {
            let Some(m) = self.next(end).await? else {
                break;
            };
            self.taken.insert(m.sequence);
            taken.push(letter(m));
        }
        Ok(taken)
    }

    async fn republish(&mut self, letter: &DeadLetter) -> Result<(), BrokerError> {
        let id = letter.message_id.as_deref().ok_or_else(|| {
            BrokerError::Config(format!("the copy at {} has no message id", letter.place))
        })?;
        if letter.origin.is_empty() {
            return Err(BrokerError::Config(format!(
                "the copy of {id} at {} has no {ORIGIN_HEADER} header: it was dead-lettered \
                 before copies named their subject",
                letter.place
            )));
        }
        let context = || format!("republishing {id} to {}", letter.origin);
        let kept = letter.replay_headers();
        let map = headers(
            std::iter::once((MSG_ID_HEADER, id)).chain(
                kept.iter()
                    .filter(|(n, _)| n != ORIGIN_HEADER)
                    .map(|(n, v)| (n.as_str(), v.as_str())),
            ),
        )
        .map_err(|e| BrokerError::broker(context(), e))?;
        let mut waited: Option<(Duration, Instant)> = None;
        loop {
            let sent = send(
                &self.js,
                &letter.origin,
                map.clone(),
                letter.payload.clone(),
            )
            .await
            .map_err(|e| BrokerError::broker(context(), e))?;
            let ack = sent.await.map_err(|e| BrokerError::broker(context(), e))?;
            if !ack.duplicate {
                return Ok(());
            }
            let (window, since) = match waited {
                Some(w) => w,
                None => {
                    let window = self.window_of(&ack.stream).await?;
                    *waited.insert((window, Instant::now()))
                }
            };
            // The server forgets an id on a timer, up to a window after it was seen.
            let limit = window * 2 + Duration::from_secs(1);
            if window > self.duplicate_wait || since.elapsed() > limit {
                return Err(BrokerError::broker(
                    context(),
                    format!(
                        "stream {} drops it as a duplicate: it saw {MSG_ID_HEADER} {id} within \
                         its duplicate window ({window:?}, waited {:?} at most here). Replay it \
                         once the window has passed since the message was first published",
                        ack.stream, self.duplicate_wait
                    ),
                ));
            }
            let pause = (window / 10).clamp(Duration::from_millis(20), Duration::from_secs(1));
            tokio::time::sleep(pause).await;
        }
    }

    async fn settle(&mut self, letter: &DeadLetter) -> Result<(), BrokerError> {
        let seq = letter
            .place
            .parse()
            .ok()
            .filter(|seq| self.taken.remove(seq))
            .ok_or_else(|| {
                BrokerError::Config(format!(
                    "sequence {} of {} was not taken in this session, or is settled",
                    letter.place, self.name
                ))
            })?;
        self.stream
            .delete_message(seq)
            .await
            .map(drop)
            .map_err(|e| {
                BrokerError::broker(format!("deleting sequence {seq} of {}", self.name), e)
            })
    }

    async fn give_back(&mut self) -> Result<(), BrokerError> {
        self.taken.clear();
        Ok(())
    }
}
