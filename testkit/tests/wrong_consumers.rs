//! The kit can fail: deliberately wrong consumers, each caught with a shrunk
//! counter-example whose shape is asserted. And a right one passes 256 cases on
//! `MemoryStore` in seconds.

use std::time::Instant;

use dedup_core::{BoxError, Claim, ClaimOptions};
use dedup_testkit::{Consumer, Cx, Failure, Kit, Mode, Violation, lease};
use futures::future::BoxFuture;

/// A lease-mode consumer that does it right: the charge carries the idempotency key.
fn right() -> impl Consumer {
    lease(|_message, lease, fx| async move {
        fx.call_with_key("charge", &lease.idempotency_key()).await?;
        Ok(Some(b"charged".to_vec()))
    })
}

fn story(f: &Failure) -> String {
    f.story.join("\n")
}

#[test]
fn a_right_lease_consumer_passes_256_cases_on_memory_store_in_seconds() {
    let started = Instant::now();
    let report = Kit::new().cases(256).expect_effect("charge").check(right());
    let took = started.elapsed();
    eprintln!(
        "256 cases on MemoryStore: {:.2} s (seed {})",
        took.as_secs_f64(),
        report.seed
    );
    eprintln!("kills by window: {:?}", report.kills);
    eprintln!("failures injected: {:?}", report.failures);
    assert_eq!(report.runs, 256);
    assert!(took.as_secs() < 60, "256 cases took {took:?}");
    // With the key the provider never charges twice: nothing to excuse.
    assert_eq!(report.excused_repeats, 0, "{report:?}");
    // Every window of the lease-mode consumer was hit by some kill.
    for window in [
        "before the claim",
        "before effect \"charge\"",
        "before the commit",
        "before the ack",
    ] {
        assert!(report.kills.contains_key(window), "{window}: {report:?}");
    }
}

#[test]
fn a_lease_consumer_without_the_key_passes_lease_mode_its_repeats_are_excused_kills() {
    // Charging without the idempotency key repeats the charge after a kill between the
    // charge and the commit: lease mode allows exactly that, and the kit did see repeats.
    let report = Kit::new().cases(128).expect_effect("charge").check(lease(
        |_message, _lease, fx| async move {
            fx.call("charge").await?;
            Ok(None)
        },
    ));
    assert!(report.excused_repeats > 0, "{report:?}");
}

/// Check, then act: reads the record and, when there is none, invoices and only then
/// marks the key (claim and commit). Two copies of one message handled at once both read
/// "absent" and both invoice. (When a record exists it claims first, as it should: that
/// keeps the race the only bug, so the counter-example is the race. Acting on "in flight"
/// as well would repeat the invoice after a crash, which the kit finds too.)
struct CheckThenAct;

impl Consumer for CheckThenAct {
    fn mode(&self) -> Mode {
        Mode::Lease
    }

    fn consume(&self, cx: Cx) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            let (store, key, fx) = (cx.store(), cx.key(), cx.effects());
            let absent = store.get(&key).await?.is_none();
            if absent {
                fx.call("invoice").await?;
            }
            match store.claim(&key, &ClaimOptions::default()).await? {
                Claim::Acquired(lease) => {
                    if !absent {
                        fx.call("invoice").await?;
                    }
                    store.commit(&lease, None).await?;
                    cx.ack().await?;
                }
                Claim::Completed { .. } => cx.ack().await?,
                Claim::InFlight { .. } => cx.nack().await?,
            }
            Ok(())
        })
    }
}

#[test]
fn check_then_act_is_caught_with_two_invoices_from_one_duplicate_delivery() {
    let f = Kit::new()
        .expect_effect("invoice")
        .run(CheckThenAct)
        .expect_err("check-then-act must be caught");
    eprintln!("{f}");
    assert!(f.reproduced, "{f}");
    assert_eq!(
        f.violations,
        vec![Violation::EffectRepeated {
            message: "m0".into(),
            effect: "invoice".into(),
            times: 2,
            excused: 0,
        }],
        "{f}"
    );
    // The smallest schedule: one message delivered twice, two workers, nothing killed.
    assert_eq!((f.schedule.messages, f.schedule.workers), (1, 2), "{f}");
    assert_eq!(f.schedule.duplicates(), 1, "{f}");
    assert_eq!(f.schedule.kills(), 0, "{f}");
    assert_eq!(f.schedule.failures(), 0, "{f}");
    let s = story(&f);
    assert!(s.contains("w0: reads m0: absent"), "{s}");
    assert!(s.contains("w1: reads m0: absent"), "{s}");
    assert!(s.contains("w0: effect \"invoice\" for m0"), "{s}");
    assert!(s.contains("w1: effect \"invoice\" for m0"), "{s}");
    // The printed failure carries the seed that replays it.
    assert!(f.to_string().contains(&f.seed), "{f}");
}

#[test]
fn a_handler_that_commits_before_its_side_effect_completes_is_caught_losing_the_charge() {
    // The charge is handed to a background task and the handler returns at once: the
    // inbox commits while the charge is still under way, and a worker that dies then
    // leaves a completed key without its charge. (With failures injected the kit also
    // finds the other face of it: a charge made after a commit that failed, repeated by
    // the retry; kills alone keep this test to the lost charge.)
    let f = Kit::new()
        .inject_failures(false)
        .expect_effect("charge")
        .run(lease(|_message, _lease, fx| async move {
            tokio::spawn(async move {
                let _ = fx.call("charge").await;
            });
            Ok(Some(b"charged".to_vec()))
        }))
        .expect_err("commit before the effect must be caught");
    assert!(f.reproduced, "{f}");
    assert!(
        f.violations.contains(&Violation::EffectMissing {
            message: "m0".into(),
            effect: "charge".into(),
        }),
        "{f}"
    );
    assert!(
        !f.violations
            .iter()
            .any(|v| matches!(v, Violation::NotProcessed { .. })),
        "the key itself is completed: {f}"
    );
    assert_eq!((f.schedule.messages, f.schedule.workers), (1, 1), "{f}");
    assert_eq!(f.schedule.kills(), 1, "{f}");
    let s = story(&f);
    assert!(s.contains("w0: commits m0: done"), "{s}");
    assert!(s.contains("w0: dies before effect \"charge\""), "{s}");
}

/// Acks before committing: claims, acks the delivery, then charges and commits. A worker
/// that dies after the ack leaves nothing to redeliver.
struct AckBeforeCommit;

impl Consumer for AckBeforeCommit {
    fn mode(&self) -> Mode {
        Mode::Lease
    }

    fn consume(&self, cx: Cx) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            let (store, key) = (cx.store(), cx.key());
            match store.claim(&key, &ClaimOptions::default()).await? {
                Claim::Acquired(lease) => {
                    cx.ack().await?;
                    cx.effects()
                        .call_with_key("charge", &lease.idempotency_key())
                        .await?;
                    store.commit(&lease, None).await?;
                }
                Claim::Completed { .. } => cx.ack().await?,
                Claim::InFlight { .. } => cx.nack().await?,
            }
            Ok(())
        })
    }
}

#[test]
fn a_consumer_that_acks_before_committing_is_caught_losing_the_message() {
    let f = Kit::new()
        .expect_effect("charge")
        .run(AckBeforeCommit)
        .expect_err("ack before commit must be caught");
    assert!(f.reproduced, "{f}");
    assert!(
        f.violations.contains(&Violation::NotProcessed {
            message: "m0".into()
        }),
        "{f}"
    );
    assert!(
        f.violations.contains(&Violation::EffectMissing {
            message: "m0".into(),
            effect: "charge".into(),
        }),
        "{f}"
    );
    // One message, one worker, and one interruption of the charge after the ack: a kill
    // there, or the charge failing (the consumer then returns its error, but the ack is
    // gone), whichever proptest met first.
    assert_eq!((f.schedule.messages, f.schedule.workers), (1, 1), "{f}");
    assert_eq!(f.schedule.kills() + f.schedule.failures(), 1, "{f}");
    let s = story(&f);
    assert!(s.contains("w0: acks m0"), "{s}");
    assert!(
        s.contains("w0: dies before effect \"charge\"")
            || s.contains("w0: effect \"charge\" for m0 fails (injected)"),
        "{s}"
    );
}

#[test]
fn a_key_that_changes_per_attempt_is_not_an_idempotency_key_and_is_caught() {
    // The key carries the fence, so the retry after a kill is a new key to the provider:
    // an effect made with a key is never excused.
    let f = Kit::new()
        .expect_effect("charge")
        .run(lease(|_message, lease, fx| async move {
            let key = format!("{}-{}", lease.idempotency_key(), lease.fence);
            fx.call_with_key("charge", &key).await?;
            Ok(None)
        }))
        .expect_err("a per-attempt key must be caught");
    assert!(f.reproduced, "{f}");
    assert_eq!(
        f.violations,
        vec![Violation::EffectRepeated {
            message: "m0".into(),
            effect: "charge".into(),
            times: 2,
            excused: 0,
        }],
        "{f}"
    );
    // One message, one worker, the commit after the charge interrupted (killed, or
    // failed), and the retry as attempt 2 with another key.
    assert_eq!((f.schedule.messages, f.schedule.workers), (1, 1), "{f}");
    assert_eq!(f.schedule.kills() + f.schedule.failures(), 1, "{f}");
    let s = story(&f);
    assert!(
        s.contains("w0: dies before the commit") || s.contains("w0: the commit for m0 fails"),
        "{s}"
    );
    assert!(s.contains("attempt 2, fence 2"), "{s}");
}

#[test]
fn a_failure_replays_from_its_seed_to_the_same_schedule_and_story() {
    let first = Kit::new()
        .expect_effect("invoice")
        .run(CheckThenAct)
        .expect_err("caught");
    let again = Kit::new()
        .expect_effect("invoice")
        .seed(&first.seed)
        .expect("the printed seed is a seed")
        .run(CheckThenAct)
        .expect_err("caught again");
    assert_eq!(first.schedule, again.schedule);
    assert_eq!(first.story, again.story);
}
