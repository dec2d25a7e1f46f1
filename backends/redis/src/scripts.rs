//! The Lua scripts and their invocation: every operation but a fresh-key claim (a plain
//! `SET`, see [`crate::schema`]) is one of them, run atomically by the server.
//!
//! Each script is `lua/now.lua` ("now"), `lua/record.lua` (the shared prelude: the record
//! layouts, loading and validating a record of either layout, writing layout 2) and the
//! operation's own file; a commit first tries `lua/commit_fast.lua`, the common case
//! without the prelude's setup. Claim and commit are
//! written once, as a function `op` (`lua/claim.lua`, `lua/commit.lua`), run on one key by
//! `lua/one.lua` and on a whole batch by `lua/many.lua`. They are invoked with `EVALSHA`; a
//! server that does not know a script (`NOSCRIPT`: restarted, failed over, `SCRIPT
//! FLUSH`ed) gets them all loaded again with `SCRIPT LOAD` and the call is retried (see
//! [`crate::conn`]).
//!
//! A [`Call`] is one invocation on one key (`EVALSHA sha 1 key args...`); [`many_cmd`] folds
//! the calls of one hash slot into one call of `lua/many.lua`. Where they are sent is
//! [`crate::conn`] (one call) and [`crate::pipeline`] (batches).

use std::sync::LazyLock;

use redis::{Cmd, ToRedisArgs};

use crate::schema;

/// One script: its source and SHA1.
#[derive(Debug)]
pub(crate) struct Lua {
    /// Source, as sent by `SCRIPT LOAD`.
    pub(crate) code: &'static str,
    /// SHA1 of `code`, as `EVALSHA` wants it.
    pub(crate) sha: String,
}

impl Lua {
    fn new(code: &'static str) -> Self {
        Lua {
            code,
            sha: redis::Script::new(code).get_hash().to_owned(),
        }
    }
}

macro_rules! lua {
    ($name:ident, $($file:literal),+) => {
        pub(crate) static $name: LazyLock<Lua> = LazyLock::new(|| {
            Lua::new(concat!(
                include_str!("../lua/now.lua"),
                $("\n", include_str!(concat!("../lua/", $file))),+
            ))
        });
    };
}

lua!(CLAIM, "record.lua", "claim.lua", "one.lua");
lua!(CLAIM_MANY, "record.lua", "claim.lua", "many.lua");
// The common commit runs before record.lua's setup (see lua/commit_fast.lua).
lua!(
    COMMIT,
    "commit_fast.lua",
    "commit_one.lua",
    "record.lua",
    "commit.lua",
    "one.lua"
);
lua!(
    COMMIT_MANY,
    "commit_fast.lua",
    "record.lua",
    "commit.lua",
    "many.lua"
);
lua!(RENEW, "record.lua", "renew.lua");
lua!(RELEASE, "record.lua", "release.lua");
lua!(GET, "record.lua", "get.lua");
lua!(FORGET, "record.lua", "forget.lua");
lua!(REVOKE, "record.lua", "revoke.lua");
lua!(PURGE_MANY, "record.lua", "purge.lua", "many.lua");
lua!(PURGE_STEP, "record.lua", "purge.lua", "purge_step.lua");
lua!(PURGE_RUN, "purge_run.lua");

/// Every script, for `SCRIPT LOAD`.
pub(crate) fn all() -> [&'static Lua; 12] {
    [
        &CLAIM,
        &CLAIM_MANY,
        &COMMIT,
        &COMMIT_MANY,
        &RENEW,
        &RELEASE,
        &GET,
        &FORGET,
        &REVOKE,
        &PURGE_MANY,
        &PURGE_STEP,
        &PURGE_RUN,
    ]
}

/// One script invocation on one key.
pub(crate) struct Call {
    lua: &'static Lua,
    key: Vec<u8>,
    args: Vec<Vec<u8>>,
}

impl Call {
    /// `lua` on `key`, no arguments yet.
    pub(crate) fn new(lua: &'static Lua, key: impl Into<Vec<u8>>) -> Self {
        Call {
            lua,
            key: key.into(),
            args: Vec::with_capacity(6),
        }
    }

    /// Append `ARGV[n]`.
    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// `EVALSHA sha 1 key args...`.
    pub(crate) fn cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.lua.sha).arg(1).arg(&self.key);
        for a in &self.args {
            cmd.arg(a);
        }
        cmd
    }

    /// The cluster hash slot of its key.
    pub(crate) fn slot(&self) -> u16 {
        schema::slot(&self.key)
    }
}

/// How many leading arguments of a claim or commit [`Call`] every item of a batch shares
/// (`now`, retention: see `lua/one.lua` and `lua/many.lua`); they are sent once.
pub(crate) const SHARED_ARGS: usize = 2;

/// `EVALSHA many` over the calls at `group` (all on one hash slot, all with the same first
/// [`SHARED_ARGS`] arguments): their keys, the shared arguments once, then each call's own
/// arguments in order.
pub(crate) fn many_cmd(many: &Lua, calls: &[Call], group: &[usize]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&many.sha).arg(group.len());
    for &i in group {
        cmd.arg(&calls[i].key);
    }
    if let Some(&first) = group.first() {
        let shared = &calls[first].args[..SHARED_ARGS];
        debug_assert!(
            group
                .iter()
                .all(|&i| calls[i].args[..SHARED_ARGS] == *shared)
        );
        for a in shared {
            cmd.arg(a);
        }
    }
    for &i in group {
        for a in &calls[i].args[SHARED_ARGS..] {
            cmd.arg(a);
        }
    }
    cmd
}
