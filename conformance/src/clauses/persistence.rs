//! Handles and persistence: records are shared by every handle opened on a namespace, and
//! survive dropping and reopening the store when the store says it is persistent.

use dedup_core::DedupStore;

use crate::StoreFactory;
use crate::support::{acquire, assert_completed_by, assert_holds, commit_ok, complete, key, setup};

/// A second handle on the same namespace sees the first one's records, and a lease taken
/// on one handle commits through the other. When
/// [`Capabilities::persistent`](dedup_core::Capabilities::persistent) is set, a committed
/// record (outcome included) and an in-flight lease survive dropping every handle and
/// opening the store again; for other stores that last part is reported and skipped.
pub async fn a_committed_record_survives_reopening_the_store<F: StoreFactory>(factory: &F) {
    let (ctx, first) = setup(factory, "a_committed_record_survives_reopening_the_store").await;
    let done = complete(&first, &key("done"), Some(b"kept\0bytes")).await;
    let committed_at = ctx.now();
    let second = factory.open(&ctx).await;
    assert_completed_by(&second, &done, committed_at, Some(b"kept\0bytes")).await;
    let moved = acquire(&first, &key("moved")).await;
    commit_ok(&second, &moved, None).await;
    assert_completed_by(&first, &moved, committed_at, None).await;
    let held = acquire(&second, &key("held")).await;

    if !first.capabilities().persistent {
        eprintln!(
            "a_committed_record_survives_reopening_the_store: store is not persistent; reopen part skipped"
        );
        return;
    }
    drop(first);
    drop(second);
    let reopened = factory.open(&ctx).await;
    assert_completed_by(&reopened, &done, committed_at, Some(b"kept\0bytes")).await;
    assert_completed_by(&reopened, &moved, committed_at, None).await;
    assert_holds(&reopened, &held, "an in-flight lease after reopening").await;
    commit_ok(&reopened, &held, Some(b"after restart")).await;
}
