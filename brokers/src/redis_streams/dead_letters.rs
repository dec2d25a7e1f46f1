//! [`StreamDeadLetters`]: the entries of `<stream>:dead`, read back for a replay.

use async_trait::async_trait;
use bytes::Bytes;
use redis::Value;
use redis::aio::MultiplexedConnection;

use super::errors::classify;
use super::pending::bytes_of;
use super::publisher::xadd_entry;
use super::{DEAD_ENTRY_ID_FIELD, MESSAGE_ID_FIELD, PAYLOAD_FIELD, dead_stream};
use crate::BrokerError;
use crate::replay::{DeadLetter, DeadLetters};

/// The dead letters of one consumed stream: the entries of `<stream>:dead`, which a
/// [`StreamConsumer`](super::StreamConsumer) writes.
///
/// - Take: `XRANGE` from a cursor, in entry id order, up to the last entry there was when
///   the session first read. A copy dead-lettered again during a replay waits for the next
///   session.
/// - Republish: `XADD <stream> *` with the copy's message id, payload and headers, without
///   the failure headers, the reason and [`DEAD_ENTRY_ID_FIELD`]. Redis's answer (the new
///   entry id) is the confirm.
/// - Settle: `XDEL` of the copy's entry.
/// - Give back: nothing to do, a stream holds no delivery.
///
/// The origin is the consumed stream: a dead stream holds the copies of one stream only.
#[derive(Debug)]
pub struct StreamDeadLetters {
    conn: MultiplexedConnection,
    stream: String,
    dead: String,
    /// The last entry id read (`None`: none yet).
    cursor: Option<String>,
    /// The last entry id this session reads, once known (`Some(None)`: the stream was empty).
    end: Option<Option<String>>,
}

impl StreamDeadLetters {
    /// The dead letters of `stream` (`<stream>:dead`), read over `conn`.
    pub fn new(conn: MultiplexedConnection, stream: impl Into<String>) -> Self {
        let stream = stream.into();
        StreamDeadLetters {
            conn,
            dead: dead_stream(&stream),
            stream,
            cursor: None,
            end: None,
        }
    }

    /// Opens `url`: a Redis URL with `?stream=` naming the consumed stream.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Config`] for a URL without the stream or one redis-rs refuses; the
    /// client's error when it cannot connect.
    pub async fn open(url: &str) -> Result<Self, BrokerError> {
        let (url, stream) = crate::replay::url_param(url, "stream")?;
        let client = redis::Client::open(url.as_str())
            .map_err(|e| BrokerError::Config(format!("the Redis URL of the dead letters: {e}")))?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| classify("connecting to Redis for the dead letters", e))?;
        Ok(Self::new(conn, stream))
    }

    /// The session's last entry id, read once.
    async fn end(&mut self) -> Result<Option<String>, BrokerError> {
        if let Some(end) = &self.end {
            return Ok(end.clone());
        }
        let last: Value = redis::cmd("XREVRANGE")
            .arg(&self.dead)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| classify(format!("reading the end of {}", self.dead), e))?;
        let end = entries(last)?.into_iter().next().map(|(id, _)| id);
        self.end = Some(end.clone());
        Ok(end)
    }

    fn letter(&self, id: String, fields: Vec<(String, Value)>) -> DeadLetter {
        let text = |v: &Value| bytes_of(v).map(|b| String::from_utf8_lossy(b).into_owned());
        let mut letter = DeadLetter {
            message_id: None,
            headers: Vec::new(),
            payload: Bytes::new(),
            origin: format!("stream {:?}", self.stream),
            key: None,
            place: id,
        };
        for (field, value) in fields {
            match field.as_str() {
                MESSAGE_ID_FIELD => letter.message_id = text(&value),
                PAYLOAD_FIELD => {
                    letter.payload = bytes_of(&value)
                        .map(Bytes::copy_from_slice)
                        .unwrap_or_default();
                }
                _ => letter.headers.extend(text(&value).map(|v| (field, v))),
            }
        }
        letter
    }
}

#[async_trait]
impl DeadLetters for StreamDeadLetters {
    fn describe(&self) -> String {
        format!("Redis stream {:?}", self.dead)
    }

    async fn take(&mut self, limit: usize) -> Result<Vec<DeadLetter>, BrokerError> {
        let Some(end) = self.end().await? else {
            return Ok(Vec::new());
        };
        if limit == 0 || self.cursor.as_ref() == Some(&end) {
            return Ok(Vec::new());
        }
        let start = match &self.cursor {
            Some(last) => format!("({last}"),
            None => "-".to_owned(),
        };
        let read: Value = redis::cmd("XRANGE")
            .arg(&self.dead)
            .arg(start)
            .arg(&end)
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| classify(format!("reading {}", self.dead), e))?;
        let read = entries(read)?;
        match read.last() {
            Some((last, _)) => self.cursor = Some(last.clone()),
            None => self.cursor = Some(end),
        }
        Ok(read
            .into_iter()
            .map(|(id, fields)| self.letter(id, fields))
            .collect())
    }

    async fn republish(&mut self, letter: &DeadLetter) -> Result<(), BrokerError> {
        let id = letter.message_id.as_deref().ok_or_else(|| {
            BrokerError::Config(format!("the copy at {} has no message id", letter.place))
        })?;
        let headers: Vec<(String, String)> = letter
            .replay_headers()
            .into_iter()
            .filter(|(n, _)| n != DEAD_ENTRY_ID_FIELD)
            .collect();
        let context = format!("republishing {} to {}", letter.place, self.stream);
        let add = xadd_entry(&self.stream, id, &letter.payload, &headers)
            .map_err(|e| BrokerError::refused(context.clone(), e))?;
        let _: String = add
            .query_async(&mut self.conn)
            .await
            .map_err(|e| classify(context, e))?;
        Ok(())
    }

    async fn settle(&mut self, letter: &DeadLetter) -> Result<(), BrokerError> {
        // 0 removed: another replay settled it first, which is as good.
        let _: u64 = redis::cmd("XDEL")
            .arg(&self.dead)
            .arg(&letter.place)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| classify(format!("deleting {} from {}", letter.place, self.dead), e))?;
        Ok(())
    }

    async fn give_back(&mut self) -> Result<(), BrokerError> {
        Ok(())
    }
}

/// An entry's id and its fields, in order.
type Entry = (String, Vec<(String, Value)>);

/// An `XRANGE` answer as entry ids with their fields, in the stream's order (redis-rs's
/// `StreamRangeReply` keeps the fields in a map, losing it).
fn entries(reply: Value) -> Result<Vec<Entry>, BrokerError> {
    let odd = |what: &str| {
        BrokerError::refused(
            "reading the dead letters",
            format!("Redis answered {what} where an entry was expected"),
        )
    };
    let Value::Array(items) = reply else {
        return Err(odd("something other than a list"));
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(mut pair) = item else {
            return Err(odd("a non-list item"));
        };
        if pair.len() != 2 {
            return Err(odd("a list of the wrong length"));
        }
        let fields = pair.pop().unwrap_or(Value::Nil);
        let id = pair
            .pop()
            .as_ref()
            .and_then(bytes_of)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .ok_or_else(|| odd("an entry without an id"))?;
        let flat: Vec<Value> = match fields {
            Value::Array(flat) => flat,
            Value::Map(pairs) => pairs.into_iter().flat_map(|(f, v)| [f, v]).collect(),
            _ => return Err(odd("an entry without fields")),
        };
        let mut fields = Vec::with_capacity(flat.len() / 2);
        let mut flat = flat.into_iter();
        while let (Some(field), Some(value)) = (flat.next(), flat.next()) {
            if let Some(name) = bytes_of(&field) {
                fields.push((String::from_utf8_lossy(name).into_owned(), value));
            }
        }
        out.push((id, fields));
    }
    Ok(out)
}
