//! The operator's reset of a dead-lettered key: `Admin::forget` (what `dedup forget`, in
//! docs/operating.md's "A dead letter, run again", runs) on every backend, and a delete of
//! the record with the backend's own client (SQL `DELETE`, Redis `DEL`, the internal layout
//! the crate READMEs describe); either way the next delivery runs the handler again as
//! attempt 1.

use std::sync::Arc;

use dedup_core::{DedupStore, Handled, Inbox, InboxConfig, InboxError, Key};

/// Dead-letter `key` (1 attempt allowed, the handler fails), run `reset`, and require the
/// next delivery to process it afresh.
async fn dead_letter_then_reset<F: Future<Output = ()>>(
    store: Arc<dyn DedupStore>,
    key: &Key,
    reset: impl FnOnce() -> F,
) {
    let inbox = Inbox::from_arc(
        store,
        InboxConfig {
            max_attempts: Some(1),
            ..InboxConfig::default()
        },
    );
    let fail = |_| async { Err::<Option<Vec<u8>>, _>("bug in the handler") };
    let first = inbox.handle(key, None, fail).await;
    assert!(
        matches!(first, Err(InboxError::Handler { .. })),
        "{first:?}"
    );
    for replay in [false, true] {
        let handled = inbox.handle(key, None, fail).await.unwrap();
        assert!(
            matches!(&handled, Handled::DeadLetter { attempts: 1, replay: r, cause: Some(_) } if *r == replay),
            "{handled:?}"
        );
    }
    reset().await;
    let fixed = inbox
        .handle(key, None, |_| async {
            Ok::<_, &str>(Some(b"done".to_vec()))
        })
        .await
        .unwrap();
    assert!(
        matches!(&fixed, Handled::Processed { lease, .. } if (lease.fence, lease.attempt) == (1, 1)),
        "after the reset the key starts afresh: {fixed:?}"
    );
}

/// A key of a consumer unique to this run (the stores below use their default table or
/// prefix, which other runs may share).
fn unique_key() -> Key {
    let run = uuid::Uuid::new_v4().simple().to_string();
    Key::new(format!("billing-{}", &run[..8]), "order:42").unwrap()
}

#[tokio::test]
async fn sqlite_reset_is_a_delete_of_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dedup.db");
    let store = dedup_sqlite::SqliteStore::open(&path).await.unwrap();
    let key = unique_key();
    dead_letter_then_reset(Arc::new(store), &key, || async {
        let conn = dedup_sqlite::rusqlite::Connection::open(&path).unwrap();
        let deleted = conn
            .execute(
                "DELETE FROM dedup_inbox WHERE consumer = ?1 AND message_id = ?2",
                [key.consumer(), key.message_id()],
            )
            .unwrap();
        assert_eq!(deleted, 1);
    })
    .await;
}

#[tokio::test]
async fn postgres_reset_is_a_delete_of_the_row() {
    let Some(url) = dedup_conformance::server_url("DEDUP_POSTGRES_URL") else {
        eprintln!("SKIPPED: DEDUP_POSTGRES_URL not set");
        return;
    };
    let store = dedup_postgres::PostgresStore::connect(&url).await.unwrap();
    let key = unique_key();
    dead_letter_then_reset(Arc::new(store), &key, || async {
        use dedup_postgres::sqlx;
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let deleted =
            sqlx::query("DELETE FROM dedup_inbox WHERE consumer = $1 AND message_id = $2")
                .bind(key.consumer())
                .bind(key.message_id())
                .execute(&pool)
                .await
                .unwrap();
        assert_eq!(deleted.rows_affected(), 1);
    })
    .await;
}

#[tokio::test]
async fn redis_reset_is_a_del_of_the_key() {
    let Some(url) = dedup_conformance::server_url("DEDUP_REDIS_URL") else {
        eprintln!("SKIPPED: DEDUP_REDIS_URL not set");
        return;
    };
    let store = dedup_redis::RedisStore::connect(&url).await.unwrap();
    let key = unique_key();
    dead_letter_then_reset(Arc::new(store), &key, || async {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        // The message id's ':' is written %3A in the Redis key.
        let redis_key = format!("dedup:{}:order%3A42", key.consumer());
        let deleted: u32 = redis::cmd("DEL")
            .arg(&redis_key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(deleted, 1, "{redis_key}");
    })
    .await;
}

#[tokio::test]
async fn forget_resets_a_dead_lettered_key_on_every_backend() {
    let dir = tempfile::tempdir().unwrap();
    let mut urls = vec![format!("sqlite:{}", dir.path().join("forget.db").display())];
    for var in ["DEDUP_POSTGRES_URL", "DEDUP_REDIS_URL"] {
        match dedup_conformance::server_url(var) {
            Some(url) => urls.push(url),
            None => eprintln!("SKIPPED part: {var} not set"),
        }
    }
    for url in urls {
        let admin = dedup::open_admin(&url).await.unwrap();
        let key = unique_key();
        let store: Arc<dyn DedupStore> = admin.clone();
        dead_letter_then_reset(store, &key, || async {
            let forgot = admin.forget(&key, false).await.unwrap();
            assert!(
                matches!(forgot, dedup::admin::Forgot::Forgot { .. }),
                "{}: {forgot:?}",
                dedup::url::redact(&url)
            );
        })
        .await;
    }
}
