//! [`StreamPublisher`]: outbox rows to Redis Streams with `XADD`.

use async_trait::async_trait;
use dedup_core::BoxError;
use dedup_core::outbox::{OutboxRow, Publisher};
use redis::aio::MultiplexedConnection;

use super::{MESSAGE_ID_FIELD, PAYLOAD_FIELD};

/// Publishes each row as `XADD <destination> * message_id <id> payload <bytes>
/// [<header> <value>]...`; `Ok` once Redis answered the entry id. A header named
/// `message_id` or `payload` would hide the row's own fields: such a row is an error (the
/// relay retries it and, after its attempts, marks it dead).
#[derive(Clone, Debug)]
pub struct StreamPublisher {
    conn: MultiplexedConnection,
}

impl StreamPublisher {
    /// A publisher over `conn`.
    pub fn new(conn: MultiplexedConnection) -> Self {
        StreamPublisher { conn }
    }

    /// A publisher on a new multiplexed connection of `client`.
    pub async fn connect(client: &redis::Client) -> redis::RedisResult<Self> {
        Ok(Self::new(client.get_multiplexed_async_connection().await?))
    }
}

fn xadd(row: &OutboxRow) -> Result<redis::Cmd, BoxError> {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(&row.destination)
        .arg("*")
        .arg(MESSAGE_ID_FIELD)
        .arg(&row.message_id)
        .arg(PAYLOAD_FIELD)
        .arg(&row.payload[..]);
    for (name, value) in &row.headers {
        if name == MESSAGE_ID_FIELD || name == PAYLOAD_FIELD {
            return Err(format!("header {name:?} would hide the entry's own field").into());
        }
        cmd.arg(name).arg(value);
    }
    Ok(cmd)
}

#[async_trait]
impl Publisher for StreamPublisher {
    fn name(&self) -> &'static str {
        "redis-streams"
    }

    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        let _id: String = xadd(row)?.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// One pipeline of `XADD`s (one round trip), each answered on its own.
    async fn publish_all(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut results: Vec<Option<Result<(), BoxError>>> = Vec::with_capacity(rows.len());
        for row in rows {
            match xadd(row) {
                Ok(cmd) => {
                    pipe.add_command(cmd);
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let answers: Result<Vec<redis::RedisResult<String>>, _> =
            pipe.query_async(&mut self.conn.clone()).await;
        match answers {
            Ok(answers) => {
                let mut answers = answers.into_iter();
                results
                    .into_iter()
                    .map(|r| match r {
                        Some(r) => r,
                        None => match answers.next() {
                            Some(Ok(_)) => Ok(()),
                            Some(Err(e)) => Err(e.into()),
                            None => Err("pipeline answered fewer replies than commands".into()),
                        },
                    })
                    .collect()
            }
            Err(e) => {
                let e = e.to_string();
                results
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|| Err(e.clone().into())))
                    .collect()
            }
        }
    }
}
