//! [`NatsKvConfig`]: what a [`NatsKvStore`](crate::NatsKvStore) is opened with.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::{Clock, Error, Result};

/// Longest retention accepted (10 years).
pub const MAX_RETENTION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Longest bucket name and key prefix accepted, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// Most replicas a bucket may have (JetStream's own limit).
pub const MAX_REPLICAS: usize = 5;

/// Where a [`NatsKvStore`](crate::NatsKvStore) keeps its records, and for how long.
///
/// ```
/// use std::time::Duration;
/// use dedup_nats_kv::NatsKvConfig;
///
/// let config = NatsKvConfig {
///     bucket: "billing".into(),
///     replicas: Some(3),
///     retention: Duration::from_secs(3 * 24 * 3600),
///     ..NatsKvConfig::default()
/// };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Debug)]
pub struct NatsKvConfig {
    /// The key-value bucket (the JetStream stream `KV_<bucket>`). Made at open when
    /// missing; an existing one must keep one value per key and allow per-message TTLs.
    /// ASCII letters, digits, `_` and `-`, at most [`MAX_NAME_LEN`] bytes.
    pub bucket: String,
    /// Every record key starts with this token, so several stores can share a bucket.
    /// Same alphabet and length as the bucket.
    pub prefix: String,
    /// Replicas of the bucket (3 on a 3-node cluster): a bucket made at open gets this
    /// many, and an existing bucket with another count is refused. `None` (the default):
    /// an existing bucket's count, or 1 for a bucket made at open.
    pub replicas: Option<usize>,
    /// How long a record is kept: completed records for `retention` after their commit,
    /// in-flight records for `retention` after their lease expires. Enforced by the
    /// server's per-message TTL, in whole seconds rounded up. Must outlast every
    /// redelivery of a message.
    pub retention: Duration,
    /// Where "now" comes from for lease arithmetic: `None` (the default) is the server's
    /// clock, sampled from the stream leader (see the crate docs, "Time"); `Some` is an
    /// injected clock for tests and simulations (the TTLs still run on the server's time).
    pub clock: Option<Arc<dyn Clock>>,
    /// How long connecting may take before the constructor fails with the cause.
    /// Default: 5 seconds.
    pub connect_timeout: Duration,
    /// How long one request (a read, a write's acknowledgement) may take before it fails
    /// with a retryable timeout error. Default: 5 seconds.
    pub request_timeout: Duration,
}

impl Default for NatsKvConfig {
    /// Bucket `dedup`, prefix `dedup`, the bucket's replicas (one for a new bucket), retention 7 days, the server's clock,
    /// 5 s connect and request timeouts.
    fn default() -> Self {
        NatsKvConfig {
            bucket: "dedup".to_owned(),
            prefix: "dedup".to_owned(),
            replicas: None,
            retention: Duration::from_secs(7 * 24 * 3600),
            clock: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
        }
    }
}

impl NatsKvConfig {
    /// Check the configuration; every constructor of
    /// [`NatsKvStore`](crate::NatsKvStore) calls this first.
    pub fn validate(&self) -> Result<()> {
        name("bucket", &self.bucket)?;
        name("key prefix", &self.prefix)?;
        if let Some(n) = self.replicas.filter(|n| !(1..=MAX_REPLICAS).contains(n)) {
            return Err(Error::invalid(
                "replicas",
                format!("{n} is outside 1..={MAX_REPLICAS}"),
            ));
        }
        if self.retention < Duration::from_secs(1) || self.retention > MAX_RETENTION {
            return Err(Error::invalid(
                "retention",
                format!("{:?} is outside 1s..={MAX_RETENTION:?}", self.retention),
            ));
        }
        for (what, t) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if t < Duration::from_millis(1) {
                return Err(Error::invalid(what, "must be at least 1 ms"));
            }
        }
        Ok(())
    }
}

/// Accept `value` as one subject token: 1 to [`MAX_NAME_LEN`] ASCII letters, digits, `_`
/// or `-` (no `.`, `*`, `>` or spaces, which would change the subjects it is spliced into).
fn name(what: &'static str, value: &str) -> Result<()> {
    if value.is_empty() || value.len() > MAX_NAME_LEN {
        return Err(Error::invalid(
            what,
            format!("{value:?} must be 1 to {MAX_NAME_LEN} bytes"),
        ));
    }
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(Error::invalid(
            what,
            format!("{value:?} may hold only ASCII letters, digits, '_' and '-'"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_single_safe_tokens() {
        let ok = |bucket: &str| {
            NatsKvConfig {
                bucket: bucket.into(),
                ..NatsKvConfig::default()
            }
            .validate()
        };
        assert!(ok("orders_2-b").is_ok());
        for bad in ["", "a.b", "a*", "a>", "a b", "n\u{e9}", &"n".repeat(65)] {
            assert!(
                matches!(ok(bad), Err(Error::InvalidInput { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn replicas_and_retention_are_bounded() {
        let with = |replicas, retention| {
            NatsKvConfig {
                replicas: Some(replicas),
                retention,
                ..NatsKvConfig::default()
            }
            .validate()
        };
        assert!(with(3, Duration::from_secs(60)).is_ok());
        assert!(with(0, Duration::from_secs(60)).is_err());
        assert!(with(6, Duration::from_secs(60)).is_err());
        assert!(with(1, Duration::from_millis(999)).is_err());
    }
}
