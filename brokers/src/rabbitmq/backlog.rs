//! [`RabbitDepth`]: a queue's depth, for the console's flow charts.

use async_trait::async_trait;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::errors::{classify, connect};
use crate::BrokerError;
use crate::backlog::Backlog;

/// The messages ready in a RabbitMQ queue (not those delivered and unacked), read with a
/// passive `queue.declare`: it changes nothing.
///
/// It connects at the first read and keeps the connection. After a failed read, the next
/// one connects again.
pub struct RabbitDepth {
    uri: String,
    queue: String,
    open: Mutex<Option<(Connection, Channel)>>,
}

impl std::fmt::Debug for RabbitDepth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitDepth")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl RabbitDepth {
    /// The depth of `queue` on the broker at `uri` (`amqp://...`). Nothing is contacted
    /// until the first read.
    pub fn new(uri: impl Into<String>, queue: impl Into<String>) -> Self {
        RabbitDepth {
            uri: uri.into(),
            queue: queue.into(),
            open: Mutex::new(None),
        }
    }

    async fn channel(
        &self,
        open: &mut Option<(Connection, Channel)>,
    ) -> Result<Channel, BrokerError> {
        if let Some((_, channel)) = open.as_ref()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        let connection = connect(&self.uri, ConnectionProperties::default())
            .await
            .map_err(|e| classify("connecting to RabbitMQ for a queue's depth", e))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| classify("opening a channel for a queue's depth", e))?;
        *open = Some((connection, channel.clone()));
        Ok(channel)
    }
}

#[async_trait]
impl Backlog for RabbitDepth {
    fn name(&self) -> &str {
        &self.queue
    }

    fn what(&self) -> &'static str {
        "queue depth"
    }

    async fn backlog(&self) -> Result<u64, BrokerError> {
        let mut open = self.open.lock().await;
        let channel = self.channel(&mut open).await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        match channel
            .queue_declare(self.queue.as_str().into(), passive, FieldTable::default())
            .await
        {
            Ok(queue) => Ok(u64::from(queue.message_count())),
            Err(e) => {
                // A refused declare closes the channel: the next read opens another.
                *open = None;
                Err(classify(format!("the depth of queue {}", self.queue), e))
            }
        }
    }
}
