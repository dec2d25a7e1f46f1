//! The seed scenario: a billing consumer receives the same message twice at once, and each
//! delivery runs in its own database transaction with a slow "payment" inside. The inbox
//! row and the business rows commit together, so exactly one charge and one invoice exist;
//! when the first delivery rolls back, the second does the work.

mod common;

use std::time::{Duration, Instant};

use dedup_core::{Key, TxClaim};
use dedup_postgres::PostgresStore;
use dedup_postgres::sqlx::{self, AssertSqlSafe};
use tokio::sync::oneshot;

/// How long the "payment" inside the transaction takes.
const PAYMENT: Duration = Duration::from_millis(200);

/// What one delivery did.
#[derive(Debug)]
struct Delivery {
    claim: TxClaim,
    /// When its claim returned.
    claimed_at: Instant,
}

/// The charges table: one counter row per key, incremented by each payment.
fn charges_table(store: &PostgresStore) -> String {
    format!(
        "\"{}\".\"{}_charges\"",
        common::SCHEMA,
        store.config().table
    )
}

async fn setup(test: &str) -> Option<(PostgresStore, Key)> {
    let url = common::url()?;
    let store = common::store(&url, test, None).await;
    common::create_business_table(&store).await;
    let ddl = format!(
        "CREATE TABLE {} (consumer text, message_id text, charges int NOT NULL, \
         PRIMARY KEY (consumer, message_id))",
        charges_table(&store)
    );
    sqlx::query(AssertSqlSafe(ddl))
        .execute(store.pool())
        .await
        .expect("create charges table");
    let key = Key::new("billing", "order-42-paid").expect("key");
    Some((store, key))
}

/// One delivery: begin, claim inside the transaction, and only when claimed: pay (200 ms,
/// then count a charge) and write the invoice. `claimed` fires once the claim returned.
/// Commits, or rolls back after the payment when `fail` (a failed payment).
async fn deliver(
    store: PostgresStore,
    key: Key,
    label: &'static str,
    fail: bool,
    claimed: oneshot::Sender<()>,
) -> Delivery {
    let mut tx = store.pool().begin().await.expect("begin");
    let claim = store
        .claim_in_tx(&mut tx, &key, None)
        .await
        .expect("claim in tx");
    let claimed_at = Instant::now();
    let _ = claimed.send(());
    if let TxClaim::Claimed { .. } = claim {
        tokio::time::sleep(PAYMENT).await;
        let charge = format!(
            "INSERT INTO {} VALUES ($1, $2, 1) ON CONFLICT (consumer, message_id) \
             DO UPDATE SET charges = {0}.charges + 1",
            charges_table(&store)
        );
        sqlx::query(AssertSqlSafe(charge))
            .bind(key.consumer())
            .bind(key.message_id())
            .execute(&mut *tx)
            .await
            .expect("charge");
        common::insert_business_row(&store, &mut tx, &key, label).await;
    }
    if fail {
        tx.rollback().await.expect("rollback");
    } else {
        tx.commit().await.expect("commit");
    }
    Delivery { claim, claimed_at }
}

async fn charges(store: &PostgresStore, key: &Key) -> i32 {
    let sql = format!(
        "SELECT coalesce(sum(charges), 0)::int FROM {} WHERE consumer = $1 AND message_id = $2",
        charges_table(store)
    );
    sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(key.consumer())
        .bind(key.message_id())
        .fetch_one(store.pool())
        .await
        .expect("count charges")
}

/// Two deliveries of one message at once; the second starts once the first has claimed.
async fn race(store: &PostgresStore, key: &Key, first_fails: bool) -> (Delivery, Delivery) {
    let (first_claimed, wait_first) = oneshot::channel();
    let first = tokio::spawn(deliver(
        store.clone(),
        key.clone(),
        "invoice-1",
        first_fails,
        first_claimed,
    ));
    wait_first.await.expect("first delivery claimed");
    let (second_claimed, _) = oneshot::channel();
    let second = tokio::spawn(deliver(
        store.clone(),
        key.clone(),
        "invoice-2",
        false,
        second_claimed,
    ));
    (
        first.await.expect("first delivery"),
        second.await.expect("second delivery"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicate_is_charged_and_invoiced_once() {
    let Some((store, key)) = setup("billing_once").await else {
        return eprintln!("SKIPPED: DEDUP_POSTGRES_URL is not set");
    };
    let (first, second) = race(&store, &key, false).await;

    assert_eq!(first.claim, TxClaim::Claimed { fence: 1 });
    assert!(
        matches!(second.claim, TxClaim::Completed { outcome: None, .. }),
        "the duplicate sees the committed record: {:?}",
        second.claim
    );
    assert!(
        second.claimed_at >= first.claimed_at + PAYMENT,
        "the duplicate's claim waited for the first transaction to end"
    );
    assert_eq!(charges(&store, &key).await, 1, "exactly one charge");
    assert_eq!(common::business_rows(&store, &key).await, ["invoice-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_the_first_rolls_back_the_duplicate_does_the_work() {
    let Some((store, key)) = setup("billing_rollback").await else {
        return eprintln!("SKIPPED: DEDUP_POSTGRES_URL is not set");
    };
    let (first, second) = race(&store, &key, true).await;

    assert_eq!(first.claim, TxClaim::Claimed { fence: 1 });
    assert_eq!(
        second.claim,
        TxClaim::Claimed { fence: 1 },
        "the rolled-back claim left no record, so the duplicate claims afresh"
    );
    assert!(second.claimed_at >= first.claimed_at + PAYMENT);
    assert_eq!(
        charges(&store, &key).await,
        1,
        "only the second charge committed"
    );
    assert_eq!(common::business_rows(&store, &key).await, ["invoice-2"]);

    // A third delivery afterwards is a plain duplicate.
    let (third_claimed, _) = oneshot::channel();
    let third = deliver(
        store.clone(),
        key.clone(),
        "invoice-3",
        false,
        third_claimed,
    )
    .await;
    assert!(matches!(third.claim, TxClaim::Completed { .. }));
    assert_eq!(charges(&store, &key).await, 1);
}
