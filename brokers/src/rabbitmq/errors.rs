//! lapin's errors sorted into what a new connection may fix and what it cannot.

use dedup_core::backend::url::redact;
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties, ErrorKind};

use crate::BrokerError;

/// `error` while doing `context`: [`BrokerError::Refused`] for refused credentials or
/// access, a missing or mismatched queue, a server speaking another protocol; otherwise (an
/// I/O error, a closed connection or channel, a forced close by a restarting broker, a
/// missed heartbeat) [`BrokerError::Broker`], which the receive loop reconnects after.
pub(crate) fn classify(context: impl Into<String>, error: lapin::Error) -> BrokerError {
    let fatal = match error.kind() {
        ErrorKind::ProtocolError(e) => matches!(
            e.kind(),
            AMQPErrorKind::Soft(
                AMQPSoftError::ACCESSREFUSED
                    | AMQPSoftError::NOTFOUND
                    | AMQPSoftError::PRECONDITIONFAILED
            ) | AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED | AMQPHardError::INVALIDPATH)
        ),
        ErrorKind::AuthProviderError(_) | ErrorKind::InvalidProtocolVersion(_) => true,
        _ => false,
    };
    if fatal {
        BrokerError::refused(context, error)
    } else {
        BrokerError::broker(context, error)
    }
}

/// A connection to `uri`, whose errors never quote the URL with its password: lapin's own
/// parse error is `Invalid URL: '<the whole URL>'` for a URL without `//`.
pub(crate) async fn connect(
    uri: &str,
    properties: ConnectionProperties,
) -> Result<Connection, lapin::Error> {
    let parsed = parse_uri(uri)?;
    Connection::connect_uri(parsed, properties).await
}

/// `uri` parsed as lapin parses it; an error names the URL with its password masked.
fn parse_uri(uri: &str) -> Result<AMQPUri, lapin::Error> {
    uri.parse::<AMQPUri>().map_err(|reason| {
        let shown = shown_uri(uri);
        let reason = reason.replace(uri, &shown);
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("invalid AMQP URL {shown}: {reason}"),
        )
        .into()
    })
}

/// `uri` as messages may show it: with its password masked, or only its scheme when it
/// is not of the `scheme://` form the masking reads.
fn shown_uri(uri: &str) -> String {
    if uri.contains("://") {
        redact(uri)
    } else {
        let scheme = uri.split(':').next().unwrap_or_default();
        format!("'{scheme}:***'")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_url_is_refused_without_its_password() {
        for uri in [
            "amqp:user:pw-s3cr3t@host",
            "amqp://user:pw-s3cr3t@host:notaport/",
            "http://user:pw-s3cr3t@host/",
        ] {
            let error = parse_uri(uri).expect_err(uri).to_string();
            assert!(!error.contains("pw-s3cr3t"), "{uri}: {error}");
            assert!(error.contains("invalid AMQP URL"), "{uri}: {error}");
        }
        assert!(parse_uri("amqp://user:pw@127.0.0.1:5672/%2f").is_ok());
    }
}
