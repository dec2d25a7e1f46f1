//! The records of the live leases this store handed out, with the revision each was
//! written at, so the holder's commit or renewal is one conditional write without a read.
//!
//! An entry is a guess, never trusted: the write it allows is conditional on the
//! remembered revision. If anyone wrote the key since (a takeover, an operator, another
//! handle), the write is refused, the entry dropped, and the operation reads as usual.

use std::collections::HashMap;
use std::sync::Mutex;

use dedup_core::{LeaseToken, Record, RecordState, Timestamp};

/// Most entries kept: past it, new leases are not remembered (their holders read first).
const MAX_HELD: usize = 10_000;

/// Subject -> the revision and record this store last wrote there, for live leases.
#[derive(Debug, Default)]
pub(crate) struct Held {
    map: Mutex<HashMap<String, (u64, Record)>>,
}

impl Held {
    /// Note that `record` was written on `subject` at `revision`, at `now`: kept when it
    /// holds a live lease, forgotten otherwise.
    pub(crate) fn wrote(&self, subject: &str, revision: u64, record: &Record, now: Timestamp) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match &record.state {
            RecordState::InFlight { expires_at, .. }
                if *expires_at > now && (map.len() < MAX_HELD || map.contains_key(subject)) =>
            {
                map.insert(subject.to_owned(), (revision, record.clone()));
            }
            _ => {
                map.remove(subject);
            }
        }
    }

    /// The revision and record remembered on `subject` for the lease holding `token`.
    pub(crate) fn get(&self, subject: &str, token: LeaseToken) -> Option<(u64, Record)> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let (revision, record) = map.get(subject)?;
        match &record.state {
            RecordState::InFlight { token: held, .. } if *held == token => {
                Some((*revision, record.clone()))
            }
            _ => None,
        }
    }

    /// Forget `subject` (the key was written by someone else since).
    pub(crate) fn forget(&self, subject: &str) {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(subject);
    }
}
