//! The partitioned layout ([`Partitions`], opt-in): the records table split into a ring of
//! time partitions, so a purge retires whole partitions (`TRUNCATE`) instead of deleting
//! rows one by one.
//!
//! How it stays correct:
//! - A row sits in the partition of the window of its **last write**. Every statement that
//!   writes a row (claim, takeover, commit, renew, release, revoke) sets `slot` to the
//!   current window's partition; PostgreSQL moves the row when that differs. So a
//!   partition whose window has passed only loses rows, never gains or changes one.
//! - The key is unique across partitions through the claim function ([`schema`]): it takes
//!   a transaction-scoped advisory lock on the key, then looks the key up in every
//!   partition, then inserts or takes over. Two first claims of one key straddling a
//!   window boundary take turns on the lock, and the second sees the first's row. The
//!   primary key alone (`consumer, message_id, slot`) would let both in.
//! - Retiring a partition ([`retire`]): its window ended before the purge's cutoff, so
//!   every row in it was last written before the cutoff. The rows still in flight with a
//!   lease past the cutoff are moved to the current partition first; then the partition
//!   is truncated under a short lock.

pub(crate) mod retire;
pub(crate) mod schema;
pub(crate) mod statements;

use std::time::Duration;

use dedup_core::{Error, Result, duration_millis};

/// The partitioned layout of the records table (opt-in,
/// [`PostgresConfig::partitions`](crate::PostgresConfig::partitions)): a ring of `count`
/// partitions, each holding the records last written during one `window` of time. A
/// purge removes whole partitions (`TRUNCATE`) instead of deleting rows.
///
/// A purge can only remove a partition whose window ended more than the retention ago,
/// and the ring must never come back to a partition still within retention. So the
/// longest retention a purge may ask is `(count - 2) * window`
/// ([`max_retention`](Self::max_retention)); a purge asking more fails with
/// [`Error::InvalidArgument`](dedup_core::Error). Records are kept up to one `window`
/// longer than the retention.
///
/// What it costs: every claim takes an advisory lock on its key and looks the key up in
/// each of the `count` partitions (an index probe each). Choose a few partitions (8 to
/// 16), not hundreds.
///
/// The layout is chosen when the table is created: [`migrate`](crate::PostgresStore::migrate)
/// refuses to open an existing table of the other layout.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use dedup_postgres::{Partitions, PostgresConfig};
///
/// // A week of retention, retired a day at a time.
/// let partitions = Partitions { window: Duration::from_secs(86_400), count: 9 };
/// assert_eq!(partitions.max_retention(), Duration::from_secs(7 * 86_400));
/// let config = PostgresConfig { partitions: Some(partitions), ..Default::default() };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partitions {
    /// The time one partition covers: at least 1 ms, a whole number of milliseconds.
    pub window: Duration,
    /// Partitions in the ring: 3 to [`MAX_PARTITIONS`].
    pub count: u16,
}

/// The most partitions a ring may have (each claim probes all of them).
pub const MAX_PARTITIONS: u16 = 64;

impl Partitions {
    /// Check the bounds.
    pub fn validate(&self) -> Result<()> {
        if self.window < Duration::from_millis(1)
            || !self.window.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(Error::invalid(
                "partitions.window",
                "must be a whole number of milliseconds, at least 1 ms",
            ));
        }
        if !(3..=MAX_PARTITIONS).contains(&self.count) {
            return Err(Error::invalid(
                "partitions.count",
                format!("must be 3 to {MAX_PARTITIONS}"),
            ));
        }
        Ok(())
    }

    /// The longest retention a purge may ask of this ring: `(count - 2) * window`.
    pub fn max_retention(&self) -> Duration {
        self.window * u32::from(self.count.saturating_sub(2))
    }

    /// Refuse `retention` when the ring cannot keep it ([`max_retention`](Self::max_retention)):
    /// a purge, or a count of what one would remove, on `table`.
    pub(crate) fn check_retention(&self, table: &str, retention: Duration) -> Result<()> {
        if retention <= self.max_retention() {
            return Ok(());
        }
        Err(Error::invalid(
            "retention",
            format!(
                "{table} keeps at most {:?} ({} partitions of {:?}, less two); purge with a \
                 shorter retention, or create the table with more partitions",
                self.max_retention(),
                self.count,
                self.window
            ),
        ))
    }

    /// The window in milliseconds.
    pub(crate) fn window_ms(&self) -> i64 {
        duration_millis(self.window)
    }

    /// The partition of the window holding `now_sql` (an SQL expression in ms).
    pub(crate) fn slot_of(&self, now_sql: &str) -> String {
        format!(
            "((({now_sql}) / {}) % {})::smallint",
            self.window_ms(),
            self.count
        )
    }

    /// The partition of the window holding `now_ms`.
    pub(crate) fn slot_at(&self, now_ms: i64) -> i16 {
        // `count` is at most 64, so the remainder fits.
        (now_ms.div_euclid(self.window_ms()) % i64::from(self.count)) as i16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked() {
        let ok = Partitions {
            window: Duration::from_millis(250),
            count: 8,
        };
        assert!(ok.validate().is_ok());
        for bad in [
            Partitions {
                window: Duration::ZERO,
                ..ok
            },
            Partitions {
                window: Duration::from_micros(1500),
                ..ok
            },
            Partitions { count: 2, ..ok },
            Partitions { count: 65, ..ok },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        assert_eq!(ok.max_retention(), Duration::from_millis(1500));
    }

    #[test]
    fn slots_turn_with_the_windows() {
        let p = Partitions {
            window: Duration::from_millis(100),
            count: 4,
        };
        assert_eq!(p.slot_at(0), 0);
        assert_eq!(p.slot_at(99), 0);
        assert_eq!(p.slot_at(100), 1);
        assert_eq!(p.slot_at(399), 3);
        assert_eq!(p.slot_at(400), 0);
        assert_eq!(p.slot_of("$1"), "((($1) / 100) % 4)::smallint");
    }
}
