//! Three effects a handler writes to the application's own tables (an audit row, an
//! invoice, an event), each counted by its own effects query: the registration orders and
//! the failure every store's test expects of a handler that writes the audit row outside
//! its transaction. `effects.rs` (SQLite) and `mysql.rs` (MySQL / MariaDB) include it
//! (`mod three_effects;`) beside their own SQL.

use std::collections::BTreeMap;
use std::future::Future;

use dedup_core::BoxError;
use dedup_testkit::{Failure, Kit, Violation};

/// The effect the broken handler writes outside its transaction.
pub const BROKEN: &str = "audit";

/// The registration orders that put the broken effect first, second and third.
pub const ORDERS: [[&str; 3]; 3] = [
    ["audit", "invoice", "event"],
    ["invoice", "audit", "event"],
    ["invoice", "event", "audit"],
];

/// `kit` with one effects query per name of `order`, in that order; `count(name)` builds
/// the query of one effect.
pub fn register<Q, Fut>(
    mut kit: Kit,
    order: [&'static str; 3],
    count: impl Fn(&'static str) -> Q,
) -> Kit
where
    Q: Fn(Vec<String>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<BTreeMap<String, usize>, BoxError>> + Send + 'static,
{
    for name in order {
        kit = kit
            .effects_query(name, count(name))
            .expect("three different names");
    }
    kit
}

/// The broken handler's failure: one message, one worker, one kill or failure inside the
/// transaction, and the audit row written twice (the other two rolled back with it).
pub fn audit_repeated(f: &Failure, order: [&str; 3]) {
    assert!(f.reproduced, "{order:?}: {f}");
    assert_eq!(
        f.violations,
        vec![Violation::EffectRepeated {
            message: "m0".into(),
            effect: BROKEN.into(),
            times: 2,
            excused: 0,
        }],
        "{order:?}: {f}"
    );
    assert_eq!(
        (f.schedule.messages, f.schedule.workers),
        (1, 1),
        "{order:?}: {f}"
    );
    assert_eq!(
        f.schedule.kills() + f.schedule.failures(),
        1,
        "{order:?}: {f}"
    );
}
