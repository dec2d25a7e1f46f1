//! Hostile input, property-tested: keys, fingerprints, outcomes and leases at and past
//! every limit, NUL bytes, odd Unicode, quotes, SQL and glob / hash-tag characters, and
//! hostile table / prefix names. Each is a typed error that writes nothing, or is stored
//! and read back exactly; never a panic, never a driver error.

use std::time::Duration;

use dedup_core::{
    Claim, ClaimOptions, DedupStore, Error, Fingerprint, Key, MAX_FINGERPRINT_LEN, MAX_LEASE,
    MAX_OUTCOME_LEN, MIN_LEASE, RecordState,
};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestCaseResult, TestRunner};

use crate::StoreFactory;
use crate::support::{setup, unchanged};

/// Strings that have broken stores somewhere: quotes, SQL, NUL, LIKE / glob / hash-tag
/// characters, separators, odd Unicode (combining marks, RTL, BOM, emoji, non-characters).
const NASTY: &[&str] = &[
    "",
    "\0",
    "a\0b",
    "'",
    "\"",
    "';DROP TABLE dedup;--",
    "\"); DELETE FROM x; --",
    "%",
    "_",
    "*",
    "?",
    "[a-z]",
    "{tag}",
    "\\",
    ":",
    "/",
    " ",
    "\t\r\n",
    "e\u{301}",
    "\u{e9}",
    "\u{202e}abc",
    "\u{feff}",
    "\u{1f600}",
    "\u{fffe}",
    "\u{10ffff}",
    "NULL",
];

/// A string near `limit` bytes: `limit - 1`, `limit` or `limit + 1` bytes of one-, two-
/// or four-byte characters (the last char may straddle the limit).
fn near_limit(limit: usize) -> impl Strategy<Value = String> {
    (select(vec!["a", "\u{e9}", "\u{1f600}"]), 0..3usize).prop_map(move |(c, delta)| {
        let target = limit + delta - 1;
        let mut s = c.repeat(target / c.len());
        s.push_str(&"b".repeat(target - s.len()));
        s
    })
}

fn hostile_string(limit: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        select(NASTY).prop_map(str::to_owned),
        near_limit(limit),
        ".{0,40}",
        (select(NASTY), ".{0,8}", select(NASTY)).prop_map(|(a, b, c)| format!("{a}{b}{c}")),
    ]
}

fn outcome() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        Just(None),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Some),
        (
            select(vec![
                MAX_OUTCOME_LEN - 1,
                MAX_OUTCOME_LEN,
                MAX_OUTCOME_LEN + 1
            ]),
            any::<u8>()
        )
            .prop_map(|(n, b)| Some(vec![b; n])),
    ]
}

fn lease() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(MIN_LEASE),
        Just(MAX_LEASE),
        Just(MAX_LEASE + Duration::from_millis(1)),
        (1u64..60_000).prop_map(Duration::from_millis),
    ]
}

/// One hostile case: raw consumer, message id, fingerprint, lease, outcome.
#[derive(Clone, Debug)]
struct Case {
    consumer: String,
    message_id: String,
    fingerprint: Option<String>,
    lease: Duration,
    outcome: Option<Vec<u8>>,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        hostile_string(Key::MAX_CONSUMER_LEN),
        hostile_string(Key::MAX_MESSAGE_ID_LEN),
        proptest::option::of(hostile_string(MAX_FINGERPRINT_LEN)),
        lease(),
        outcome(),
    )
        .prop_map(|(consumer, message_id, fingerprint, lease, outcome)| Case {
            consumer,
            message_id,
            fingerprint,
            lease,
            outcome,
        })
}

fn valid_part(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && !s.contains('\0')
}

fn fail(what: String) -> TestCaseError {
    TestCaseError::fail(what)
}

/// `result` must be `Err(InvalidInput)`.
fn invalid<T: std::fmt::Debug>(result: dedup_core::Result<T>, what: &str) -> TestCaseResult {
    match result {
        Err(Error::InvalidInput { .. }) => Ok(()),
        other => Err(fail(format!(
            "{what}: expected InvalidInput, got {other:?}"
        ))),
    }
}

async fn run_case<S: DedupStore>(store: &S, case: Case) -> TestCaseResult {
    let key = match Key::new(case.consumer.clone(), case.message_id.clone()) {
        Err(e) => {
            let expected_valid = valid_part(&case.consumer, Key::MAX_CONSUMER_LEN)
                && valid_part(&case.message_id, Key::MAX_MESSAGE_ID_LEN);
            prop_assert!(!expected_valid, "a valid key was rejected: {e:?}");
            return invalid(Err::<(), _>(e), "Key::new");
        }
        Ok(key) => key,
    };
    let fingerprint = match case.fingerprint.as_deref().map(Fingerprint::new) {
        None => None,
        Some(Ok(fp)) => Some(fp),
        Some(Err(e)) => {
            let s = case.fingerprint.as_deref().unwrap_or_default();
            prop_assert!(
                !valid_part(s, MAX_FINGERPRINT_LEN),
                "a valid fingerprint was rejected"
            );
            return invalid(Err::<(), _>(e), "Fingerprint::new");
        }
    };
    if read(store, &key, "nothing").await?.is_some() {
        return Ok(()); // a repeated case (shrinking): its key is taken
    }
    let options = ClaimOptions {
        lease: case.lease,
        fingerprint: fingerprint.clone(),
    };
    let claim = store.claim(&key, &options).await;
    if case.lease < MIN_LEASE || case.lease > MAX_LEASE {
        invalid(claim, "claim with a lease out of bounds")?;
        prop_assert_eq!(
            read(store, &key, "a rejected claim").await?,
            None,
            "a rejected claim wrote"
        );
        return Ok(());
    }
    let lease = match claim {
        Ok(Claim::Acquired(lease)) => lease,
        other => return Err(fail(format!("the first claim of {key:?}: {other:?}"))),
    };
    let record = read(store, &key, "claim")
        .await?
        .ok_or_else(|| fail("no record after a claim".into()))?;
    prop_assert_eq!(&record.key, &key, "the key must round-trip byte for byte");
    prop_assert_eq!(
        &record.fingerprint,
        &fingerprint,
        "the fingerprint must round-trip"
    );

    let oversized = case
        .outcome
        .as_ref()
        .is_some_and(|o| o.len() > MAX_OUTCOME_LEN);
    let commit = unchanged_if(
        store,
        &key,
        oversized,
        store.commit(&lease, case.outcome.as_deref()),
    )
    .await?;
    if oversized {
        invalid(commit, "commit of an oversized outcome")?;
        return Ok(());
    }
    commit.map_err(|e| fail(format!("commit: {e:?}")))?;
    match store.claim(&key, &ClaimOptions::lease(MIN_LEASE)).await {
        Ok(Claim::Completed { outcome, .. }) => {
            prop_assert_eq!(
                outcome,
                case.outcome,
                "the outcome must round-trip byte for byte"
            )
        }
        other => return Err(fail(format!("a duplicate claim: {other:?}"))),
    }
    if let Some(fp) = fingerprint {
        let other = Fingerprint::new(if fp.as_str() == "x" { "y" } else { "x" }).expect("valid");
        let result = store
            .claim(
                &key,
                &ClaimOptions::lease(MIN_LEASE).with_fingerprint(other),
            )
            .await;
        prop_assert!(
            matches!(result, Err(Error::FingerprintMismatch { .. })),
            "another fingerprint must mismatch: {result:?}"
        );
    }
    match read(store, &key, "commit").await?.map(|r| r.state) {
        Some(RecordState::Completed { token, .. }) => prop_assert_eq!(token, Some(lease.token)),
        other => return Err(fail(format!("after commit: {other:?}"))),
    }
    Ok(())
}

async fn read<S: DedupStore>(
    store: &S,
    key: &Key,
    after: &str,
) -> Result<Option<dedup_core::Record>, TestCaseError> {
    store
        .get(key)
        .await
        .map_err(|e| fail(format!("get after {after}: {e:?}")))
}

/// Run `op`; when `must_not_write`, the record must be the same before and after.
async fn unchanged_if<S: DedupStore, T>(
    store: &S,
    key: &Key,
    must_not_write: bool,
    op: impl Future<Output = T>,
) -> Result<T, TestCaseError> {
    if must_not_write {
        Ok(unchanged(store, key, "a rejected commit", op).await)
    } else {
        Ok(op.await)
    }
}

/// Property: for hostile keys, fingerprints, leases and outcomes (see the module docs),
/// `Key::new` / `Fingerprint::new` reject exactly what the limits say with
/// `InvalidInput`; a claim with a lease out of bounds is `InvalidInput` and writes
/// nothing; an oversized outcome is `InvalidInput` and leaves the record as it was;
/// everything accepted is stored and read back byte for byte (key, fingerprint, outcome),
/// and a different fingerprint then mismatches. `PROPTEST_CASES` cases (256 by default).
pub async fn hostile_input_is_a_typed_error_or_round_trips<F: StoreFactory>(factory: &F) {
    let (_ctx, store) = setup(factory, "hostile_input_is_a_typed_error_or_round_trips").await;
    let handle = tokio::runtime::Handle::current();
    let config = Config {
        failure_persistence: None,
        ..Config::default()
    };
    let result = tokio::task::block_in_place(|| {
        TestRunner::new(config)
            .run(&cases(), |case| handle.block_on(run_case(&store, case)))
            .map_err(Box::new)
    });
    if let Err(failure) = result {
        panic!("hostile input broke the store: {failure}");
    }
}

/// Hostile table / schema / key-prefix names (quotes, SQL, comment markers, Unicode,
/// separators): each is `InvalidInput` from the constructor, or accepted and then a
/// working store (claim, get) whose records round-trip. Skipped when the factory opens no
/// named stores.
pub async fn hostile_names_are_rejected_or_work<F: StoreFactory>(factory: &F) {
    let ctx = crate::TestContext::new("hostile_names_are_rejected_or_work");
    let unique = &ctx.namespace[ctx.namespace.len() - 8..];
    let names = [
        "a\"b",
        "a'b",
        "a;b",
        "a--b",
        "a/*b*/",
        "Robert'); DROP TABLE x;--",
        "a.b",
        "a:b",
        "a b",
        "e\u{301}",
        "\u{202e}x",
    ];
    for name in names {
        let name = format!("{name}{unique}");
        match factory.open_named(&ctx, &name).await {
            None => {
                eprintln!("hostile_names_are_rejected_or_work: no named stores; skipped");
                return;
            }
            Some(Err(Error::InvalidInput { .. })) => {}
            Some(Err(other)) => {
                panic!("name {name:?}: expected InvalidInput or a store, got {other:?}")
            }
            Some(Ok(store)) => {
                let key = Key::new("hostile", &name).expect("valid key");
                let claim = store.claim(&key, &ClaimOptions::default()).await;
                assert!(
                    matches!(claim, Ok(Claim::Acquired(_))),
                    "name {name:?} was accepted, then its store failed a claim: {claim:?}"
                );
                let record = store.get(&key).await.expect("get");
                assert_eq!(
                    record.map(|r| r.key),
                    Some(key),
                    "name {name:?}: a record is lost"
                );
            }
        }
    }
}
