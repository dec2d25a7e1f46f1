//! The Observed layer and the Inbox's metrics, counted exactly in scripted scenarios with a
//! `metrics-util` debugging recorder installed for this thread only (so tests running in
//! parallel do not see each other's metrics).

mod support;

use std::sync::Arc;
use std::time::Duration;

use dedup_core::layers::metric_names as m;
use dedup_core::layers::{Counts, ObserveOptions, Observed};
use dedup_core::{Handled, Inbox, InboxConfig, InboxError, Key, MemoryStore};
use support::Recorded;

type Store = Observed<MemoryStore>;

/// Run `scenario` on a current-thread runtime with paused time and a recorder of its own.
fn recorded<F: Future>(scenario: impl FnOnce(Inbox<Store>) -> F) -> (Recorded, Counts) {
    let (counts, snap) = support::recorded(|| async {
        let store = Observed::new(support::tokio_store(), ObserveOptions::new("memory"));
        let inbox = Inbox::from_arc(
            Arc::new(store),
            InboxConfig {
                lease: Duration::from_secs(3),
                renew_every: Some(Duration::from_secs(3600)), // no renewal: leases can be lost
                ..InboxConfig::default()
            },
        );
        scenario(inbox.clone()).await;
        inbox.store().counts()
    });
    (snap, counts)
}

fn key(id: &str) -> Key {
    Key::new("billing", id).unwrap()
}

async fn ok(inbox: &Inbox<Store>, id: &str) -> Result<Handled, InboxError> {
    inbox
        .handle(&key(id), None, |_| async { Ok::<_, &str>(None) })
        .await
}

#[test]
fn ten_claims_three_duplicates_one_takeover_one_lease_lost_are_counted_exactly() {
    let (snap, counts) = recorded(|inbox| async move {
        // 5 new messages: 5 claims acquired, 5 commits.
        for id in ["m1", "m2", "m3", "m4", "m5"] {
            assert!(matches!(
                ok(&inbox, id).await,
                Ok(Handled::Processed { .. })
            ));
        }
        // 3 duplicates.
        for id in ["m1", "m2", "m3"] {
            assert!(matches!(
                ok(&inbox, id).await,
                Ok(Handled::Duplicate { .. })
            ));
        }
        // m6: a slow first worker (10 s on a 3 s lease, never renewed) is taken over at 5 s
        // by a second delivery, which commits; the first worker's commit is lease lost.
        let m6 = key("m6");
        let slow = inbox.handle(&m6, None, |_| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok::<_, &str>(None)
        });
        let redelivery = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            ok(&inbox, "m6").await
        };
        let (slow, redelivery) = tokio::join!(slow, redelivery);
        assert!(
            matches!(slow, Err(InboxError::LeaseLost { .. })),
            "{slow:?}"
        );
        assert!(
            matches!(&redelivery, Ok(Handled::Processed { lease, .. }) if lease.attempt == 2),
            "{redelivery:?}"
        );
    });
    let claims = |outcome| snap.counter(m::CLAIMS_TOTAL, &[("outcome", outcome)]);
    assert_eq!(claims("acquired"), 6);
    assert_eq!(claims("takeover"), 1);
    assert_eq!(claims("completed"), 3);
    assert_eq!(claims("in_flight"), 0);
    assert_eq!(
        snap.counter(m::CLAIMS_TOTAL, &[("consumer", "billing")]),
        10
    );
    assert_eq!(snap.counter(m::CLAIMS_TOTAL, &[("backend", "memory")]), 10);
    assert_eq!(snap.counter(m::COMMITS_TOTAL, &[]), 6);
    assert_eq!(snap.counter(m::LEASE_LOST_TOTAL, &[("op", "commit")]), 1);
    assert_eq!(snap.counter(m::RELEASES_TOTAL, &[]), 0);
    assert_eq!(snap.counter(m::ERRORS_TOTAL, &[]), 0);
    // 10 claims + 7 commits (one lost), each timed.
    assert_eq!(
        snap.observations(m::OPERATION_DURATION_SECONDS, &[("op", "claim")]),
        10
    );
    assert_eq!(
        snap.observations(m::OPERATION_DURATION_SECONDS, &[("op", "commit")]),
        7
    );
    // 7 handler runs, all of which returned Ok (the slow one then lost its lease at commit).
    assert_eq!(
        snap.observations(m::HANDLER_DURATION_SECONDS, &[("result", "ok")]),
        7
    );
    assert_eq!(snap.observations(m::HANDLER_DURATION_SECONDS, &[]), 7);
    // The in-process counts say the same.
    assert_eq!(
        counts,
        Counts {
            acquired: 6,
            takeovers: 1,
            completed: 3,
            commits: 6,
            lease_lost: 1,
            ..Counts::default()
        }
    );
}

#[test]
fn a_poison_message_is_counted_as_takeovers_releases_and_one_dead_letter() {
    let (snap, counts) = recorded(|inbox| async move {
        let inbox = inbox.clone().with_config(InboxConfig {
            max_attempts: Some(2),
            ..inbox.config().clone()
        });
        let fail = |_| async { Err::<Option<Vec<u8>>, _>("malformed") };
        for _ in 0..2 {
            assert!(inbox.handle(&key("p"), None, fail).await.is_err());
        }
        for replay in [false, true, true] {
            let handled = inbox.handle(&key("p"), None, fail).await.unwrap();
            assert!(
                matches!(&handled, Handled::DeadLetter { attempts: 2, replay: r, cause: Some(c) }
                    if *r == replay && c.kind == "handler" && c.chain == ["malformed"] && c.attempt == 2),
                "{handled:?}"
            );
        }
    });
    // Claims: attempt 1, attempt 2 (after a release), attempt 3 (dead-lettered, committed),
    // then two duplicates.
    assert_eq!(
        counts,
        Counts {
            acquired: 1,
            takeovers: 2,
            completed: 2,
            releases: 2,
            commits: 1,
            ..Counts::default()
        }
    );
    assert_eq!(
        snap.counter(
            m::DEAD_LETTERS_TOTAL,
            &[("replay", "false"), ("mode", "lease")]
        ),
        1
    );
    assert_eq!(
        snap.counter(m::DEAD_LETTERS_TOTAL, &[("replay", "true")]),
        2
    );
    // The cause's kind labels the dead letters and the failed attempts (never the message
    // id: the labels stay bounded).
    assert_eq!(
        snap.counter(m::DEAD_LETTERS_TOTAL, &[("kind", "handler")]),
        3
    );
    assert_eq!(
        snap.counter(
            m::HANDLER_FAILURES_TOTAL,
            &[
                ("consumer", "billing"),
                ("kind", "handler"),
                ("mode", "lease")
            ]
        ),
        2
    );
    assert_eq!(
        snap.observations(
            m::HANDLER_DURATION_SECONDS,
            &[("result", "error"), ("mode", "lease")]
        ),
        2
    );
    assert_eq!(
        snap.counter(m::RELEASES_TOTAL, &[("consumer", "billing")]),
        2
    );
}

#[test]
fn errors_are_counted_by_kind_and_purges_by_records_removed() {
    let (snap, counts) = recorded(|inbox| async move {
        use dedup_core::{ClaimOptions, DedupStore, Fingerprint, PurgeOptions};
        let store = inbox.store();
        let invalid = ClaimOptions::lease(Duration::ZERO);
        assert!(store.claim(&key("x"), &invalid).await.is_err());
        let a = ClaimOptions::default().with_fingerprint(Fingerprint::of_payload(b"a"));
        let b = ClaimOptions::default().with_fingerprint(Fingerprint::of_payload(b"b"));
        let lease = store
            .claim(&key("f"), &a)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        assert!(store.claim(&key("f"), &b).await.is_err());
        store.commit(&lease, None).await.unwrap();
        tokio::time::sleep(Duration::from_secs(120)).await;
        let report = store
            .purge(&PurgeOptions::older_than(Duration::from_secs(60)))
            .await;
        assert_eq!(report.unwrap().total(), 1);
    });
    assert_eq!(
        snap.counter(
            m::ERRORS_TOTAL,
            &[("kind", "invalid_input"), ("op", "claim")]
        ),
        1
    );
    assert_eq!(snap.counter(m::FINGERPRINT_MISMATCH_TOTAL, &[]), 1);
    assert_eq!(snap.counter(m::PURGED_TOTAL, &[("backend", "memory")]), 1);
    assert_eq!(
        (counts.errors, counts.fingerprint_mismatch, counts.purged),
        (1, 1, 1)
    );
}
