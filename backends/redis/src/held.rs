//! One-command commit and renewal on servers with `SET ... IFEQ` (Valkey 8.1 and later,
//! Redis 8.4 and later): the store remembers the exact record value it wrote for each lease it handed out
//! (a fresh-key claim, a one-command renewal), and its holder's commit or renewal is then
//! one plain `SET key new IFEQ <that value> PX ... GET`: no script, no `TIME`.
//!
//! Why it is the contract: the value holds the state, fence, attempt, token and fingerprint
//! (and, with an injected clock, the instants), so a key holding exactly the value written
//! is in exactly the state the written record was, whatever happened in between; on the
//! server's clock only the key's expiry may differ (a renewal that wrote the same lengths),
//! and neither a commit nor a renewal depends on the lease's expiry. The reply settles what
//! it can and hands the rest to the script (`lua/commit.lua`, `lua/renew.lua`), which
//! judges it with the full record checks:
//!
//! - the value it held is the one expected: written;
//! - nil: the key is absent (purged, expired), which every script answers with `LeaseLost`;
//! - anything else (another holder's record, a completed one, a value written by a script
//!   or another process, a layout-1 hash's `WRONGTYPE`, a server without the option after a
//!   failover): the script runs, as on a server without `IFEQ`.
//!
//! The store finds out when it connects whether the server takes the option ([`probe`]).
//! With an injected clock the client knows "now", so it skips the fast path for a record
//! past its retention by that clock (absent: the script says `LeaseLost`). Release stays a
//! script on the server's clock: it must end the lease at the earlier of its expiry and
//! "now", a comparison with the server's clock no plain command makes; with an injected
//! clock it is one command too.
//!
//! The values are remembered per store (shared by clones), at most [`CAPACITY`] leases; the
//! oldest half is forgotten when full. A lease the store does not remember (forgotten,
//! claimed through the script, made by another process) simply takes the script.

use std::collections::HashMap;
use std::sync::Mutex;

use dedup_core::LeaseToken;
use redis::{RedisResult, Value};

use crate::schema::InFlight;

/// Leases remembered per store at most.
pub(crate) const CAPACITY: usize = 1 << 16;

/// The record values a store wrote for the leases it handed out, by token.
#[derive(Debug, Default)]
pub(crate) struct Held {
    entries: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<LeaseToken, Entry>,
    next: u64,
}

#[derive(Debug)]
struct Entry {
    redis_key: String,
    record: InFlight,
    seq: u64,
}

impl Held {
    /// Remember that `redis_key` holds `record` (replacing what was remembered for its
    /// token).
    pub(crate) fn insert(&self, redis_key: &str, record: InFlight) {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if e.map.len() >= CAPACITY {
            let keep_from = e.next.saturating_sub(CAPACITY as u64 / 2);
            e.map.retain(|_, entry| entry.seq >= keep_from);
        }
        let seq = e.next;
        e.next += 1;
        e.map.insert(
            record.token,
            Entry {
                redis_key: redis_key.to_owned(),
                record,
                seq,
            },
        );
    }

    /// What this store wrote for `token` at `redis_key`, if it remembers it.
    pub(crate) fn get(&self, token: LeaseToken, redis_key: &str) -> Option<InFlight> {
        let e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.map
            .get(&token)
            .filter(|entry| entry.redis_key == redis_key)
            .map(|entry| entry.record.clone())
    }

    /// Forget `token`'s value.
    pub(crate) fn remove(&self, token: LeaseToken) {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.map.remove(&token);
    }

    /// How many leases are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .len()
    }
}

/// Whether the server takes `SET ... IFEQ ... PX ... GET`: the command on a scratch key of
/// the store's prefix that cannot match (it writes nothing either way). A server without the
/// option answers a syntax error; any other error is the connection's, and is returned.
pub(crate) async fn probe(conn: &crate::conn::Conn, prefix: &str) -> RedisResult<bool> {
    // No ':' in the key: it is not any dedup key's (see schema::key_of), and never exists.
    let key = format!("{prefix}ifeq-probe-{}", LeaseToken::random());
    let cmd = crate::schema::set_ifeq(
        &key,
        b"probe",
        LeaseToken::random().to_string().as_bytes(),
        1000,
    );
    match conn.query::<Value>(&cmd).await {
        Ok(_) => Ok(true),
        Err(e) if crate::error::refused(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Times;

    fn record(token: LeaseToken) -> InFlight {
        InFlight {
            fence: 1,
            attempt: 1,
            token,
            fingerprint: String::new(),
            times: Times::Relative {
                lease_ms: 1000,
                retention_ms: 1000,
            },
        }
    }

    #[test]
    fn a_value_is_found_by_token_and_key_only() {
        let held = Held::default();
        let t = LeaseToken::random();
        held.insert("k", record(t));
        assert_eq!(held.get(t, "k"), Some(record(t)));
        assert_eq!(held.get(t, "other"), None);
        assert_eq!(held.get(LeaseToken::random(), "k"), None);
        held.remove(t);
        assert_eq!(held.get(t, "k"), None);
    }

    #[test]
    fn a_full_store_forgets_the_oldest_half() {
        let held = Held::default();
        let tokens: Vec<LeaseToken> = (0..CAPACITY + 1).map(|_| LeaseToken::random()).collect();
        for t in &tokens {
            held.insert("k", record(*t));
        }
        assert!(held.len() <= CAPACITY / 2 + 1, "{}", held.len());
        assert_eq!(held.get(tokens[0], "k"), None);
        let last = tokens[CAPACITY];
        assert_eq!(held.get(last, "k"), Some(record(last)));
    }
}
