//! The one error type every store returns.

use crate::Key;

/// A boxed error from a driver or the operating system, kept as the `source` of [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used throughout `dedup`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a [`DedupStore`](crate::DedupStore) operation can fail with.
///
/// A duplicate delivery is never an error: it is a [`Claim::InFlight`](crate::Claim::InFlight)
/// or [`Claim::Completed`](crate::Claim::Completed) outcome. Errors are for bad input, for a
/// lease that is no longer yours, and for the storage failing. Driver errors are kept as the
/// [`source`](std::error::Error::source) (never flattened to a string), and
/// [`Error::is_retryable`] says whether trying the same operation again can help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something the contract rejects (empty or oversized ids, NUL bytes,
    /// an oversized outcome, a zero lease, an unsafe table or prefix name, ...).
    /// Nothing was written.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// Which argument was rejected (`"consumer"`, `"message id"`, `"outcome"`, ...).
        what: &'static str,
        /// Why, in words a user can act on.
        reason: String,
    },

    /// The lease is no longer the live lease of its key: another worker took it over after
    /// it expired, or the record was completed by another token, or purged. The operation
    /// changed nothing. Work done under this lease must not be made permanent.
    #[error(
        "lease lost for {key}: the record was taken over, completed by another worker or purged"
    )]
    LeaseLost {
        /// The key whose lease was lost.
        key: Key,
    },

    /// The key was claimed with a payload fingerprint different from the one stored with
    /// its record: the same message id is being reused for a different payload. Nothing
    /// was written.
    #[error("fingerprint mismatch for {key}: the message id was reused with a different payload")]
    FingerprintMismatch {
        /// The key whose stored fingerprint differs.
        key: Key,
    },

    /// The store does not implement this operation (see
    /// [`Capabilities`](crate::Capabilities)).
    #[error("unsupported by this store: {0}")]
    Unsupported(&'static str),

    /// A stored value could not be read back as a dedup record (for example a foreign value
    /// of the wrong type under one of the store's keys). Nothing was written.
    #[error("corrupt record for {key}: {detail}")]
    Corrupt {
        /// The key whose record is unreadable.
        key: Key,
        /// What was wrong with it.
        detail: String,
    },

    /// The store's table (or key space) was created or upgraded by a newer version of this
    /// library, whose layout this version does not know. Nothing was changed: upgrade the
    /// library on this node (every node must run a version that knows the schema).
    #[error(
        "{table} has schema version {found}; this version of dedup knows versions up to \
         {known}: upgrade the dedup crates on this node"
    )]
    SchemaTooNew {
        /// The table (as configured, schema-qualified where the backend has schemas).
        table: String,
        /// The version recorded with the table.
        found: i64,
        /// The newest version this library knows.
        known: i64,
    },

    /// The store was opened without migrating (`migrate: false`, `migrate=false` in a store
    /// URL: the operator's read-only commands) and its table is missing (`found` 0) or at
    /// an older schema version than this version of dedup reads. Nothing was changed: run
    /// `dedup migrate` (or open the store once with migrating on).
    #[error(
        "{table} {}: run `dedup migrate` first (the store was opened without migrating)",
        if *found == 0 {
            format!("has no dedup schema (version {expected} expected)")
        } else {
            format!("has schema version {found}, older than version {expected} this dedup reads")
        }
    )]
    SchemaNotMigrated {
        /// The table (as configured, schema-qualified where the backend has schemas).
        table: String,
        /// The version found (0: no table).
        found: i64,
        /// The version this library reads.
        expected: i64,
    },

    /// An outbox relay was asked to run with a publisher that may still deliver a message
    /// after the relay's hold on its row ended: another relay could take the row again and
    /// publish a second copy while the first can still land. Nothing was started.
    ///
    /// The relay needs `delivery_timeout + mark_margin <= hold`. Lower the publisher's
    /// timeout (Kafka `message.timeout.ms`, a RabbitMQ confirm timeout...) or raise
    /// [`RelayConfig::hold`](crate::outbox::RelayConfig::hold).
    #[error(
        "the {publisher} publisher's delivery timeout ({delivery_timeout:?}) plus the relay's \
         mark margin ({mark_margin:?}) outlasts the relay's hold ({hold:?}): a row could be \
         taken again while its first publish can still land; lower the publisher's timeout \
         or raise RelayConfig::hold"
    )]
    PublisherOutlastsHold {
        /// The publisher's [`name`](crate::outbox::Publisher::name).
        publisher: &'static str,
        /// What the publisher reported as its
        /// [`delivery_timeout`](crate::outbox::Publisher::delivery_timeout).
        delivery_timeout: std::time::Duration,
        /// [`RelayConfig::mark_margin`](crate::outbox::RelayConfig::mark_margin).
        mark_margin: std::time::Duration,
        /// [`RelayConfig::hold`](crate::outbox::RelayConfig::hold).
        hold: std::time::Duration,
    },

    /// The storage failed (connection refused, dropped, server restarted, disk full, lock
    /// timeout, serialization failure...). `source` is the driver's own error.
    ///
    /// Displayed as `postgres backend error while connecting (retryable): nothing listens at
    /// 127.0.0.1:1; is the server running, on that port?`: the backend, what was being done
    /// when known, and for common setup mistakes a one-line hint. The cause follows in the
    /// [`source`](std::error::Error::source) chain (see [`Error::chain`]). Messages never
    /// hold passwords.
    #[error(
        "{backend} backend error{}{}{}",
        operation.map(|op| format!(" while {op}")).unwrap_or_default(),
        if *.retryable { " (retryable)" } else { "" },
        hint.as_deref().map(|h| format!(": {h}")).unwrap_or_default()
    )]
    Backend {
        /// Which backend (`"sqlite"`, `"postgres"`, `"redis"`, ...).
        backend: &'static str,
        /// Whether repeating the operation can succeed (transient failures).
        retryable: bool,
        /// What the store was doing, as words that follow "while": `"connecting"`,
        /// `"migrating the schema"`, `"claiming"`... `None` when not recorded.
        operation: Option<&'static str>,
        /// A one-line hint for a common setup mistake (the folder does not exist, nothing
        /// listens at the address, the role does not exist...). Never holds a password.
        hint: Option<String>,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
}

/// The source of an [`Error::Backend`] when a bounded wait ran out (a connect timeout)
/// before the driver reported anything more precise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    /// What was being waited for, e.g. `"connecting to 10.0.0.1:5432"` (never a password).
    pub what: String,
    /// How long was waited.
    pub after: std::time::Duration,
}

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no answer after {:?} {}", self.after, self.what)
    }
}

impl std::error::Error for TimedOut {}

impl Error {
    /// Shorthand for [`Error::InvalidInput`].
    pub fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            what,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::Backend`].
    pub fn backend(backend: &'static str, retryable: bool, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            backend,
            retryable,
            operation: None,
            hint: None,
            source: source.into(),
        }
    }

    /// Shorthand for [`Error::Corrupt`].
    pub fn corrupt(key: &Key, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            key: key.clone(),
            detail: detail.into(),
        }
    }

    /// Shorthand for [`Error::LeaseLost`].
    pub fn lease_lost(key: &Key) -> Self {
        Error::LeaseLost { key: key.clone() }
    }

    /// Record what was being done (`"connecting"`, `"migrating the schema"`, `"claiming"`...)
    /// on an [`Error::Backend`] that does not say yet; other errors are returned unchanged.
    pub fn during(mut self, what: &'static str) -> Self {
        if let Error::Backend { operation, .. } = &mut self {
            operation.get_or_insert(what);
        }
        self
    }

    /// Attach a one-line hint to an [`Error::Backend`] (replacing none already there);
    /// other errors are returned unchanged. The hint must not hold secrets.
    pub fn with_hint(mut self, text: impl Into<String>) -> Self {
        if let Error::Backend { hint, .. } = &mut self {
            hint.get_or_insert_with(|| text.into());
        }
        self
    }

    /// What was being done when an [`Error::Backend`] happened, when recorded.
    pub fn operation(&self) -> Option<&'static str> {
        match self {
            Error::Backend { operation, .. } => *operation,
            _ => None,
        }
    }

    /// The hint of an [`Error::Backend`], when there is one.
    pub fn hint(&self) -> Option<&str> {
        match self {
            Error::Backend { hint, .. } => hint.as_deref(),
            _ => None,
        }
    }

    /// This error and its [`source`](std::error::Error::source) chain, outermost first.
    pub fn chain(&self) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
        std::iter::successors(Some(self as &(dyn std::error::Error + 'static)), |e| {
            e.source()
        })
    }

    /// Whether repeating the same operation may succeed.
    ///
    /// True only for transient backend failures. A claim whose reply was lost may have
    /// taken effect: retrying it then returns `InFlight` for your own earlier claim, which
    /// is safe (nothing runs twice); the key becomes claimable again when that lease expires.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Backend {
                retryable: true,
                ..
            }
        )
    }

    /// Whether this is [`Error::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    /// Whether this is [`Error::InvalidInput`].
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Error::InvalidInput { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_display_names_backend_operation_and_hint() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let plain = Error::backend("redis", true, io);
        assert_eq!(plain.to_string(), "redis backend error (retryable)");
        let e = plain
            .during("connecting")
            .with_hint("nothing listens at 127.0.0.1:1")
            .during("claiming")
            .with_hint("ignored: the first hint stays");
        assert_eq!(
            e.to_string(),
            "redis backend error while connecting (retryable): nothing listens at 127.0.0.1:1"
        );
        assert_eq!(e.operation(), Some("connecting"));
        assert_eq!(e.chain().count(), 2, "the io error stays the source");
        let lost = Error::LeaseLost {
            key: Key::new("c", "m").unwrap(),
        };
        assert!(lost.during("committing").operation().is_none());
    }

    #[test]
    fn timed_out_says_how_long() {
        let t = TimedOut {
            what: "connecting to db:5432".into(),
            after: std::time::Duration::from_millis(500),
        };
        assert_eq!(t.to_string(), "no answer after 500ms connecting to db:5432");
    }
}
