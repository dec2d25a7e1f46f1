//! Decoding the purge scripts' replies: a purge step on one node (`lua/purge_step.lua`) and
//! the purge of one key (`lua/purge.lua`, run by `lua/many.lua`).

use std::time::Duration;

use redis::{FromRedisValue, RedisError, RedisResult, Value};

/// `purge_step.lua`'s reply: one purge step on one node.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PurgeStep {
    /// Where `SCAN` goes on from (0: the node's keyspace is walked), or `None` when the step
    /// did not scan (given no cursor, or out of room or time first): the walk stays where
    /// it was. Never the cursor given back, which at a walk's start is 0 too.
    pub(crate) cursor: Option<u64>,
    /// Completed records removed.
    pub(crate) completed: u64,
    /// Expired in-flight records removed.
    pub(crate) expired: u64,
    /// Keys not looked at (out of room or time), in the order found.
    pub(crate) left: Vec<Vec<u8>>,
    /// Keys the node no longer owns (their slot moved since `SCAN` found them).
    pub(crate) elsewhere: Vec<Vec<u8>>,
    /// How long the step held the server.
    pub(crate) server_time: Duration,
}

/// Decode `purge_step.lua`'s reply.
pub(crate) fn purge_step(value: Value) -> RedisResult<PurgeStep> {
    type Keys = Vec<Vec<u8>>;
    let (cursor, completed, expired, left, elsewhere, server_us): (
        String,
        u64,
        u64,
        Keys,
        Keys,
        u64,
    ) = FromRedisValue::from_redis_value(value)?;
    let cursor = match cursor.as_str() {
        "" => None,
        c => Some(c.parse().map_err(|_| {
            RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "purge step cursor",
                c.to_owned(),
            ))
        })?),
    };
    Ok(PurgeStep {
        cursor,
        completed,
        expired,
        left,
        elsewhere,
        server_time: Duration::from_micros(server_us),
    })
}

/// What `purge.lua` did to one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purged {
    /// Removed a completed record.
    Completed,
    /// Removed an expired in-flight record.
    Expired,
    /// Nothing counted (kept, already gone, past the store's retention, or foreign).
    Nothing,
}

/// `purge.lua`'s reply (a bare status letter).
pub(crate) fn purged(value: &Value) -> Purged {
    let tag: &[u8] = match value {
        Value::BulkString(b) => b,
        Value::SimpleString(s) => s.as_bytes(),
        _ => b"",
    };
    match tag {
        b"c" => Purged::Completed,
        b"e" => Purged::Expired,
        _ => Purged::Nothing,
    }
}
