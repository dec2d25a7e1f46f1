//! [`StreamBacklog`]: what waits in a stream for a consumer group, for the console's flow
//! charts.

use async_trait::async_trait;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamInfoGroupsReply;
use tokio::sync::Mutex;

use super::errors::classify;
use crate::BrokerError;
use crate::backlog::Backlog;

/// The entries of a stream its group has not settled: those not yet delivered to the
/// group (`XINFO GROUPS`' `lag`) and those delivered and not acknowledged (its
/// `pending`). Where the server cannot tell the lag (entries deleted from the middle of
/// the stream), it counts the pending ones alone.
///
/// It connects at the first read and keeps the connection. After a failed read, the next
/// one connects again.
pub struct StreamBacklog {
    client: redis::Client,
    stream: String,
    group: String,
    name: String,
    conn: Mutex<Option<MultiplexedConnection>>,
}

impl std::fmt::Debug for StreamBacklog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamBacklog")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl StreamBacklog {
    /// What `group` has not settled of `stream`. Nothing is contacted until the first
    /// read.
    pub fn new(client: redis::Client, stream: &str, group: &str) -> Self {
        StreamBacklog {
            client,
            stream: stream.to_owned(),
            group: group.to_owned(),
            name: format!("{stream} ({group})"),
            conn: Mutex::new(None),
        }
    }
}

#[async_trait]
impl Backlog for StreamBacklog {
    fn name(&self) -> &str {
        &self.name
    }

    fn what(&self) -> &'static str {
        "undelivered and pending"
    }

    async fn backlog(&self) -> Result<u64, BrokerError> {
        let mut held = self.conn.lock().await;
        let mut conn = match held.as_ref() {
            Some(conn) => conn.clone(),
            None => self
                .client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| classify("connecting to Redis for a stream's backlog", e))?,
        };
        let context = format!("the groups of stream {}", self.stream);
        let groups: StreamInfoGroupsReply = match conn.xinfo_groups(&self.stream).await {
            Ok(groups) => groups,
            Err(e) => {
                *held = None;
                return Err(classify(context, e));
            }
        };
        *held = Some(conn);
        let Some(group) = groups.groups.iter().find(|g| g.name == self.group) else {
            let missing = std::io::Error::other(format!("no group {}", self.group));
            return Err(BrokerError::refused(context, missing));
        };
        Ok((group.pending + group.lag.unwrap_or(0)) as u64)
    }
}
