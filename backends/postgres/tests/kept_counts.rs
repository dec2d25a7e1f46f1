//! Kept counts (`Admin::enable_counts`) on the real PostgreSQL of `DEDUP_POSTGRES_URL`: the
//! mixed workload's counts equal a scan's, every admin clause holds with counts kept, and
//! disabling leaves the schema exactly as a store without counts has it.

mod common;

use dedup_core::Admin;
use dedup_postgres::PostgresStore;
use dedup_postgres::sqlx::{self, AssertSqlSafe};

type Store = PostgresStore;

#[path = "../../sql/tests/clauses/kept_counts.rs"]
mod shared;

/// Every relation, index, trigger and function of `store`'s schema whose name starts with
/// its table's, and the table's triggers.
async fn schema_objects(store: &PostgresStore) -> Vec<String> {
    let config = store.config();
    let like = format!("{}%", config.table.replace('_', "\\_"));
    let sql = "SELECT 'relation ' || c.relname::text || ' ' || c.relkind::text FROM pg_class c \
               JOIN pg_namespace n ON n.oid = c.relnamespace \
               WHERE n.nspname = $1 AND c.relname LIKE $2 \
               UNION ALL SELECT 'function ' || p.proname::text FROM pg_proc p \
               JOIN pg_namespace n ON n.oid = p.pronamespace \
               WHERE n.nspname = $1 AND p.proname LIKE $2 \
               UNION ALL SELECT 'trigger ' || t.tgname::text FROM pg_trigger t \
               WHERE t.tgrelid = to_regclass($3) \
               ORDER BY 1";
    sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(&config.schema)
        .bind(like)
        .bind(store.table())
        .fetch_all(store.pool())
        .await
        .expect("read the catalog")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disabling_leaves_the_schema_as_a_store_without_counts_has_it() {
    let url = url_or_skip!();
    let store = common::store(&url, "kept_schema", None).await;
    let before = schema_objects(&store).await;
    assert!(store.enable_counts().await.expect("enable"));
    let kept = schema_objects(&store).await;
    for added in [
        "_counts r",
        "_in_flight_idx i",
        "_count_fn",
        "_fold_fn",
        "_counts_ins",
        "_counts_upd",
        "_counts_del",
    ] {
        assert!(
            kept.iter().any(|o| o.ends_with(added)) && !before.iter().any(|o| o.ends_with(added)),
            "enabling adds *{added}: {kept:?}"
        );
    }
    assert!(store.disable_counts().await.expect("disable"));
    assert_eq!(
        schema_objects(&store).await,
        before,
        "disabling removes everything enabling added"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_folds_many_rows_of_differences_into_one_per_consumer() {
    use dedup_core::{ClaimOptions, DedupStore, Key};
    let url = url_or_skip!();
    let store = common::store(&url, "kept_fold", None).await;
    assert!(store.enable_counts().await.expect("enable"));
    // Each claim of a new key and each commit appends one row of differences.
    let n = dedup_sql::counts::FOLD_AFTER as usize / 2 + 10;
    for i in 0..n {
        let key = Key::new("fold", format!("m{i}")).unwrap();
        let lease = store
            .claim(
                &key,
                &ClaimOptions::lease(std::time::Duration::from_secs(60)),
            )
            .await
            .expect("claim")
            .into_lease()
            .expect("a new key");
        store.commit(&lease, Some(b"ok")).await.expect("commit");
    }
    let kept_rows = format!(
        "SELECT count(*) FROM \"{}\".\"{}_counts\"",
        store.config().schema,
        store.config().table
    );
    let rows = |sql: String| {
        let pool = store.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .expect("count the rows of differences")
        }
    };
    assert!(
        rows(kept_rows.clone()).await > dedup_sql::counts::FOLD_AFTER as i64,
        "every claim and commit appended a row"
    );
    let counts = store.consumers().await.expect("consumers");
    assert_eq!(counts.len(), 1);
    assert_eq!(
        (counts[0].counts.completed, counts[0].counts.total()),
        (n as u64, n as u64)
    );
    assert_eq!(
        rows(kept_rows).await,
        1,
        "the read folded them into one row"
    );
    let again = store.consumers().await.expect("consumers after the fold");
    let by_status = |c: &[dedup_core::admin::ConsumerCounts]| {
        c.iter()
            .map(|c| dedup_core::Status::ALL.map(|s| c.counts.count(s)))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        by_status(&again),
        by_status(&counts),
        "folding changes no count"
    );
}
