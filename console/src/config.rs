//! [`ConsoleConfig`]: what the console lets through, and how much it reads at once.

use std::time::Duration;

/// How the console is set up. Start from [`ConsoleConfig::default`] (read-only, no token)
/// and change what you need; [`Console::new`](crate::Console::new) checks it.
///
/// Its `Debug` masks the token.
#[derive(Clone)]
#[non_exhaustive]
pub struct ConsoleConfig {
    /// Whether the actions (forget, release, retry, purge) are offered at all. Off by
    /// default: the console only reads.
    pub allow_writes: bool,
    /// The token an operator gives to write (and to view, with
    /// [`views_need_token`](Self::views_need_token)): as `Authorization: Bearer TOKEN`, or
    /// through the console's sign-in form, which keeps it in an `HttpOnly`,
    /// `SameSite=Strict` cookie.
    pub token: Option<String>,
    /// The host service authenticates every request to the console before it arrives (its
    /// own auth layer in front of the mounted router): then no token is asked. Forms still
    /// carry the CSRF token and a foreign `Origin` is still refused.
    pub host_auth: bool,
    /// Whether viewing needs the token too (the CLI sets it when listening beyond
    /// loopback).
    pub views_need_token: bool,
    /// An in-flight record is shown as stuck once it was first claimed longer ago than
    /// this, or once its lease expired and nobody took it over.
    pub stuck_after: Duration,
    /// Rows on one page of a list (keys of a group, stuck leases, dead outbox rows).
    pub page_size: usize,
    /// Most records (or outbox rows) one view reads to build its groups: on a store of
    /// millions of failures, the groups are those of the first `scan_limit` found, and the
    /// page says so.
    pub scan_limit: usize,
    /// The path the router is mounted under (`""` at the root, `"/console"` when nested
    /// there), for the links and forms it renders.
    pub base_path: String,
    /// The retention a "purge now" uses.
    pub purge_retention: Duration,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            allow_writes: false,
            token: None,
            host_auth: false,
            views_need_token: false,
            stuck_after: Duration::from_secs(5 * 60),
            page_size: 50,
            scan_limit: 10_000,
            base_path: String::new(),
            purge_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl std::fmt::Debug for ConsoleConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ConsoleConfig {
            allow_writes,
            token,
            host_auth,
            views_need_token,
            stuck_after,
            page_size,
            scan_limit,
            base_path,
            purge_retention,
        } = self;
        f.debug_struct("ConsoleConfig")
            .field("allow_writes", allow_writes)
            .field("token", &token.as_ref().map(|_| "***"))
            .field("host_auth", host_auth)
            .field("views_need_token", views_need_token)
            .field("stuck_after", stuck_after)
            .field("page_size", page_size)
            .field("scan_limit", scan_limit)
            .field("base_path", base_path)
            .field("purge_retention", purge_retention)
            .finish()
    }
}

/// Most rows one page may show.
pub const MAX_PAGE_SIZE: usize = 1000;

/// Most records one view may read ([`ConsoleConfig::scan_limit`]).
pub const MAX_SCAN_LIMIT: usize = 1_000_000;

/// A configuration [`Console::new`](crate::Console::new) refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Writes or token-guarded views were asked for, with neither a token nor the host's
    /// authentication to guard them.
    #[error("{what} needs a token (or `host_auth` when the host service authenticates)")]
    NoToken {
        /// What needed it.
        what: &'static str,
    },
    /// The token is empty or too short to resist guessing.
    #[error("the console token must be at least 16 characters (got {len})")]
    WeakToken {
        /// Its length.
        len: usize,
    },
    /// A size outside its range.
    #[error("{what} is {value}, outside 1..={max}")]
    OutOfRange {
        /// Which setting.
        what: &'static str,
        /// Its value.
        value: usize,
        /// Its largest allowed value.
        max: usize,
    },
    /// The base path is not empty and does not start with `/`, or ends with one.
    #[error("base path {0:?} must be empty or start with `/` and not end with one")]
    BasePath(String),
}

impl ConsoleConfig {
    /// Check the configuration (see [`ConfigError`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(t) = &self.token
            && t.chars().count() < 16
        {
            return Err(ConfigError::WeakToken {
                len: t.chars().count(),
            });
        }
        let guarded = self.token.is_some() || self.host_auth;
        if self.allow_writes && !guarded {
            return Err(ConfigError::NoToken { what: "writing" });
        }
        if self.views_need_token && !guarded {
            return Err(ConfigError::NoToken {
                what: "viewing beyond loopback",
            });
        }
        for (what, value, max) in [
            ("page_size", self.page_size, MAX_PAGE_SIZE),
            ("scan_limit", self.scan_limit, MAX_SCAN_LIMIT),
        ] {
            if value == 0 || value > max {
                return Err(ConfigError::OutOfRange { what, value, max });
            }
        }
        let b = &self.base_path;
        if !b.is_empty() && (!b.starts_with('/') || b.ends_with('/')) {
            return Err(ConfigError::BasePath(b.clone()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_masks_the_token() {
        let config = ConsoleConfig {
            token: Some("s3cr3t-token-0123456789".into()),
            ..ConsoleConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("token: Some(\"***\")"), "{shown}");
    }
}
