//! The packed record (layout 2, one Redis STRING) on the client side: the value a fresh-key
//! claim writes with `SET key value NX PX ttl GET` (no script), and reading the completed
//! record that command may answer instead. `lua/record.lua` holds the layout's full
//! description and the scripts' reader, which owns every record check; the client only
//! answers from a value it fully understands and hands anything else to the claim script.
//!
//! ```text
//! 2,<state>,<fence>,<attempt>,<a>,<b>,<token>,<fingerprint length>,<fingerprint>[,<outcome>]
//! ```

use dedup_core::backend::{RawRecord, RawState};
use dedup_core::{ClaimOptions, Key, LeaseToken, Record, Result, Timestamp, duration_millis};
use redis::{Cmd, Value};

/// The layout version every record value starts with.
const VERSION: &str = "2";

/// What a fresh-key claim sends.
pub(crate) struct FreshClaim {
    /// `SET key value NX PX ttl GET`.
    pub(crate) set: Cmd,
    /// With the server's clock, `PEXPIRETIME key`, pipelined right after `set`: the key's
    /// expiry as the server set it, from which the lease's expiry follows exactly (and,
    /// when the key already held a `d` record, its processed_at: see [`completed`]).
    pub(crate) expiry: Option<Cmd>,
    /// The lease's expiry: exact with an injected clock; with the server's clock the
    /// client's estimate (its clock before sending, plus the lease), used only when
    /// `PEXPIRETIME` has no answer (the key was deleted right after the claim).
    estimate: Timestamp,
    retention_ms: i64,
}

impl FreshClaim {
    /// The commands to send, in order, on the key.
    pub(crate) fn cmds(&self) -> impl Iterator<Item = &Cmd> {
        std::iter::once(&self.set).chain(&self.expiry)
    }

    /// The acquired lease's expiry, given the key's expiry as [`FreshClaim::expiry`]
    /// answered it ([`key_expiry`]; set by the server: lease + retention from its "now")
    /// less the retention.
    pub(crate) fn expires_at(&self, key_expiry: Option<i64>) -> Timestamp {
        match key_expiry {
            Some(at) => Timestamp::from_millis(at.saturating_sub(self.retention_ms)),
            None => self.estimate,
        }
    }
}

/// The key's expiry from a `PEXPIRETIME` reply (ms since the epoch), if the key exists and
/// has one.
pub(crate) fn key_expiry(reply: Option<&Value>) -> Option<i64> {
    match reply {
        Some(Value::Int(at)) if *at > 0 => Some(*at),
        _ => None,
    }
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
    let (state, a, b) = match now {
        Some(now) => {
            let expires_at = now.as_millis().saturating_add(lease_ms);
            ('i', expires_at, expires_at.saturating_add(retention_ms))
        }
        None => ('l', lease_ms, retention_ms),
    };
    let fingerprint = options.fingerprint.as_ref().map_or("", |f| f.as_str());
    let value = format!(
        "{VERSION},{state},1,1,{a},{b},{token},{},{fingerprint}",
        fingerprint.len()
    );
    let mut set = redis::cmd("SET");
    set.arg(redis_key)
        .arg(value)
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
    }
}

/// The completed record `value` holds, if it is one the client can answer a claim from:
/// `None` for anything else (in flight, past its retention by `now` when a clock is
/// injected, not layout 2), which the claim script then reads and judges.
/// `Some(Err(Corrupt))` when the value has the layout but not a valid record (a token
/// that is not a UUID, a fence of 0).
///
/// A `d` record (a single commit under the server's clock) keeps its instants in the key's
/// expiry: `key_expiry` is the `PEXPIRETIME` pipelined after the `SET` that read `value`
/// ([`key_expiry`]), and without one (the key went away in between) the script judges it.
pub(crate) fn completed(
    key: &Key,
    value: &[u8],
    now: Option<Timestamp>,
    key_expiry: Option<i64>,
) -> Option<Result<Record>> {
    let (mut rest, relative) = match value.strip_prefix(b"2,c,") {
        Some(rest) => (rest, false),
        None => (value.strip_prefix(b"2,d,")?, true),
    };
    let mut next = || {
        let end = rest.iter().position(|&b| b == b',')?;
        let field = std::str::from_utf8(&rest[..end]).ok()?;
        rest = &rest[end + 1..];
        Some(field)
    };
    let number = |s: &str| -> Option<i64> { s.parse().ok() };
    let fence = number(next()?)?;
    let attempt = number(next()?)?;
    let a = number(next()?)?;
    let b = number(next()?)?;
    // 'c': a = processed_at, b = retain_until; 'd': b = the retention, the key's expiry
    // = retain_until.
    let (processed_at, retain_until) = if relative {
        let at = key_expiry?;
        (at.checked_sub(b)?, at)
    } else {
        (a, b)
    };
    let token = next()?;
    let fp_len: usize = next()?.parse().ok()?;
    if now.is_some_and(|now| retain_until <= now.as_millis()) {
        return None;
    }
    let fingerprint = std::str::from_utf8(rest.get(..fp_len)?).ok()?;
    let outcome = match rest.get(fp_len..)? {
        [] => None,
        [b',', outcome @ ..] => Some(outcome.to_vec()),
        _ => return None,
    };
    Some(
        RawRecord {
            state: RawState::Completed,
            token: (!token.is_empty()).then_some(token),
            fence,
            attempt,
            expires_at: None,
            processed_at: Some(processed_at),
            outcome,
            fingerprint: (fp_len > 0).then_some(fingerprint),
        }
        .decode(key),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new("c", "m").unwrap()
    }

    /// A completed record's processed_at, outcome and committing token.
    fn completion(r: Record) -> (Timestamp, Option<Vec<u8>>, Option<LeaseToken>) {
        match r.state {
            dedup_core::RecordState::Completed {
                processed_at,
                outcome,
                token,
            } => (processed_at, outcome, token),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_completed_value_is_read_with_its_outcome_and_fingerprint() {
        let token = LeaseToken::random();
        let v = format!("2,c,3,2,1700,9999,{token},4,a,b|,out,come");
        let r = completed(&key(), v.as_bytes(), None, None)
            .unwrap()
            .unwrap();
        assert_eq!(r.fence, 3);
        assert_eq!(r.attempt, 2);
        assert_eq!(r.fingerprint.as_ref().unwrap().as_str(), "a,b|");
        assert_eq!(
            completion(r),
            (
                Timestamp::from_millis(1700),
                Some(b"out,come".to_vec()),
                Some(token)
            )
        );
        let none = format!("2,c,1,1,5,9999,{token},0,");
        let empty = format!("2,c,1,1,5,9999,{token},0,,");
        let outcome = |v: &str| {
            completion(
                completed(&key(), v.as_bytes(), None, None)
                    .unwrap()
                    .unwrap(),
            )
            .1
        };
        assert_eq!(outcome(&none), None);
        assert_eq!(outcome(&empty), Some(vec![]));
    }

    /// A `d` record (a single commit on the server's clock) takes its instants from the
    /// key's expiry: processed_at is the expiry less the retention it holds; without an
    /// expiry (the key went away after the `SET` read it) the script judges it.
    #[test]
    fn a_fast_path_commit_is_read_with_the_keys_expiry() {
        let token = LeaseToken::random();
        let v = format!("2,d,3,2,0,600000,{token},2,fp,out");
        let r = completed(&key(), v.as_bytes(), None, Some(1_000_600_000))
            .unwrap()
            .unwrap();
        assert_eq!((r.fence, r.attempt), (3, 2));
        assert_eq!(r.fingerprint.as_ref().unwrap().as_str(), "fp");
        assert_eq!(
            completion(r),
            (
                Timestamp::from_millis(1_000_000_000),
                Some(b"out".to_vec()),
                Some(token)
            )
        );
        assert!(completed(&key(), v.as_bytes(), None, None).is_none());
        // Past its retention by an injected clock: the key's expiry is retain_until.
        let at = Timestamp::from_millis(1_000_600_000);
        assert!(completed(&key(), v.as_bytes(), Some(at), Some(at.as_millis())).is_none());
    }

    #[test]
    fn anything_else_goes_to_the_script() {
        let token = LeaseToken::random();
        for v in [
            format!("2,i,1,1,5,9999,{token},0,"),
            format!("2,l,1,1,5,9999,{token},0,"),
            format!("1,c,1,1,5,9999,{token},0,"),
            format!("2,c,x,1,5,9999,{token},0,"),
            format!("2,c,1,1,5,9999,{token},9,ab"),
            format!("2,c,1,1,5,9999,{token},0,junk"),
            "not a record".to_owned(),
        ] {
            assert!(completed(&key(), v.as_bytes(), None, None).is_none(), "{v}");
        }
        // Past its retention by an injected clock.
        let v = format!("2,c,1,1,5,9999,{token},0,");
        assert!(
            completed(
                &key(),
                v.as_bytes(),
                Some(Timestamp::from_millis(9999)),
                None
            )
            .is_none()
        );
        assert!(
            completed(
                &key(),
                v.as_bytes(),
                Some(Timestamp::from_millis(9998)),
                None
            )
            .is_some()
        );
    }

    #[test]
    fn a_layout_value_with_an_invalid_record_is_corrupt() {
        for v in ["2,c,1,1,5,9999,not-a-uuid,0,", "2,c,0,1,5,9999,,0,"] {
            assert!(
                matches!(
                    completed(&key(), v.as_bytes(), None, None),
                    Some(Err(dedup_core::Error::Corrupt { .. }))
                ),
                "{v}"
            );
        }
    }

    #[test]
    fn the_fresh_claim_value_is_what_the_scripts_parse() {
        let token = LeaseToken::random();
        let options = ClaimOptions::lease(std::time::Duration::from_secs(2))
            .with_fingerprint(dedup_core::Fingerprint::new("f,p").unwrap());
        let server = fresh_claim("k", token, &options, 1000, None);
        let injected = fresh_claim("k", token, &options, 1000, Some(Timestamp::from_millis(50)));
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
        assert_eq!(key_expiry(Some(&Value::Int(-2))), None);
        assert_eq!(key_expiry(None), None);
        assert_eq!(args(server.expiry.as_ref().unwrap()), ["PEXPIRETIME", "k"]);
        assert_eq!(
            server.expires_at(key_expiry(Some(&Value::Int(10_000)))),
            Timestamp::from_millis(9_000)
        );
    }
}
