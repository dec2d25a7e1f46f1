//! [`BrokerError`]: why a consumer stopped or could not start.

use dedup_core::BoxError;

/// Why a consumer could not start, or stopped before it was told to.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The configuration is invalid; nothing was started.
    #[error("invalid consumer configuration: {0}")]
    Config(String),
    /// The broker or its client failed (connection lost, a command refused).
    #[error("broker error: {context}")]
    Broker {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
}

impl BrokerError {
    #[allow(dead_code)] // used by the broker modules (each behind its feature)
    pub(crate) fn broker(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        BrokerError::Broker {
            context: context.into(),
            source: source.into(),
        }
    }
}
