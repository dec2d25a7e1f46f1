//! What the console's tests share: the stores under test (real SQLite, PostgreSQL and
//! Redis), their seeding, and a console over them.

#![allow(dead_code)]

pub mod broker;
pub mod web;

use std::sync::Arc;
use std::time::Duration;

use dedup::inbox::Failure;
use dedup::outbox::{AfterFailure, OutboxMessage, OutboxStore};
use dedup::store::{ClaimOptions, Verdict};
use dedup::{Admin, DedupStore, Key, Lease, Timestamp};
use dedup_console::{Console, ConsoleConfig};

/// The console's token in tests.
pub const TOKEN: &str = "test-token-0123456789";

/// A store under test.
pub struct Target {
    /// `sqlite`, `postgres` or `redis`.
    pub backend: &'static str,
    /// Its URL (a unique table or prefix).
    pub url: String,
    /// Keeps the SQLite file alive.
    pub _dir: Option<tempfile::TempDir>,
}

fn unique() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// A server URL from the environment, or `None` (skip) unless `DEDUP_TEST_STRICT=1`.
fn server(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ if std::env::var("DEDUP_TEST_STRICT").as_deref() == Ok("1") => {
            panic!("{var} is not set and DEDUP_TEST_STRICT=1")
        }
        _ => {
            eprintln!("skipped: {var} is not set");
            None
        }
    }
}

/// The target for `backend`, or `None` when its server is not configured.
pub fn target(backend: &'static str) -> Option<Target> {
    let sep = |u: &str| if u.contains('?') { '&' } else { '?' };
    match backend {
        "sqlite" => {
            let dir = tempfile::tempdir().expect("temp dir");
            let url = format!("sqlite:{}", dir.path().join("console.db").display());
            Some(Target {
                backend,
                url,
                _dir: Some(dir),
            })
        }
        "postgres" => server("DEDUP_POSTGRES_URL").map(|u| Target {
            backend,
            url: format!("{u}{}table=console_{}", sep(&u), unique()),
            _dir: None,
        }),
        "redis" => server("DEDUP_REDIS_URL").map(|u| Target {
            backend,
            url: format!("{u}{}prefix=console-{}:", sep(&u), unique()),
            _dir: None,
        }),
        other => panic!("no target {other}"),
    }
}

/// The key holding markup: it must render as text.
pub const SCRIPT_KEY: &str = "<script>document.title='pwned'</script>";

/// What [`seed`] wrote.
pub struct Seeded {
    /// The store.
    pub admin: Arc<dyn Admin>,
    /// The outbox (SQL stores).
    pub outbox: Option<Arc<dyn OutboxStore>>,
    /// The live lease of `billing/stuck-1`, held by a "stale worker".
    pub stale: Lease,
    /// The dead outbox row's id.
    pub dead_row: Option<i64>,
}

fn failure(line: &str, at: Timestamp) -> Failure {
    Failure::new(
        "handler",
        vec![format!("{line}\nsecond line"), "root cause: io".to_owned()],
        1,
        at,
        Some("worker-7"),
    )
}

/// Seed `t`: billing has 3 processed, 2 failed and 1 dead-lettered with "connection
/// refused" (one of them the [`SCRIPT_KEY`]), 1 failed with "invalid amount", and 1 live
/// lease (`stuck-1`, an hour long); shipping has 1 processed. SQL stores also get an
/// outbox with one pending row and one dead row.
pub async fn seed(t: &Target) -> Seeded {
    let admin = dedup::open_admin(&t.url).await.expect("open the store");
    let now = admin.now().await.expect("now");
    let claim = |c: &'static str, id: String, lease: u64| {
        let admin = admin.clone();
        async move {
            admin
                .claim(
                    &Key::new(c, id).expect("key"),
                    &ClaimOptions::lease(Duration::from_secs(lease)),
                )
                .await
                .expect("claim")
                .into_lease()
                .expect("acquired")
        }
    };
    for i in 1..=3 {
        let l = claim("billing", format!("ok-{i}"), 30).await;
        admin.commit(&l, Some(b"charged")).await.expect("commit");
    }
    let l = claim("shipping", "ok-1".into(), 30).await;
    admin.commit(&l, Some(b"sent")).await.expect("commit");
    let refused = failure("connection refused", now);
    for id in ["fail-1".to_owned(), SCRIPT_KEY.to_owned()] {
        let l = claim("billing", id, 30).await;
        admin
            .commit(&l, Some(&Verdict::failed(&refused)))
            .await
            .expect("commit failed");
    }
    let l = claim("billing", "dead-1".into(), 30).await;
    admin
        .commit(&l, Some(&Verdict::dead_letter(3, Some(&refused))))
        .await
        .expect("commit dead letter");
    let l = claim("billing", "fail-2".into(), 30).await;
    admin
        .commit(&l, Some(&Verdict::failed(&failure("invalid amount", now))))
        .await
        .expect("commit failed");
    let stale = claim("billing", "stuck-1".into(), 3600).await;

    let (outbox, dead_row) = if t.backend == "redis" {
        (None, None)
    } else {
        let outbox = dedup::open_outbox(&t.url).await.expect("open the outbox");
        enqueue(
            t,
            &[OutboxMessage::new("invoices", "inv-1", vec![0u8; 42])
                .unwrap()
                .header("tenant", "<b>acme</b>")
                .unwrap()],
        )
        .await;
        let held = outbox
            .take(10, Duration::from_secs(30))
            .await
            .expect("take");
        let id = held.rows[0].id;
        assert!(
            outbox
                .mark_failed(
                    &held.token,
                    id,
                    "broker said no: <i>503</i>",
                    AfterFailure::Dead
                )
                .await
                .expect("mark dead")
        );
        enqueue(
            t,
            &[OutboxMessage::new("invoices", "inv-2", b"x".to_vec()).unwrap()],
        )
        .await;
        (Some(outbox), Some(id))
    };
    Seeded {
        admin,
        outbox,
        stale,
        dead_row,
    }
}

/// Enqueue `messages` through the backend, in a committed transaction.
pub async fn enqueue(t: &Target, messages: &[OutboxMessage]) {
    match t.backend {
        "sqlite" => {
            let path = t.url.strip_prefix("sqlite:").expect("sqlite URL");
            let store = dedup_sqlite::SqliteStore::open(path).await.expect("open");
            let conn = store.open_connection().expect("connection");
            store.outbox().enqueue(&conn, messages).expect("enqueue");
        }
        "postgres" => {
            let (base, table) = t.url.rsplit_once("table=").expect("table");
            let base = base.trim_end_matches(['?', '&']);
            let store = dedup_postgres::PostgresStore::connect_with(
                base,
                dedup_postgres::PostgresConfig {
                    sql: dedup_postgres::SqlSettings {
                        table: table.to_owned(),
                        max_connections: 2,
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await
            .expect("connect");
            let mut tx = store.pool().begin().await.expect("begin");
            store
                .outbox()
                .enqueue(&mut tx, messages)
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
        }
        other => panic!("{other} has no outbox"),
    }
}

/// A console over `s` with writes allowed and the test token, served at the root.
pub fn console(t: &Target, s: &Seeded) -> Console {
    console_at(t, s, "")
}

/// The same console, for nesting at `base` (`""`: the root).
pub fn console_at(t: &Target, s: &Seeded, base: &str) -> Console {
    let mut config = ConsoleConfig::default();
    config.allow_writes = true;
    config.token = Some(TOKEN.to_owned());
    config.base_path = base.to_owned();
    let c = Console::new(s.admin.clone(), &t.url, config).expect("config");
    match &s.outbox {
        Some(o) => c.with_outbox(o.clone()),
        None => c,
    }
}
