//! [`NatsBacklog`]: what waits for a durable consumer, for the console's flow charts.

use async_nats::jetstream::Context;
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_trait::async_trait;

use super::errors::stream_lookup;
use crate::BrokerError;
use crate::backlog::Backlog;

/// The messages a durable consumer has not settled: those not yet delivered to it (its
/// `num_pending`) and those delivered and not acknowledged (`num_ack_pending`), from one
/// consumer info request. It changes nothing.
pub struct NatsBacklog {
    js: Context,
    stream: String,
    durable: String,
    name: String,
}

impl std::fmt::Debug for NatsBacklog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsBacklog")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl NatsBacklog {
    /// What `durable` has not settled of `stream`. Nothing is contacted until the first
    /// read.
    pub fn new(js: Context, stream: &str, durable: &str) -> Self {
        NatsBacklog {
            js,
            stream: stream.to_owned(),
            durable: durable.to_owned(),
            name: format!("{stream} ({durable})"),
        }
    }
}

#[async_trait]
impl Backlog for NatsBacklog {
    fn name(&self) -> &str {
        &self.name
    }

    fn what(&self) -> &'static str {
        "undelivered and pending"
    }

    async fn backlog(&self) -> Result<u64, BrokerError> {
        let stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| stream_lookup(format!("stream {}", self.stream), e))?;
        let context = format!("durable consumer {}", self.durable);
        match stream.consumer_info(&self.durable).await {
            Ok(info) => Ok(info.num_pending + info.num_ack_pending as u64),
            Err(e) => Err(match e.kind() {
                ConsumerInfoErrorKind::NotFound
                | ConsumerInfoErrorKind::StreamNotFound
                | ConsumerInfoErrorKind::InvalidName => BrokerError::refused(context, e),
                _ => BrokerError::broker(context, e),
            }),
        }
    }
}
