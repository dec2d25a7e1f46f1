//! MemoryStore, the reference model, passes the whole suite.

dedup_conformance::suite!(dedup_conformance::MemoryFactory::default());
dedup_conformance::admin_suite!(dedup_conformance::MemoryFactory::default());

/// Several purgers and claimers at once on `MemoryStore` (see `dedup_conformance::purgers`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_purgers_and_claimers_on_200_000_records() {
    use dedup_conformance::purgers::{Purging, purgers_and_claimers_at_once};
    let clock = std::sync::Arc::new(dedup_core::ManualClock::starting_now());
    let store = dedup_core::MemoryStore::with_clock(clock.clone());
    let figures = purgers_and_claimers_at_once(vec![store], clock, &Purging::default()).await;
    println!("{figures:#?}");
}

mod outbox {
    dedup_conformance::outbox_suite!(dedup_conformance::outbox::MemoryOutboxFactory::default());
}
