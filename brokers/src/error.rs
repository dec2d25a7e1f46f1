//! [`BrokerError`]: why a consumer stopped or could not start.

use dedup_core::BoxError;

/// Why a consumer could not start, or stopped before it was told to.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The configuration is invalid; nothing was started.
    #[error("invalid consumer configuration: {0}")]
    Config(String),
    /// The broker or its client failed in a way a new connection may fix (connection lost,
    /// broker restarting, a timeout): the receive loop reconnects after it.
    #[error("broker error: {context}")]
    Broker {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The broker refused in a way no retry fixes (refused credentials, access refused, a
    /// queue, stream or consumer that does not exist), or the consumer lost a connection it
    /// cannot open again (a `RabbitConsumer` made over a channel): the receive loop stops
    /// with it.
    #[error("broker refused: {context}")]
    Refused {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The endpoint lacks something the consumer's settings need (a RabbitMQ queue without
    /// the `x-dead-letter-exchange` its rejected messages would go to): the consumer refused
    /// to start and consumed nothing.
    #[error("{endpoint} has no {missing}: {why}")]
    MissingTopology {
        /// The queue (stream, subscription) consumed.
        endpoint: String,
        /// What it lacks (an argument's name).
        missing: String,
        /// What would happen, and the ways out.
        why: String,
    },
}

impl BrokerError {
    /// Whether a new connection may fix it (the receive loop then reconnects).
    pub fn is_retryable(&self) -> bool {
        matches!(self, BrokerError::Broker { .. })
    }

    pub(crate) fn broker(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        BrokerError::Broker {
            context: context.into(),
            source: source.into(),
        }
    }

    #[allow(dead_code)] // used by the broker modules (each behind its feature)
    pub(crate) fn refused(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        BrokerError::Refused {
            context: context.into(),
            source: source.into(),
        }
    }
}
