//! [`RedisConfig`]: what a [`RedisStore`](crate::RedisStore) is opened with.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::backend::names;
use dedup_core::{Clock, Error, Result, TlsFiles};

/// Longest retention accepted (10 years).
pub const MAX_RETENTION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How a [`RedisStore`](crate::RedisStore) lays out and keeps its records.
///
/// ```
/// use std::time::Duration;
/// use dedup_redis::RedisConfig;
///
/// let config = RedisConfig {
///     prefix: "billing-dedup:".into(),
///     retention: Duration::from_secs(3 * 24 * 3600),
///     ..RedisConfig::default()
/// };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// Every record key starts with this (see the crate docs, "Key layout"). Validated by
    /// [`dedup_core::backend::names::key_prefix`]: printable ASCII, no spaces, braces or glob
    /// characters. Two stores on one server must not use prefixes where one starts with the
    /// other: `purge` of the shorter one would scan the longer one's records too.
    pub prefix: String,
    /// How long a record is kept: completed records for `retention` after their commit,
    /// in-flight records for `retention` after their lease expires. Enforced by Redis's
    /// native expiry and, by the store's clock, by every script (a record past its retention
    /// is absent for every operation). Must outlast every redelivery of a message.
    pub retention: Duration,
    /// Where "now" comes from for lease arithmetic: `None` (the default) uses the Redis
    /// server's `TIME` inside each script, so clients with skewed clocks agree; `Some` is
    /// an injected clock for tests and simulations (native expiry still runs on the
    /// server's real time; see the crate docs).
    pub clock: Option<Arc<dyn Clock>>,
    /// After each commit, wait until this many replicas acknowledged it (`WAIT replicas
    /// timeout`). `None` (the default) does not wait. When fewer replicas acknowledge in
    /// time, the commit has still happened on the primary and the call returns a retryable
    /// [`Error::Backend`] whose source is a [`ReplicationShortfall`](crate::ReplicationShortfall).
    /// The timeout must be at least 1 ms (a zero `WAIT` timeout would block forever).
    pub wait_for_replicas: Option<(u32, Duration)>,
    /// How long one request (a script, a pipeline, a `WAIT`) may take before it fails with
    /// a retryable timeout error. `None` waits forever. Default: 5 seconds. Must be longer
    /// than the `wait_for_replicas` timeout.
    pub response_timeout: Option<Duration>,
    /// How long connecting may take (TCP, TLS, authentication, the first command) before
    /// the constructor fails with the cause. Default: 5 seconds.
    pub connect_timeout: Duration,
    /// TLS certificate files for `rediss://` servers: the CA that signed the server's
    /// certificate (instead of the system's roots) and a client certificate and key for
    /// servers that ask for one. Needs this crate's `tls` feature.
    pub tls: TlsFiles,
}

impl Default for RedisConfig {
    /// Prefix `"dedup:"`, retention 7 days, the server's clock, no replica wait, 5 s
    /// response and connect timeouts, no TLS files.
    fn default() -> Self {
        RedisConfig {
            prefix: "dedup:".to_owned(),
            retention: Duration::from_secs(7 * 24 * 3600),
            clock: None,
            wait_for_replicas: None,
            response_timeout: Some(Duration::from_secs(5)),
            connect_timeout: Duration::from_secs(5),
            tls: TlsFiles::default(),
        }
    }
}

impl RedisConfig {
    /// Check the configuration; every constructor of [`RedisStore`](crate::RedisStore)
    /// calls this first.
    pub fn validate(&self) -> Result<()> {
        names::key_prefix(&self.prefix)?;
        if self.retention < Duration::from_millis(1) || self.retention > MAX_RETENTION {
            return Err(Error::invalid(
                "retention",
                format!("{:?} is outside 1ms..={MAX_RETENTION:?}", self.retention),
            ));
        }
        if let Some((_, timeout)) = self.wait_for_replicas {
            if timeout < Duration::from_millis(1) {
                return Err(Error::invalid(
                    "wait_for_replicas",
                    "the timeout must be at least 1 ms (WAIT 0 blocks forever)",
                ));
            }
            if self.response_timeout.is_some_and(|r| r <= timeout) {
                return Err(Error::invalid(
                    "response_timeout",
                    "must be longer than the wait_for_replicas timeout",
                ));
            }
        }
        if self.response_timeout.is_some_and(|r| r.is_zero()) {
            return Err(Error::invalid("response_timeout", "must not be zero"));
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::invalid("connect_timeout", "must not be zero"));
        }
        self.tls.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        RedisConfig::default().validate().unwrap();
    }

    #[test]
    fn rejects_bad_values() {
        let bad = [
            RedisConfig {
                prefix: "a{b}:".into(),
                ..RedisConfig::default()
            },
            RedisConfig {
                prefix: "x*".into(),
                ..RedisConfig::default()
            },
            RedisConfig {
                retention: Duration::ZERO,
                ..RedisConfig::default()
            },
            RedisConfig {
                retention: MAX_RETENTION + Duration::from_secs(1),
                ..RedisConfig::default()
            },
            RedisConfig {
                wait_for_replicas: Some((1, Duration::ZERO)),
                ..RedisConfig::default()
            },
            RedisConfig {
                wait_for_replicas: Some((1, Duration::from_secs(10))),
                ..RedisConfig::default()
            },
            RedisConfig {
                response_timeout: Some(Duration::ZERO),
                ..RedisConfig::default()
            },
        ];
        for config in bad {
            assert!(
                config.validate().unwrap_err().is_invalid_input(),
                "{config:?}"
            );
        }
    }
}
