//! PostgreSQL-specific behaviour beyond the conformance suite: names, migrations racing,
//! the transaction staying usable, killed connections, the server clock, batches with
//! repeated keys, index-driven batches on a fresh consumer, purgers on many nodes.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, Clock, CommitRequest, DedupStore, Error, Fingerprint, Key,
    MemoryStore, PurgeOptions, TxClaim,
};
use dedup_postgres::sqlx::postgres::PgPoolOptions;
use dedup_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection};
use dedup_postgres::{PostgresConfig, PostgresStore, SqlSettings};

fn key(consumer: &str, id: &str) -> Key {
    Key::new(consumer, id).expect("valid key")
}

fn lease(d: u64) -> ClaimOptions {
    ClaimOptions::lease(Duration::from_secs(d))
}

fn fp(s: &str) -> Fingerprint {
    Fingerprint::new(s).expect("fingerprint")
}

#[tokio::test]
async fn unsafe_schema_and_table_names_are_rejected() {
    // A lazy pool never connects: validation happens before any I/O.
    let pool = PgPoolOptions::new()
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .expect("lazy pool");
    for (schema, table) in [
        ("public", "inbox; DROP TABLE users"),
        ("public", "a.b"),
        ("public", ""),
        ("public", "1abc"),
        ("we\"ird", "inbox"),
        ("public", &"x".repeat(64)),
    ] {
        let config = PostgresConfig {
            schema: schema.into(),
            sql: SqlSettings {
                table: table.into(),
                ..Default::default()
            },
            ..Default::default()
        };
        let err = PostgresStore::from_pool(pool.clone(), config)
            .await
            .expect_err("unsafe name accepted");
        assert!(err.is_invalid_input(), "{schema}.{table}: {err:?}");
    }
    let store = PostgresStore::from_pool(pool, PostgresConfig::default())
        .await
        .expect("default names are fine");
    assert_eq!(store.table(), "\"public\".\"dedup_inbox\"");
    let caps = store.capabilities();
    assert!(caps.persistent && caps.multi_process && caps.native_batch && caps.transactional);
    assert!(caps.server_clock, "no injected clock: the server's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_from_eight_tasks_at_once_creates_one_schema() {
    let url = url_or_skip!();
    // A fresh schema too, so CREATE SCHEMA races as well as CREATE TABLE / INDEX.
    let schema = common::unique_table("schema");
    let config = PostgresConfig {
        schema: schema.clone(),
        sql: SqlSettings {
            table: "dedup_inbox".into(),
            max_connections: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (url, config) = (url.clone(), config.clone());
            tokio::spawn(async move { PostgresStore::connect_with(&url, config).await })
        })
        .collect();
    let mut stores = Vec::new();
    for task in tasks {
        stores.push(task.await.expect("task").expect("concurrent migrate"));
    }
    // Idempotent afterwards as well.
    stores[0].migrate().await.expect("migrate again");
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 AND tablename = 'dedup_inbox' \
         ORDER BY indexname",
    )
    .bind(&schema)
    .fetch_all(stores[0].pool())
    .await
    .expect("list indexes");
    assert_eq!(indexes, ["dedup_inbox_claimed_idx", "dedup_inbox_pkey"]);
    // Every handle works on the one table.
    let k = key("c", "m");
    assert!(
        stores[3]
            .claim(&k, &lease(30))
            .await
            .expect("claim")
            .is_acquired()
    );
    assert!(matches!(
        stores[5].claim(&k, &lease(30)).await.expect("claim"),
        Claim::InFlight { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_claims_leave_the_transaction_usable() {
    let url = url_or_skip!();
    let clock = common::manual_clock();
    let store = common::store(&url, "tx_usable", Some(clock.clone())).await;
    common::create_business_table(&store).await;
    let (done, with_fp, leased, fresh) = (
        key("billing", "done"),
        key("billing", "with-fp"),
        key("billing", "leased"),
        key("billing", "fresh"),
    );
    // A completed record, a completed record with a fingerprint, a live lease.
    let mut tx = store.pool().begin().await.expect("begin");
    for (k, f) in [(&done, None), (&with_fp, Some(fp("A")))] {
        let claim = store
            .claim_in_tx(&mut tx, k, f.as_ref())
            .await
            .expect("claim");
        assert_eq!(claim, TxClaim::Claimed { fence: 1 });
    }
    tx.commit().await.expect("commit");
    let lease_mode = store.claim(&leased, &lease(30)).await.expect("claim");
    assert!(lease_mode.is_acquired());

    let mut tx = store.pool().begin().await.expect("begin");
    assert!(matches!(
        store
            .claim_in_tx(&mut tx, &done, None)
            .await
            .expect("duplicate"),
        TxClaim::Completed { outcome: None, .. }
    ));
    assert!(matches!(
        store.claim_in_tx(&mut tx, &with_fp, Some(&fp("B"))).await,
        Err(Error::FingerprintMismatch { .. })
    ));
    assert!(matches!(
        store
            .claim_in_tx(&mut tx, &leased, None)
            .await
            .expect("live lease"),
        TxClaim::InFlight { attempt: 1, .. }
    ));
    // Claimed, then claimed again in the same transaction: its own row is a duplicate.
    assert_eq!(
        store
            .claim_in_tx(&mut tx, &fresh, None)
            .await
            .expect("claim"),
        TxClaim::Claimed { fence: 1 }
    );
    assert!(matches!(
        store
            .claim_in_tx(&mut tx, &fresh, None)
            .await
            .expect("again"),
        TxClaim::Completed { .. }
    ));
    // Further statements and the commit succeed.
    common::insert_business_row(&store, &mut tx, &fresh, "after duplicates").await;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_class")
        .fetch_one(&mut *tx)
        .await
        .expect("a statement after the duplicates");
    assert!(n > 0);
    tx.commit().await.expect("commit after duplicates");
    assert_eq!(
        common::business_rows(&store, &fresh).await,
        ["after duplicates"]
    );
    assert!(matches!(
        store.claim(&fresh, &lease(30)).await.expect("claim"),
        Claim::Completed { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_connection_is_a_retryable_error_and_the_pool_recovers() {
    let url = url_or_skip!();
    let store = common::store(&url, "killed", None).await;
    let k = key("billing", "killed");
    let first = store.claim(&k, &lease(1)).await.expect("claim");
    assert!(first.is_acquired());
    // An expired lease: the next claim's takeover writes the row (a claim of a live lease
    // only reads it, and would not wait).
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    // Hold the row so the next claim waits inside the server, where we can find and kill
    // its backend.
    let mut blocker = PgConnection::connect(&url).await.expect("connect");
    let mut block = blocker.begin().await.expect("begin");
    let lock = format!(
        "SELECT 1 FROM \"{}\".\"{}\" WHERE consumer = $1 AND message_id = $2 FOR UPDATE",
        common::SCHEMA,
        store.config().table
    );
    sqlx::query(AssertSqlSafe(lock))
        .bind(k.consumer())
        .bind(k.message_id())
        .execute(&mut *block)
        .await
        .expect("lock the row");

    let claiming = tokio::spawn({
        let (store, k) = (store.clone(), k.clone());
        async move { store.claim(&k, &lease(60)).await }
    });
    let mut admin = PgConnection::connect(&url).await.expect("connect");
    let started = Instant::now();
    let pid: i32 = loop {
        let waiting: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE '%' || $1 || '%' LIMIT 1",
        )
        .bind(&store.config().table)
        .fetch_optional(&mut admin)
        .await
        .expect("pg_stat_activity");
        if let Some(pid) = waiting {
            break pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the claim never waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .expect("terminate");
    assert!(killed);

    let err = claiming
        .await
        .expect("task")
        .expect_err("the claim's connection was killed");
    assert!(
        err.is_retryable(),
        "a killed connection is retryable: {err:?}"
    );
    let source = std::error::Error::source(&err).expect("the driver error is kept");
    assert!(source.downcast_ref::<sqlx::Error>().is_some(), "{source:?}");

    block.rollback().await.expect("release the row");
    // The pool replaces the dead connection: the retry takes the expired lease over, as
    // the killed claim would have.
    let retried = store
        .claim(&k, &lease(60))
        .await
        .expect("retry after reconnect");
    assert!(
        matches!(&retried, Claim::Acquired(l) if l.attempt == 2),
        "{retried:?}"
    );
}

async fn server_ms(conn: &mut PgConnection, expr: &'static str) -> i64 {
    sqlx::query_scalar(expr)
        .fetch_one(conn)
        .await
        .expect("server time")
}

const CLOCK_MS: &str = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";
const TX_START_MS: &str = "SELECT floor(extract(epoch FROM now()) * 1000)::bigint";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_use_the_server_clock_by_default() {
    let url = url_or_skip!();
    let store = common::store(&url, "server_clock", None).await;
    let mut conn = PgConnection::connect(&url).await.expect("connect");
    let before = server_ms(&mut conn, CLOCK_MS).await;
    let claim = store
        .claim(&key("c", "m"), &lease(60))
        .await
        .expect("claim");
    let after = server_ms(&mut conn, CLOCK_MS).await;
    let expires = claim.lease().expect("acquired").expires_at.as_millis();
    assert!(
        (before + 60_000..=after + 60_000).contains(&expires),
        "{before} + 60s <= {expires} <= {after} + 60s"
    );

    // Inside a long transaction the time is the statement's, not the transaction's start.
    let mut tx = store.pool().begin().await.expect("begin");
    let tx_start = server_ms(&mut tx, TX_START_MS).await;
    sqlx::query("SELECT pg_sleep(0.3)")
        .execute(&mut *tx)
        .await
        .expect("sleep");
    let k = key("c", "late");
    assert!(matches!(
        store.claim_in_tx(&mut tx, &k, None).await.expect("claim"),
        TxClaim::Claimed { .. }
    ));
    tx.commit().await.expect("commit");
    let record = store.get(&k).await.expect("get").expect("record");
    let dedup_core::RecordState::Completed { processed_at, .. } = record.state else {
        panic!("completed expected: {record:?}")
    };
    assert!(
        processed_at.as_millis() >= tx_start + 300,
        "clock_timestamp, not now()"
    );
}

/// A claim's result without its random token, for comparing with the model.
fn shape(result: &dedup_core::Result<Claim>) -> String {
    match result {
        Ok(Claim::Acquired(l)) => format!("acquired f{} a{} {}", l.fence, l.attempt, l.expires_at),
        Ok(other) => format!("{other:?}"),
        Err(e) => format!("error {e}"),
    }
}

fn unit_shape(result: &dedup_core::Result<()>) -> String {
    match result {
        Ok(()) => "ok".into(),
        Err(e) => format!("error {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repeated_keys_in_a_batch_behave_as_in_order() {
    let url = url_or_skip!();
    let clock = common::manual_clock();
    let store = common::store(&url, "repeats", Some(clock.clone())).await;
    let model = MemoryStore::with_clock(clock.clone());
    let (k, k2) = (key("c", "k"), key("c", "k2"));

    for s in [&store as &dyn DedupStore, &model] {
        s.claim(&k, &lease(10).with_fingerprint(fp("G")))
            .await
            .expect("claim");
    }
    clock.advance(Duration::from_secs(11));
    // Mismatch, then a takeover (a second round), then in flight; and a second key.
    let claims = vec![
        ClaimRequest::new(k.clone(), lease(30).with_fingerprint(fp("F"))),
        ClaimRequest::new(k.clone(), lease(30)),
        ClaimRequest::new(k.clone(), lease(30).with_fingerprint(fp("G"))),
        ClaimRequest::new(k2.clone(), lease(5)),
        ClaimRequest::new(k2.clone(), lease(5).with_fingerprint(fp("X"))),
    ];
    let got = store.claim_many(&claims).await.expect("claim_many");
    let want = model.claim_many(&claims).await.expect("model");
    let shapes = |r: &[dedup_core::Result<Claim>]| r.iter().map(shape).collect::<Vec<_>>();
    assert_eq!(shapes(&got), shapes(&want));
    assert!(
        got[1]
            .as_ref()
            .is_ok_and(|c| c.lease().is_some_and(|l| l.fence == 2))
    );

    // Commits: a stale lease then the current one (a second round), the current one
    // twice (the first outcome stays), an empty outcome on the second key.
    let commits = |claims: &[dedup_core::Result<Claim>]| {
        let current = claims[1]
            .as_ref()
            .expect("acquired")
            .lease()
            .expect("lease")
            .clone();
        let mut stale = current.clone();
        stale.token = dedup_core::LeaseToken::random();
        let other = claims[3]
            .as_ref()
            .expect("k2")
            .lease()
            .expect("lease")
            .clone();
        vec![
            CommitRequest {
                lease: stale,
                outcome: None,
            },
            CommitRequest {
                lease: current.clone(),
                outcome: Some(b"first".to_vec()),
            },
            CommitRequest {
                lease: current,
                outcome: Some(b"second".to_vec()),
            },
            CommitRequest {
                lease: other,
                outcome: Some(Vec::new()),
            },
        ]
    };
    let got_commits = store
        .commit_many(&commits(&got))
        .await
        .expect("commit_many");
    let want_commits = model.commit_many(&commits(&want)).await.expect("model");
    let units = |r: &[dedup_core::Result<()>]| r.iter().map(unit_shape).collect::<Vec<_>>();
    assert_eq!(units(&got_commits), units(&want_commits));
    assert!(got_commits[0].as_ref().is_err_and(Error::is_lease_lost));
    assert!(got_commits[1..].iter().all(Result::is_ok));
    for k in [&k, &k2] {
        assert_eq!(
            shape(&store.claim(k, &lease(1)).await),
            shape(&model.claim(k, &lease(1)).await),
            "the first outcome stays"
        );
    }
}

/// Rows read from `store`'s table so far by sequential and index scans, once the
/// statistics of `inserted` inserts and `updated` updates have reached the collector.
async fn tuples_read(store: &PostgresStore, inserted: i64, updated: i64) -> i64 {
    let sql = "SELECT n_tup_ins, n_tup_upd, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) \
               FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2";
    let started = Instant::now();
    loop {
        let (ins, upd, read): (i64, i64, i64) = sqlx::query_as(sql)
            .bind(common::SCHEMA)
            .bind(&store.config().table)
            .fetch_one(store.pool())
            .await
            .expect("pg_stat_user_tables");
        if ins >= inserted && upd >= updated {
            return read;
        }
        // Backends flush their statistics about a second after going idle.
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "statistics never arrived"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_stay_index_driven_on_a_fresh_consumer() {
    let url = url_or_skip!();
    let store = common::store(&url, "fresh_consumer", None).await;
    // A table whose statistics know only an old consumer: the rows of a new consumer grow
    // from zero faster than autovacuum refreshes them, which made batches that
    // join against unnest scan all of the new consumer's rows for every batch.
    const OLD: i64 = 20_000;
    let prefill = format!(
        "INSERT INTO {} (consumer, message_id, fence, attempt, claimed_at, processed_at) \
         SELECT 'old-consumer', 'm' || g, 1, 1, 0, 0 FROM generate_series(1, {OLD}) g",
        store.table()
    );
    let analyze = format!("ANALYZE {}", store.table());
    for sql in [prefill, analyze] {
        sqlx::query(AssertSqlSafe(sql))
            .execute(store.pool())
            .await
            .expect("prefill");
    }
    let before = tuples_read(&store, OLD, 0).await;

    const BATCHES: i64 = 40;
    const BATCH: i64 = 250;
    for b in 0..BATCHES {
        let claims: Vec<ClaimRequest> = (0..BATCH)
            .map(|i| ClaimRequest::new(key("new-consumer", &format!("m{b}-{i}")), lease(60)))
            .collect();
        let leases: Vec<CommitRequest> = store
            .claim_many(&claims)
            .await
            .expect("claim_many")
            .into_iter()
            .map(|c| CommitRequest {
                lease: c.expect("claim").into_lease().expect("acquired"),
                outcome: None,
            })
            .collect();
        for r in store.commit_many(&leases).await.expect("commit_many") {
            r.expect("commit");
        }
    }
    let rows = BATCHES * BATCH;
    let read = tuples_read(&store, OLD + rows, rows).await - before;
    eprintln!("{read} rows read for {rows} keys claimed and committed in batches of {BATCH}");
    // Index-driven: one primary-key lookup per key and statement, plus the commit's lock by
    // ctid. Scanning the new consumer's rows per batch reads rows^2 / (2 * BATCH) = 200k
    // per statement kind.
    assert!(
        read <= 4 * rows,
        "{read} rows read for {rows} keys: not index-driven"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purgers_on_many_nodes_split_the_work() {
    let url = url_or_skip!();
    let clock = common::manual_clock();
    let table = common::unique_table("purgers");
    let store = common::store_on(&url, &table, Some(clock.clone() as Arc<dyn Clock>)).await;
    const N: usize = 2000;
    for chunk in 0..N / 500 {
        let claims: Vec<ClaimRequest> = (0..500)
            .map(|i| ClaimRequest::new(key("c", &format!("done-{chunk}-{i}")), lease(60)))
            .collect();
        let commits: Vec<CommitRequest> = store
            .claim_many(&claims)
            .await
            .expect("claim_many")
            .into_iter()
            .map(|c| CommitRequest {
                lease: c.expect("claim").into_lease().expect("acquired"),
                outcome: Some(b"ok".to_vec()),
            })
            .collect();
        store.commit_many(&commits).await.expect("commit_many");
    }
    let expired = key("c", "expired");
    store.claim(&expired, &lease(1)).await.expect("claim");
    clock.advance(Duration::from_secs(7200));
    let live = key("c", "live");
    store.claim(&live, &lease(86_400)).await.expect("claim");

    let nodes: Vec<PostgresStore> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(common::store_on(&url, &table, Some(clock.clone() as Arc<dyn Clock>)).await);
        }
        v
    };
    let options = PurgeOptions::older_than(Duration::from_secs(3600)).batch_size(50);
    let tasks: Vec<_> = nodes
        .into_iter()
        .map(|node| {
            let options = options.clone();
            tokio::spawn(async move { node.purge(&options).await })
        })
        .collect();
    let (mut completed, mut expired_n) = (0, 0);
    for t in tasks {
        let report = t.await.expect("task").expect("purge");
        assert!(report.batches >= 1);
        completed += report.completed;
        expired_n += report.expired;
    }
    // Whatever a purger skipped (held by another) the other removed; a final pass finds
    // nothing left.
    let rest = store.purge(&options).await.expect("purge");
    assert_eq!(completed + rest.completed, N as u64);
    assert_eq!(expired_n + rest.expired, 1);
    assert!(store.get(&expired).await.expect("get").is_none());
    assert!(
        store
            .get(&key("c", "done-0-0"))
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        store.get(&live).await.expect("get").is_some(),
        "live leases stay"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commits_renewals_and_releases_are_hot_updates() {
    let url = url_or_skip!();
    let store = common::store(&url, "hot_updates", None).await;
    // No index covers a column that commit, renew or release change, so PostgreSQL can
    // update those rows in place (HOT: no index writes), given room on the page, which a
    // commit right after its claim usually has.
    const N: i64 = 300;
    for i in 0..N {
        let k = key("c", &format!("m{i}"));
        let lease = store
            .claim(&k, &lease(60))
            .await
            .expect("claim")
            .into_lease()
            .expect("acquired");
        let lease = store
            .renew(&lease, Duration::from_secs(60))
            .await
            .expect("renew");
        if i % 2 == 0 {
            store.release(&lease).await.expect("release");
        } else {
            store.commit(&lease, Some(b"ok")).await.expect("commit");
        }
    }
    let sql = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
               WHERE schemaname = $1 AND relname = $2";
    let started = Instant::now();
    let (updated, hot): (i64, i64) = loop {
        let (updated, hot): (i64, i64) = sqlx::query_as(sql)
            .bind(common::SCHEMA)
            .bind(&store.config().table)
            .fetch_one(store.pool())
            .await
            .expect("pg_stat_user_tables");
        if updated >= 2 * N {
            break (updated, hot);
        }
        // Backends flush their statistics about a second after going idle.
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "statistics never arrived"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("{hot} of {updated} updates were HOT");
    assert!(
        hot * 10 >= updated * 9,
        "{hot} of {updated} updates were HOT: an index covers a column they change"
    );
}
