//! Turning records, stats and reports into text for people and into JSON.

use std::io::Write;
use std::time::Duration;

use dedup_core::admin::KeySummary;
use dedup_core::{Failure, Record, RecordState, Status, Timestamp, Verdict, idempotency_key};
use serde_json::{Value, json};

use crate::screen;

/// `2026-11-30 22:50:01.123 UTC`.
pub(crate) fn utc(t: Timestamp) -> String {
    let ms = t.as_millis();
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    let secs = ms_of_day / 1000;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        ms_of_day % 1000
    )
}

/// `2026-11-30T22:50:01.123Z`, for JSON.
pub(crate) fn rfc3339(t: Timestamp) -> String {
    utc(t).replacen(' ', "T", 1).replace(" UTC", "Z")
}

/// The proleptic Gregorian date of a day number (days since 1970-01-01), after Howard
/// Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// A duration in its two largest units: `3d 4h`, `12m 5s`, `850ms`.
pub(crate) fn span(d: Duration) -> String {
    let ms = d.as_millis();
    let units = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ];
    for (i, (size, name)) in units.iter().enumerate() {
        if ms >= *size {
            let first = format!("{}{name}", ms / size);
            return match units.get(i + 1) {
                Some((next, next_name)) if ms % size >= *next => {
                    format!("{first} {}{next_name}", ms % size / next)
                }
                _ => first,
            };
        }
    }
    format!("{ms}ms")
}

/// `t` with how far it is from `now`: `2026-... UTC (3m 2s ago)` / `(in 29s)`.
pub(crate) fn when(t: Timestamp, now: Timestamp) -> String {
    if t <= now {
        format!("{} ({} ago)", utc(t), span(now.since(t)))
    } else {
        format!("{} (in {})", utc(t), span(t.since(now)))
    }
}

/// An outcome as text when it is UTF-8, else as hex with its length.
pub(crate) fn outcome(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => format!("{text:?} ({} bytes)", bytes.len()),
        Err(_) => format!("0x{} ({} bytes, not UTF-8)", hex(bytes), bytes.len()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An outcome for JSON: `{"text": ...}` or `{"hex": ...}`, with its length.
fn outcome_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => json!({ "text": text, "len": bytes.len() }),
        Err(_) => json!({ "hex": hex(bytes), "len": bytes.len() }),
    }
}

/// A timestamp for JSON: both forms.
fn time_json(t: Timestamp) -> Value {
    json!({ "utc": rfc3339(t), "ms": t.as_millis() })
}

/// The record as JSON (status as of `now`).
pub(crate) fn record_json(record: &Record, now: Timestamp) -> Value {
    let mut out = json!({
        "consumer": record.key.consumer(),
        "message_id": record.key.message_id(),
        "status": Status::of(record, now).as_str(),
        "fence": record.fence,
        "attempt": record.attempt,
        "fingerprint": record.fingerprint.as_ref().map(|f| f.as_str()),
        "idempotency_key": idempotency_key(&record.key),
        "first_claimed_at": record.first_claimed_at.map(time_json),
        "cause": record.failure().as_ref().map(failure_json),
    });
    if let Some(Verdict::DeadLetter { attempts, .. }) = record.verdict()
        && let Value::Object(out) = &mut out
    {
        out.insert("attempts_used".into(), json!(attempts));
    }
    let fields = match &record.state {
        RecordState::InFlight { token, expires_at } => json!({
            "token": token.to_string(),
            "expires_at": time_json(*expires_at),
        }),
        RecordState::Completed {
            token,
            processed_at,
            outcome,
        } => json!({
            "token": token.map(|t| t.to_string()),
            "processed_at": time_json(*processed_at),
            "outcome": outcome.as_deref().map(outcome_json),
        }),
    };
    if let (Value::Object(out), Value::Object(fields)) = (&mut out, fields) {
        out.extend(fields);
    }
    out
}

/// A failure as JSON.
pub(crate) fn failure_json(f: &Failure) -> Value {
    json!({
        "kind": f.kind,
        "chain": f.chain,
        "message": f.message(),
        "at": time_json(f.at),
        "attempt": f.attempt,
        "worker": f.worker,
    })
}

/// The status line of `record`: what its status means, and for a dead letter how many
/// attempts it used (the attempt after them, the record's attempt number, found none left).
fn status_line(record: &Record, status: Status) -> String {
    match record.verdict() {
        Some(Verdict::DeadLetter { attempts, .. }) => format!(
            "dead-lettered after {attempts} attempts (attempt {} found none left; \
             `dedup forget` resets the key)",
            record.attempt
        ),
        _ => describe(status).to_owned(),
    }
}

/// `text` as the value of the line named `name`, control characters escaped: a text of
/// several lines (an error quoting a payload, say) goes on as lines without a name, which
/// [`record_text`] indents under the first.
fn push_text(lines: &mut Vec<(&'static str, String)>, name: &'static str, text: &str) {
    for (i, piece) in text.split('\n').enumerate() {
        lines.push((
            if i == 0 { name } else { "" },
            screen::line(piece).into_owned(),
        ));
    }
}

/// The lines of a failure: what, when, where, then each link of its chain.
fn failure_lines(name: &'static str, f: &Failure, now: Timestamp) -> Vec<(&'static str, String)> {
    let mut head = format!(
        "{} error at attempt {}, {}",
        screen::line(&f.kind),
        f.attempt,
        when(f.at, now)
    );
    if let Some(worker) = &f.worker {
        head.push_str(&format!(", on {}", screen::line(worker)));
    }
    let mut lines = vec![(name, head)];
    for (i, link) in f.chain.iter().enumerate() {
        push_text(
            &mut lines,
            if i == 0 { "  error" } else { "  caused by" },
            link,
        );
    }
    lines
}

/// Print `json` (with `--json`) or `text` on standard output, control characters escaped
/// ([`screen`]). A reader that stopped reading (`dedup list ... | head`) ends the output
/// quietly; any other write error is said on standard error and exits with status 1.
pub(crate) fn print(as_json: bool, json: Value, text: impl FnOnce() -> String) {
    let body = if as_json {
        screen::json(json.to_string())
    } else {
        screen::lines(&text()).into_owned()
    };
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{body}").and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            eprintln!("error: cannot write the output: {e}");
            std::process::exit(1);
        }
    }
}

/// Longest cause [`short_cause`] shows, in characters.
const SHORT_CAUSE_CHARS: usize = 100;

/// The cause of a failed or dead-lettered record, or the last failure of one in flight, as
/// one line cut to 100 characters, control characters and newlines escaped (`dedup
/// inspect` shows the whole chain); `None` when the record has none (processed, or a
/// backend that keeps no causes).
pub(crate) fn short_cause(record: &Record) -> Option<String> {
    let cause = match record.verdict() {
        Some(Verdict::Processed(_)) => return None,
        Some(Verdict::Failed {
            message,
            cause: None,
        }) => message,
        _ => record.failure()?.message(),
    };
    Some(match cause.char_indices().nth(SHORT_CAUSE_CHARS) {
        Some((cut, _)) => format!("{}...", screen::line(&cause[..cut])),
        None => screen::line(&cause).into_owned(),
    })
}

/// The record for people, one `name: value` line each (a value of several lines goes on
/// indented), control characters escaped.
pub(crate) fn record_text(record: &Record, now: Timestamp) -> String {
    let status = Status::of(record, now);
    let mut lines = vec![
        ("consumer", screen::line(record.key.consumer()).into_owned()),
        (
            "message id",
            screen::line(record.key.message_id()).into_owned(),
        ),
        ("status", status_line(record, status)),
        ("fence", record.fence.to_string()),
        ("attempt", record.attempt.to_string()),
        (
            "first claimed",
            record
                .first_claimed_at
                .map_or("not kept by this backend".into(), |t| when(t, now)),
        ),
    ];
    match &record.state {
        RecordState::InFlight { token, expires_at } => {
            let verb = if status == Status::InFlight {
                "expires"
            } else {
                "expired"
            };
            lines.push((verb, when(*expires_at, now)));
            lines.push(("lease token", token.to_string()));
        }
        RecordState::Completed {
            token,
            processed_at,
            outcome: stored,
        } => {
            let verb = match status {
                Status::DeadLettered => "dead-lettered",
                Status::Failed => "failed",
                _ => "processed",
            };
            lines.push((verb, when(*processed_at, now)));
            match Verdict::decode(stored.clone()) {
                Verdict::Processed(bytes) => {
                    lines.push(("outcome", bytes.as_deref().map_or("none".into(), outcome)));
                }
                Verdict::Failed { message, cause } => match cause {
                    Some(cause) => lines.extend(failure_lines("failed with", &cause, now)),
                    None => push_text(&mut lines, "failed with", &message),
                },
                Verdict::DeadLetter { cause, .. } => match cause {
                    Some(cause) => lines.extend(failure_lines("last failure", &cause, now)),
                    None => lines.push(("last failure", "not kept (an older record)".into())),
                },
            }
            lines.push((
                "committed by",
                token.map_or("a transaction (no lease)".into(), |t| format!("lease {t}")),
            ));
        }
    }
    if matches!(record.state, RecordState::InFlight { .. })
        && let Some(f) = &record.last_failure
    {
        lines.extend(failure_lines("last failure", f, now));
    }
    lines.push((
        "fingerprint",
        record
            .fingerprint
            .as_ref()
            .map_or("none".into(), |f| screen::line(f.as_str()).into_owned()),
    ));
    lines.push((
        "idempotency key",
        screen::line(&idempotency_key(&record.key)).into_owned(),
    ));
    lines
        .iter()
        .map(|(name, value)| match name {
            &"" => format!("{:<16} {value}", ""),
            name => format!("{:<16} {value}", format!("{name}:")),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What a status means, for people.
pub(crate) fn describe(status: Status) -> &'static str {
    match status {
        Status::InFlight => "in flight (a worker holds a live lease)",
        Status::Expired => "expired (lease ran out or was released: the next delivery retries)",
        Status::Completed => "completed (processed; duplicates are acknowledged)",
        Status::Failed => "failed (the failure is its result; duplicates get it back)",
        Status::DeadLettered => "dead-lettered (it used up its attempts)",
    }
}

/// A key summary as JSON.
pub(crate) fn summary_json(s: &KeySummary) -> Value {
    json!({
        "consumer": s.key.consumer(),
        "message_id": s.key.message_id(),
        "status": s.status.as_str(),
        "attempt": s.attempt,
        "fence": s.fence,
        "at": time_json(s.at),
    })
}

/// A byte count for people: `24.0 KiB`.
pub(crate) fn bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{n} B"),
        _ => format!("{value:.1} {}", units[unit]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_render_in_utc() {
        assert_eq!(utc(Timestamp::EPOCH), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(
            utc(Timestamp::from_millis(1_796_078_401_123)),
            "2026-11-30 22:40:01.123 UTC"
        );
        assert_eq!(
            utc(Timestamp::from_millis(951_782_400_000)),
            "2000-02-29 00:00:00.000 UTC"
        );
        assert_eq!(rfc3339(Timestamp::EPOCH), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn spans_keep_two_units() {
        assert_eq!(span(Duration::from_millis(850)), "850ms");
        assert_eq!(span(Duration::from_secs(29)), "29s");
        assert_eq!(span(Duration::from_secs(185)), "3m 5s");
        assert_eq!(
            span(Duration::from_secs(3 * 86_400 + 4 * 3600 + 7)),
            "3d 4h"
        );
        assert_eq!(span(Duration::from_secs(7200)), "2h");
    }

    #[test]
    fn outcomes_are_text_or_hex() {
        assert_eq!(outcome(b"ok"), "\"ok\" (2 bytes)");
        assert_eq!(outcome(&[0xff, 0x00]), "0xff00 (2 bytes, not UTF-8)");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(24 * 1024), "24.0 KiB");
    }
}
