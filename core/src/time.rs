//! Timestamps and clocks.
//!
//! Lease arithmetic uses one clock per store. Server-backed stores default to the server's
//! clock so that nodes with skewed clocks agree; every store accepts an injected [`Clock`]
//! (usually a [`ManualClock`]) so tests control expiry exactly, without sleeping.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: milliseconds since the Unix epoch (UTC).
///
/// Millisecond precision is what every backend stores; all lease arithmetic is done in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// From milliseconds since the Unix epoch.
    pub const fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// From a [`SystemTime`] (truncated to milliseconds).
    pub fn from_system_time(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Err(e) => Timestamp(-i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX)),
        }
    }

    /// As a [`SystemTime`].
    pub fn to_system_time(self) -> SystemTime {
        if self.0 >= 0 {
            UNIX_EPOCH + Duration::from_millis(self.0 as u64)
        } else {
            UNIX_EPOCH - Duration::from_millis(self.0.unsigned_abs())
        }
    }

    /// This timestamp plus `d` (saturating).
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_millis(d)))
    }

    /// This timestamp minus `d` (saturating).
    pub fn saturating_sub(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_millis(d)))
    }

    /// How long from `earlier` to `self`; zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0).max(0) as u64)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// A duration in whole milliseconds as `i64` (saturating), the unit every backend stores.
pub fn duration_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A source of "now" for lease arithmetic.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_system_time(SystemTime::now())
    }
}

/// A clock that only moves when told to: for tests and simulations.
#[derive(Debug)]
pub struct ManualClock {
    now_ms: AtomicI64,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock {
            now_ms: AtomicI64::new(start.as_millis()),
        }
    }

    /// A clock standing at the current wall-clock time (so stored timestamps look sane).
    pub fn starting_now() -> Self {
        Self::new(SystemClock.now())
    }

    /// Move the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.now_ms.fetch_add(duration_millis(d), Ordering::SeqCst);
    }

    /// Set the clock to `t` (may move backwards; tests only).
    pub fn set(&self, t: Timestamp) {
        self.now_ms.store(t.as_millis(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.now_ms.load(Ordering::SeqCst))
    }
}

/// Parse a duration as people type it in store URLs and on the command line: a whole
/// number and a unit, `500ms`, `45s`, `30m`, `12h`, `7d`. The one parser every part of the
/// library uses.
///
/// The unit is required: a bare `30` is refused rather than guessed (30 seconds to one
/// reader is 30 days to another, and an operator's purge retention is no place to guess).
/// Surrounding whitespace is ignored; anything else (a sign, a fraction, an unknown unit, a
/// value that overflows) is [`Error::InvalidInput`](crate::Error::InvalidInput) naming the
/// accepted forms.
pub fn parse_duration(text: &str) -> crate::Result<Duration> {
    let bad = |why: &str| {
        crate::Error::invalid(
            "duration",
            format!(
                "{text:?}: {why}; expected a whole number and a unit (ms, s, m, h, d), e.g. 30s or 7d"
            ),
        )
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad("no whole number"))?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => return Err(bad("no unit")),
        _ => return Err(bad("unknown unit")),
    };
    n.checked_mul(ms_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| bad("too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_whole_number_and_a_unit() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("45s").unwrap(), Duration::from_secs(45));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1_800));
        assert_eq!(
            parse_duration("12h").unwrap(),
            Duration::from_secs(12 * 3_600)
        );
        assert_eq!(
            parse_duration(" 7d ").unwrap(),
            Duration::from_secs(7 * 86_400)
        );
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        for bad in [
            "",
            "30",
            "d",
            "7w",
            "-1d",
            "+1d",
            "1.5h",
            "5 s",
            "99999999999999999999d",
            "999999999999999999d",
        ] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.is_invalid_input(), "{bad}: {err}");
        }
        let bare = parse_duration("30").unwrap_err().to_string();
        assert!(bare.contains("no unit") && bare.contains("30s"), "{bare}");
    }
}
