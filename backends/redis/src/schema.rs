//! The layout of the store's data in Redis: which key holds which dedup record (and back),
//! its cluster hash slot, and the packed record value a fresh-key claim writes.
//!
//! **Keys.** `{prefix}{consumer}:{message_id}`, each part with `%`, `{`, `}` and `:`
//! percent-encoded (`%25`, `%7B`, `%7D`, `%3A`). The encoding is injective (two different
//! keys never share a Redis key), keeps ordinary ids readable, and leaves no brace in the
//! key: the prefix forbids braces too, so no hash tag exists and Redis Cluster hashes the
//! whole key. Records therefore spread over all slots and masters, with no hot slot per
//! consumer. [`key_of`] reads a key found by `SCAN` back.
//!
//! **Record value** (layout 2, one Redis STRING), on the client side: the value a fresh-key
//! claim writes with `SET key value NX PX ttl GET` (no script, [`fresh_claim`]).
//! `lua/record.lua` holds the layout's full description and the scripts' reader, which owns
//! every record check; reading the completed record a fresh-key claim's `SET ... GET` may
//! answer is decoding ([`crate::decode::fresh`]), and the client only answers from a value
//! it fully understands, handing anything else to the claim script.
//!
//! ```text
//! 2,<state>,<fence>,<attempt>,<a>,<b>,<token>,<fingerprint length>,<fingerprint>[,<outcome>]
//! ```
//!
//! The token in Z85 ([`crate::token`]).

use dedup_core::{ClaimOptions, Key, LeaseToken, Timestamp, duration_millis};
use redis::Cmd;

use crate::token;

/// Hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// The Redis key of the store's last purge run under `prefix` (a hash: `finished_at`,
/// `removed`, `took_ms`, `stopped_early`). No ':' in it, so it is no record's key
/// ([`key_of`] skips it) and purges leave it alone.
pub(crate) fn purge_run_key(prefix: &str) -> String {
    format!("{prefix}purge-run")
}

/// The Redis key of `key`'s record under `prefix`.
pub(crate) fn redis_key(prefix: &str, key: &Key) -> String {
    let mut out =
        String::with_capacity(prefix.len() + key.consumer().len() + key.message_id().len() + 8);
    out.push_str(prefix);
    encode_into(&mut out, key.consumer());
    out.push(':');
    encode_into(&mut out, key.message_id());
    out
}

/// Append `part` to `out`, percent-encoded as the key layout says.
pub(crate) fn encode_into(out: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
}

/// Undo the layout's percent-encoding of one part; `None` when it is not an encoded part.
fn decode_part(part: &str) -> Option<String> {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let c = match rest.get(i + 1..i + 3)? {
            "25" => '%',
            "7B" => '{',
            "7D" => '}',
            "3A" => ':',
            _ => return None,
        };
        out.push(c);
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The dedup key a Redis key under `prefix` stands for; `None` for keys of another layout.
pub(crate) fn key_of(prefix: &str, redis_key: &[u8]) -> Option<Key> {
    let text = std::str::from_utf8(redis_key).ok()?.strip_prefix(prefix)?;
    let (consumer, message_id) = text.split_once(':')?;
    Key::new(decode_part(consumer)?, decode_part(message_id)?).ok()
}

/// The Redis Cluster hash slot of a Redis key: CRC16 (XMODEM) of the key, or of its hash tag
/// (the text between the first `{` and the next `}`, when not empty), mod 16384. As a number,
/// to index the slot map (redis-rs's `Slot` does not give its number out).
pub(crate) fn slot(redis_key: &[u8]) -> u16 {
    let hashed = hash_tag(redis_key).unwrap_or(redis_key);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
    }
    crc % SLOTS
}

fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// The layout version every record value starts with.
const VERSION: &str = "2";

/// What a fresh-key claim sends.
pub(crate) struct FreshClaim {
    /// `SET key value NX PX ttl GET`.
    pub(crate) set: Cmd,
    /// With the server's clock, `PEXPIRETIME key`, pipelined right after `set`: the key's
    /// expiry as the server set it, from which the lease's expiry follows exactly (and,
    /// when the key already held a `d` record, its processed_at: see
    /// [`completed`](crate::decode::fresh::completed)).
    pub(crate) expiry: Option<Cmd>,
    /// The lease's expiry: exact with an injected clock; with the server's clock the
    /// client's estimate (its clock before sending, plus the lease), used only when
    /// `PEXPIRETIME` has no answer (the key was deleted right after the claim).
    estimate: Timestamp,
    retention_ms: i64,
    /// The record `set` writes (for [`crate::held`], when the claim acquires).
    pub(crate) record: InFlight,
}

impl FreshClaim {
    /// The commands to send, in order, on the key.
    pub(crate) fn cmds(&self) -> impl Iterator<Item = &Cmd> {
        std::iter::once(&self.set).chain(&self.expiry)
    }

    /// The acquired lease's expiry, given the key's expiry as [`FreshClaim::expiry`]
    /// answered it ([`key_expiry`](crate::decode::fresh::key_expiry); set by the server:
    /// lease + retention from its "now") less the retention.
    pub(crate) fn expires_at(&self, key_expiry: Option<i64>) -> Timestamp {
        match key_expiry {
            Some(at) => Timestamp::from_millis(at.saturating_sub(self.retention_ms)),
            None => self.estimate,
        }
    }
}

/// When an in-flight record's lease and retention end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Times {
    /// `l`, on the server's clock: the lengths; the instants are the key's native expiry, set
    /// by the server (`PX lease + retention`): `retain_until` = `PEXPIRETIME`, lease expiry
    /// = `retain_until - retention`.
    Relative {
        /// The lease, in ms.
        lease_ms: i64,
        /// The retention, in ms.
        retention_ms: i64,
    },
    /// `i`, on an injected clock: the instants (ms since the epoch).
    Absolute {
        /// When the lease expires.
        expires_at: i64,
        /// When the record counts as absent.
        retain_until: i64,
    },
}

/// An in-flight record as the client writes it without a script: the claim of a fresh key
/// ([`fresh_claim`]) and the one-command renewal of a lease ([`crate::held`]). Its
/// [`value`](Self::value) is the exact text stored, which a later `SET ... IFEQ` compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InFlight {
    pub(crate) fence: u64,
    pub(crate) attempt: u32,
    pub(crate) token: LeaseToken,
    /// The payload fingerprint; empty for none.
    pub(crate) fingerprint: String,
    pub(crate) times: Times,
}

impl InFlight {
    /// The record value (layout 2).
    pub(crate) fn value(&self) -> String {
        let (state, a, b) = match self.times {
            Times::Relative {
                lease_ms,
                retention_ms,
            } => ('l', lease_ms, retention_ms),
            Times::Absolute {
                expires_at,
                retain_until,
            } => ('i', expires_at, retain_until),
        };
        let InFlight {
            fence,
            attempt,
            token,
            fingerprint,
            ..
        } = self;
        format!(
            "{VERSION},{state},{fence},{attempt},{a},{b},{},{},{fingerprint}",
            token::text(*token),
            fingerprint.len()
        )
    }

    /// The key's native expiry to set with it, relative to the server's "now" (`PX`); `now`
    /// is the injected clock's time (`None` with a relative record).
    pub(crate) fn ttl_ms(&self, now: Option<i64>) -> i64 {
        match self.times {
            Times::Relative {
                lease_ms,
                retention_ms,
            } => lease_ms.saturating_add(retention_ms),
            Times::Absolute { retain_until, .. } => {
                retain_until.saturating_sub(now.unwrap_or(retain_until))
            }
        }
        .max(1)
    }

    /// The completed record a commit by its holder writes, as `lua/commit_fast.lua` writes
    /// it: with the server's clock (`now` `None`) a `d` holding the retention (its instants
    /// are the key's expiry, `PX retention`), with an injected clock a `c` committed at
    /// `now`. `outcome` follows a comma when there is one.
    pub(crate) fn committed(
        &self,
        now: Option<i64>,
        retention_ms: i64,
        outcome: Option<&[u8]>,
    ) -> Vec<u8> {
        let stamps = match now {
            None => format!(
                "d,{},{},0,{}",
                self.fence,
                self.attempt,
                retention_ms.max(1)
            ),
            Some(now) => format!(
                "c,{},{},{now},{}",
                self.fence,
                self.attempt,
                now.saturating_add(retention_ms)
            ),
        };
        let mut value = format!(
            "{VERSION},{stamps},{},{},{}",
            token::text(self.token),
            self.fingerprint.len(),
            self.fingerprint
        )
        .into_bytes();
        if let Some(outcome) = outcome {
            value.push(b',');
            value.extend_from_slice(outcome);
        }
        value
    }
}

/// `SET key value IFEQ expected PX ttl GET` (Valkey >= 8.1, Redis >= 8.4): write `value`
/// only if the key holds exactly `expected`; the reply is what the key held (equal to
/// `expected` when it was written, nil when the key was absent).
pub(crate) fn set_ifeq(redis_key: &str, value: &[u8], expected: &[u8], ttl_ms: i64) -> Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(redis_key)
        .arg(value)
        .arg("IFEQ")
        .arg(expected)
        .arg("PX")
        .arg(ttl_ms.max(1))
        .arg("GET");
    cmd
}

/// The claim of a fresh key at `redis_key`: an in-flight record at fence 1, attempt 1.
///
/// With the server's clock (`now` is `None`) the record is `l`: it holds the lease and the
/// retention lengths, and the key's native expiry (`PX lease + retention`, set by the server
/// on its own clock) holds the instants; the scripts derive `retain_until` / `expires_at`
/// from `PEXPIRETIME`, and so does the client for the lease it returns. With an injected
/// clock (`now` given) the record is `i` with the instants from that clock.
pub(crate) fn fresh_claim(
    redis_key: &str,
    token: LeaseToken,
    options: &ClaimOptions,
    retention_ms: i64,
    now: Option<Timestamp>,
) -> FreshClaim {
    let lease_ms = duration_millis(options.lease);
    let times = match now {
        Some(now) => {
            let expires_at = now.as_millis().saturating_add(lease_ms);
            Times::Absolute {
                expires_at,
                retain_until: expires_at.saturating_add(retention_ms),
            }
        }
        None => Times::Relative {
            lease_ms,
            retention_ms,
        },
    };
    let record = InFlight {
        fence: 1,
        attempt: 1,
        token,
        fingerprint: options
            .fingerprint
            .as_ref()
            .map_or(String::new(), |f| f.as_str().to_owned()),
        times,
    };
    let mut set = redis::cmd("SET");
    set.arg(redis_key)
        .arg(record.value())
        .arg("NX")
        .arg("PX")
        .arg(lease_ms.saturating_add(retention_ms).max(1))
        .arg("GET");
    let expiry = now.is_none().then(|| {
        let mut cmd = redis::cmd("PEXPIRETIME");
        cmd.arg(redis_key);
        cmd
    });
    let estimate = now
        .unwrap_or_else(|| Timestamp::from_system_time(std::time::SystemTime::now()))
        .saturating_add(options.lease);
    FreshClaim {
        set,
        expiry,
        estimate,
        retention_ms,
        record,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(consumer: &str, id: &str) -> Key {
        Key::new(consumer, id).unwrap()
    }

    #[test]
    fn plain_ids_stay_readable() {
        assert_eq!(
            redis_key("dedup:", &k("billing", "order-42")),
            "dedup:billing:order-42"
        );
    }

    #[test]
    fn separators_and_braces_are_escaped() {
        assert_eq!(redis_key("p:", &k("a:b", "{c}%")), "p:a%3Ab:%7Bc%7D%25");
        // Without escaping these two would collide on "p:a:b:c".
        assert_ne!(
            redis_key("p:", &k("a:b", "c")),
            redis_key("p:", &k("a", "b:c"))
        );
        // An id that looks escaped stays distinct from the raw character.
        assert_ne!(
            redis_key("p:", &k("a", "%3A")),
            redis_key("p:", &k("a", ":"))
        );
    }

    #[test]
    fn no_hash_tag_so_the_whole_key_is_hashed() {
        let a = redis_key("p:", &k("c", "{same}x"));
        let b = redis_key("p:", &k("c", "{same}y"));
        assert!(!a.contains('{') && !b.contains('{'));
        // A raw `{same}` would be a hash tag pinning both keys to one slot; escaped, each
        // key is hashed whole (these two land in different slots).
        assert_eq!(slot(b"p:c:{same}x"), slot(b"p:c:{same}y"));
        assert_ne!(slot(a.as_bytes()), slot(b.as_bytes()));
    }

    #[test]
    fn slots_agree_with_redis_rs() {
        use redis::cluster_routing::Slot;
        let keys: [&[u8]; 8] = [
            b"",
            b"123456789",
            b"dedup:billing:order-42",
            b"p:c:{same}x",
            b"{}x",
            b"a{}{b}",
            b"{open",
            b"\xff\x00{\x80}",
        ];
        for key in keys {
            assert_eq!(
                Slot::new(slot(key)),
                Some(Slot::for_key(key)),
                "{:?}",
                String::from_utf8_lossy(key)
            );
        }
        // The reference value of the cluster spec: CRC16("123456789") = 0x31C3.
        assert_eq!(slot(b"123456789"), 0x31C3 % SLOTS);
    }

    #[test]
    fn redis_keys_decode_back_to_their_keys() {
        for (c, m) in [
            ("billing", "order-42"),
            ("a:b", "{c}%"),
            ("x", "%3A"),
            ("y", ":"),
        ] {
            let key = Key::new(c, m).unwrap();
            assert_eq!(key_of("p:", redis_key("p:", &key).as_bytes()), Some(key));
        }
        assert_eq!(key_of("p:", b"p:no-separator"), None);
        assert_eq!(key_of("p:", b"q:a:b"), None);
        assert_eq!(key_of("p:", b"p:a:%zz"), None);
    }

    #[test]
    fn the_fresh_claim_value_is_what_the_scripts_parse() {
        let token = LeaseToken::random();
        let options = ClaimOptions::lease(std::time::Duration::from_secs(2))
            .with_fingerprint(dedup_core::Fingerprint::new("f,p").unwrap());
        let server = fresh_claim("k", token, &options, 1000, None);
        let injected = fresh_claim("k", token, &options, 1000, Some(Timestamp::from_millis(50)));
        // The token in Z85 (crate::token), 20 characters.
        let token = crate::token::text(token);
        assert_eq!(token.len(), 20);
        let args = |c: &Cmd| -> Vec<String> {
            c.args_iter()
                .map(|a| match a {
                    redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => String::new(),
                })
                .collect()
        };
        assert_eq!(
            args(&server.set),
            [
                "SET",
                "k",
                &format!("2,l,1,1,2000,1000,{token},3,f,p"),
                "NX",
                "PX",
                "3000",
                "GET"
            ]
        );
        assert_eq!(
            args(&injected.set),
            [
                "SET",
                "k",
                &format!("2,i,1,1,2050,3050,{token},3,f,p"),
                "NX",
                "PX",
                "3000",
                "GET"
            ]
        );
        assert!(injected.expiry.is_none());
        assert_eq!(injected.expires_at(None), Timestamp::from_millis(2050));
        assert_eq!(args(server.expiry.as_ref().unwrap()), ["PEXPIRETIME", "k"]);
        assert_eq!(
            server.expires_at(Some(10_000)),
            Timestamp::from_millis(9_000)
        );
    }
}
