//! The Lua scripts: every operation but a fresh-key claim (`src/record.rs`) is one of them,
//! run atomically by the server.
//!
//! Each script is `lua/now.lua` ("now"), `lua/record.lua` (the shared prelude: the record
//! layouts, loading and validating a record of either layout, writing layout 2) and the
//! operation's own file; a commit first tries `lua/commit_fast.lua`, the common case
//! without the prelude's setup. Claim and commit are
//! written once, as a function `op` (`lua/claim.lua`, `lua/commit.lua`), run on one key by
//! `lua/one.lua` and on a whole batch by `lua/many.lua`. They are invoked with `EVALSHA`; a
//! server that does not know a script (`NOSCRIPT`: restarted, failed over, `SCRIPT
//! FLUSH`ed) gets them all loaded again with `SCRIPT LOAD` and the call is retried.

use std::sync::LazyLock;

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
lua!(PURGE_MANY, "record.lua", "purge.lua", "many.lua");
lua!(PURGE_STEP, "record.lua", "purge.lua", "purge_step.lua");

/// Every script, for `SCRIPT LOAD`.
pub(crate) fn all() -> [&'static Lua; 9] {
    [
        &CLAIM,
        &CLAIM_MANY,
        &COMMIT,
        &COMMIT_MANY,
        &RENEW,
        &RELEASE,
        &GET,
        &PURGE_MANY,
        &PURGE_STEP,
    ]
}
