//! Failure groups: the failed and dead-lettered records whose failure has the same kind and
//! first line, under one short stable id. The console groups by it, and `dedup replay
//! --group` picks by it.

use sha2::{Digest, Sha256};

use crate::{Record, Timestamp};

/// The failure group a record belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureGroupOf {
    /// The group's id: [`group_id`] of the kind and the first line.
    pub id: String,
    /// The failure's kind (`handler`, `transient`, ...).
    pub kind: String,
    /// The first line of the failure's outermost error, at most 200 characters.
    pub first_line: String,
    /// When the record's failure happened.
    pub at: Timestamp,
}

/// The failure group of `record` (`None`: it holds no failure).
pub fn failure_group(record: &Record) -> Option<FailureGroupOf> {
    let f = record.failure()?;
    let line = first_line(f.chain.first().map(String::as_str).unwrap_or(""));
    Some(FailureGroupOf {
        id: group_id(&[&f.kind, &line]),
        kind: f.kind,
        first_line: line,
        at: f.at,
    })
}

/// A short stable id for a group named by `parts`: 16 hex digits of their SHA-256.
pub fn group_id(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The first line of `text`, at most 200 characters.
pub fn first_line(text: &str) -> String {
    text.lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}
