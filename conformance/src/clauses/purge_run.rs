//! The last purge run: every purge that finishes is kept in the store, for every handle (and
//! so every process) to read through [`Admin::last_purge`].

use std::time::Duration;

use dedup_core::{Admin, DedupStore, PurgeOptions, PurgeReport, PurgeRun};

use crate::StoreFactory;
use crate::support::{acquire, complete, key, setup};

const HOUR: Duration = Duration::from_secs(3600);

async fn last_purge<S: Admin + ?Sized>(store: &S) -> Option<PurgeRun> {
    store
        .last_purge()
        .await
        .unwrap_or_else(|e| panic!("last_purge failed: {e:?}"))
}

async fn purge<S: DedupStore + ?Sized>(store: &S, options: &PurgeOptions) -> PurgeReport {
    store
        .purge(options)
        .await
        .unwrap_or_else(|e| panic!("purge({options:?}) failed: {e:?}"))
}

/// A store where no purge ran has no last run. A purge that finishes is kept as the last
/// run, read the same from a second handle: when it finished (the store's clock), how many
/// it removed, how long it took (in whole milliseconds) and whether it stopped early at its
/// batch limit. The next run replaces it, also one that removed nothing.
pub async fn a_finished_purge_is_kept_as_the_last_run<F: StoreFactory>(factory: &F)
where
    F::Store: Admin,
{
    let (ctx, store) = setup(factory, "a_finished_purge_is_kept_as_the_last_run").await;
    let other = factory.open(&ctx).await;
    assert_eq!(
        last_purge(&store).await,
        None,
        "no purge ran on a new store"
    );
    for i in 0..3 {
        complete(&store, &key(&format!("old-{i}")), None).await;
    }
    ctx.clock.advance(2 * HOUR);
    acquire(&store, &key("live")).await;

    let limited = PurgeOptions::older_than(HOUR)
        .batch_size(1)
        .max_batches(2)
        .unpaced();
    let first = purge(&store, &limited).await;
    let first_at = ctx.now();
    let kept = last_purge(&other).await.expect("a finished purge is kept");
    assert_eq!(
        kept,
        PurgeRun::of(&first, first_at),
        "the second handle reads the run as it finished: {first:?}"
    );
    assert_eq!(
        (kept.removed, kept.stopped_early),
        (2, true),
        "two batches of one, stopped at the limit: {kept:?}"
    );
    assert_eq!(kept.took, Duration::from_millis(kept.took_ms() as u64));

    ctx.clock.advance(Duration::from_secs(5));
    let rest = purge(&other, &PurgeOptions::older_than(HOUR).unpaced()).await;
    let kept = last_purge(&store).await.expect("the second run is kept");
    assert_eq!(
        (kept.finished_at, kept.removed, kept.stopped_early),
        (ctx.now(), 1, false),
        "the later run, purged to the end, replaced the first: {rest:?}"
    );

    ctx.clock.advance(Duration::from_secs(5));
    purge(&store, &PurgeOptions::older_than(HOUR).unpaced()).await;
    let kept = last_purge(&store).await.expect("an empty run is kept");
    assert_eq!(
        (kept.finished_at, kept.removed),
        (ctx.now(), 0),
        "a run that found nothing is still the last run"
    );
}
