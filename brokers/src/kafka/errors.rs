//! rdkafka's errors sorted into what a new connection may fix and what it cannot.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::BrokerError;

/// `error` while doing `context`: [`BrokerError::Refused`] for refused credentials or
/// authorization, an invalid configuration or a topic that does not exist; otherwise (a
/// broker down, a timeout, a lost connection) [`BrokerError::Broker`], which the receive
/// loop reconnects after.
pub(crate) fn classify(context: impl Into<String>, error: KafkaError) -> BrokerError {
    let code = error.rdkafka_error_code();
    let fatal = matches!(
        error,
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_)
    ) || matches!(
        code,
        Some(
            RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::InvalidConfig
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::InvalidTopic
        )
    );
    if fatal {
        BrokerError::refused(context, error)
    } else {
        BrokerError::broker(context, error)
    }
}
