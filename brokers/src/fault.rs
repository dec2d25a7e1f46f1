//! [`Fault`]: why a delivery was dead-lettered, as the headers its dead-lettered copy
//! carries (as MassTransit's `MT-Fault-*` headers do). Built once by the receive loop; each
//! broker writes the headers its own way (AMQP headers, stream fields, NATS and Kafka
//! headers, Pub/Sub attributes).

use std::time::{SystemTime, UNIX_EPOCH};

/// Header: what failed. `refused` for a delivery not admitted (no or an invalid message
/// id, older than the admission floor); otherwise the last failure's kind as the inbox
/// kept it (`handler`, `transient`, `panic`, `outcome`, `store`, `conflict`,
/// `attempts`).
pub const FAILURE_KIND_HEADER: &str = "dedup-failure-kind";
/// Header: the message chain: the refusal's reason, or the last failure's error and its
/// sources, outermost first, joined by `: `.
pub const FAILURE_MESSAGE_HEADER: &str = "dedup-failure-message";
/// Header: the attempts the inbox counted (`0` for a refused delivery).
pub const FAILURE_ATTEMPTS_HEADER: &str = "dedup-failure-attempts";
/// Header: the consumer name that dead-lettered it.
pub const FAILURE_CONSUMER_HEADER: &str = "dedup-failure-consumer";
/// Header: when it was dead-lettered, RFC 3339 in UTC with milliseconds
/// (`2026-12-03T12:40:00.123Z`).
pub const FAILURE_TIME_HEADER: &str = "dedup-failure-time";

/// Why a delivery went to the dead letters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// What failed (see [`FAILURE_KIND_HEADER`]).
    pub kind: String,
    /// The message chain (see [`FAILURE_MESSAGE_HEADER`]).
    pub message: String,
    /// Attempts counted (0 for a refused delivery).
    pub attempts: u32,
    /// The consumer name.
    pub consumer: String,
    /// When the consumer dead-lettered it.
    pub at: SystemTime,
}

impl Fault {
    /// The headers a dead-lettered copy carries, named by the `FAILURE_*_HEADER` constants.
    /// Values fit every broker's headers: control characters (line breaks) become spaces,
    /// and the message is cut to at most [`MAX_FAILURE_HEADER_LEN`] bytes.
    pub fn headers(&self) -> Vec<(String, String)> {
        vec![
            (FAILURE_KIND_HEADER.into(), header_value(&self.kind)),
            (FAILURE_MESSAGE_HEADER.into(), header_value(&self.message)),
            (FAILURE_ATTEMPTS_HEADER.into(), self.attempts.to_string()),
            (FAILURE_CONSUMER_HEADER.into(), header_value(&self.consumer)),
            (FAILURE_TIME_HEADER.into(), rfc3339(self.at)),
        ]
    }
}

/// The longest failure header value, in bytes (Pub/Sub takes attribute values of at most
/// 1 024 bytes).
pub const MAX_FAILURE_HEADER_LEN: usize = 1000;

/// `text` without control characters, cut (on a character boundary, ending in `…`) to at
/// most [`MAX_FAILURE_HEADER_LEN`] bytes.
fn header_value(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if clean.len() <= MAX_FAILURE_HEADER_LEN {
        return clean;
    }
    let mut end = MAX_FAILURE_HEADER_LEN - '…'.len_utf8();
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &clean[..end])
}

/// `at` as RFC 3339 in UTC with milliseconds; times before 1970 print as the epoch.
pub(crate) fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn values_fit_a_header() {
        assert_eq!(header_value("a\r\nb\tc"), "a  b c");
        let long = "é".repeat(MAX_FAILURE_HEADER_LEN);
        let cut = header_value(&long);
        assert!(cut.len() <= MAX_FAILURE_HEADER_LEN, "{}", cut.len());
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn times_print_as_rfc3339_utc() {
        let at = |s: u64, ms: u64| UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms);
        assert_eq!(rfc3339(at(0, 0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(at(951_782_400, 5)), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(at(1_796_301_600, 123)), "2026-12-03T12:40:00.123Z");
        assert_eq!(rfc3339(at(4_107_542_399, 999)), "2100-02-28T23:59:59.999Z");
    }
}
