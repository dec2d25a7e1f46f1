//! `dedup::open` with every scheme (the server ones against the real servers), and bad
//! URLs: each a typed error, and nothing contacted or written.

mod common;

use std::time::Duration;

use common::{UrlFactory, chain, cluster_url, server, smoke};
use dedup::mysql::MySqlTarget;
use dedup::postgres::PostgresTarget;
use dedup::redis::RedisTarget;
use dedup::sqlite::SqliteTarget;
use dedup::store::ClaimOptions;
use dedup::url::StoreTarget;
use dedup::{Key, OpenError, StoreUrl, UrlError};

/// Claim, commit, claim again: the store works and keeps what it committed.
async fn round_trip(url: &str) {
    let store = dedup::open(url)
        .await
        .unwrap_or_else(|e| panic!("open {}: {}", dedup::url::redact(url), chain(&e)));
    let key = Key::new("open-test", uuid::Uuid::new_v4().to_string()).unwrap();
    let opts = ClaimOptions::lease(Duration::from_secs(30));
    let lease = store
        .claim(&key, &opts)
        .await
        .unwrap()
        .into_lease()
        .expect("acquired");
    store.commit(&lease, Some(b"done")).await.unwrap();
    assert!(
        matches!(
            store.claim(&key, &opts).await.unwrap(),
            dedup::Claim::Completed { .. }
        ),
        "{url}: a duplicate sees the commit"
    );
}

fn target(url: &str) -> StoreTarget {
    StoreUrl::parse(url)
        .unwrap_or_else(|e| panic!("{url}: {}", chain(&e)))
        .into_target()
}

#[tokio::test]
async fn memory_opens() {
    assert_eq!(StoreUrl::parse("memory:").unwrap().backend(), "memory");
    round_trip("memory:").await;
    round_trip("memory://?clock=local").await;
}

#[tokio::test]
async fn sqlite_file_opens_with_its_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.db");
    let url = format!(
        "sqlite:{}?table=orders_inbox&synchronous=normal&pool_size=2&busy_timeout=250ms&block_in_place=false",
        path.display()
    );
    let Ok(SqliteTarget {
        path: Some(p),
        config,
    }) = target(&url).downcast()
    else {
        panic!("{url}: not an sqlite file target");
    };
    assert_eq!(p, path);
    assert_eq!(config.table, "orders_inbox");
    assert_eq!(config.synchronous, dedup::sqlite::Synchronous::Normal);
    assert_eq!(config.pool_size, 2);
    assert_eq!(config.busy_timeout, Duration::from_millis(250));
    assert!(!config.block_in_place);
    round_trip(&url).await;
    assert!(path.exists(), "the file was created");
    let tables: Vec<String> = {
        let conn = dedup::sqlite::rusqlite::Connection::open(&path).unwrap();
        let mut stmt = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    assert!(tables.contains(&"orders_inbox".to_owned()), "{tables:?}");
    // `sqlite://PATH` is the same file.
    round_trip(&format!("sqlite://{}?table=orders_inbox", path.display())).await;
}

#[tokio::test]
async fn sqlite_in_memory_opens() {
    assert!(matches!(
        target("sqlite::memory:").downcast(),
        Ok(SqliteTarget { path: None, .. })
    ));
    round_trip("sqlite::memory:").await;
}

#[tokio::test]
async fn mysql_opens_with_its_parameters_and_passes_the_smoke_clauses() {
    let Some(base) = server("DEDUP_MYSQL_URL", "mysql_opens") else {
        return;
    };
    let table = format!(
        "t_open_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let url =
        format!("{base}?table={table}&pool_size=3&connect_timeout=3s&clock=local&charset=utf8mb4");
    let Ok(MySqlTarget {
        url: driver,
        config,
    }) = target(&url).downcast()
    else {
        panic!("not a mysql target");
    };
    assert_eq!(config.table, table);
    assert_eq!(config.max_connections, 3);
    assert_eq!(config.connect_timeout, Duration::from_secs(3));
    assert!(
        config.clock.is_some(),
        "clock=local injects this machine's clock"
    );
    assert!(
        driver.ends_with("?charset=utf8mb4"),
        "the driver's own parameters pass through, dedup's do not: {driver}"
    );
    assert_eq!(StoreUrl::parse(&url).unwrap().backend(), "mysql");
    round_trip(&url).await;
    // mariadb:// is the same store; the driver is given mysql://.
    let mariadb = format!(
        "{}?table={table}",
        base.replacen("mysql://", "mariadb://", 1)
    );
    let Ok(MySqlTarget { url: driver, .. }) = target(&mariadb).downcast() else {
        panic!("not a mysql target");
    };
    assert!(
        driver.starts_with("mysql://"),
        "{}",
        dedup::url::redact(&driver)
    );
    round_trip(&mariadb).await;
    smoke(&UrlFactory {
        base,
        param: "table",
    })
    .await;
}

#[tokio::test]
async fn postgres_opens_with_its_parameters_and_passes_the_smoke_clauses() {
    let Some(base) = server("DEDUP_POSTGRES_URL", "postgres_opens") else {
        return;
    };
    let ns = format!(
        "t_open_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let url = format!(
        "{base}?schema={ns}&table=inbox&pool_size=3&connect_timeout=3s&clock=local&application_name=dedup-test"
    );
    let Ok(PostgresTarget {
        url: driver,
        config,
    }) = target(&url).downcast()
    else {
        panic!("not a postgres target");
    };
    assert_eq!(
        (config.schema.as_str(), config.table.as_str()),
        (ns.as_str(), "inbox")
    );
    assert_eq!(
        config.group_commit,
        Some(dedup::postgres::GroupCommit::default()),
        "group commit is on by default"
    );
    assert_eq!(config.max_connections, 3);
    assert_eq!(config.connect_timeout, Duration::from_secs(3));
    assert!(
        config.clock.is_some(),
        "clock=local injects this machine's clock"
    );
    assert!(
        driver.ends_with("?application_name=dedup-test"),
        "the driver's own parameters pass through, dedup's do not: {driver}"
    );
    round_trip(&url).await;
    for (query, expected) in [
        ("group_commit=off", None),
        (
            "group_commit_rounds=4&group_commit_max=32",
            Some(dedup::postgres::GroupCommit {
                rounds: 4,
                max_requests: 32,
            }),
        ),
    ] {
        let Ok(PostgresTarget { config, .. }) =
            target(&format!("{base}?schema={ns}&{query}")).downcast()
        else {
            panic!("not a postgres target");
        };
        assert_eq!(config.group_commit, expected, "{query}");
    }
    round_trip(&format!("{base}?schema={ns}&group_commit=off")).await;
    // postgresql:// is the same.
    round_trip(&format!(
        "{}?schema={ns}",
        base.replacen("postgres://", "postgresql://", 1)
    ))
    .await;
    smoke(&UrlFactory {
        base,
        param: "table",
    })
    .await;
}

#[tokio::test]
async fn redis_opens_with_its_parameters_and_passes_the_smoke_clauses() {
    let Some(base) = server("DEDUP_REDIS_URL", "redis_opens") else {
        return;
    };
    let url = format!(
        "{base}?prefix=open-test:&retention=2d&connect_timeout=2s&response_timeout=3s&clock=server"
    );
    let Ok(RedisTarget::Standalone { config, .. }) = target(&url).downcast() else {
        panic!("not a redis target");
    };
    assert_eq!(config.prefix, "open-test:");
    assert_eq!(config.retention, Duration::from_secs(2 * 86400));
    assert_eq!(config.connect_timeout, Duration::from_secs(2));
    assert_eq!(config.response_timeout, Some(Duration::from_secs(3)));
    assert!(config.clock.is_none(), "clock=server is the server's TIME");
    round_trip(&url).await;
    smoke(&UrlFactory {
        base,
        param: "prefix",
    })
    .await;
}

#[tokio::test]
async fn redis_cluster_opens_and_passes_the_smoke_clauses() {
    let Some(url) = cluster_url() else {
        eprintln!("SKIPPED redis_cluster_opens: DEDUP_REDIS_CLUSTER_URLS is not set");
        return;
    };
    let Ok(RedisTarget::Cluster { urls, .. }) = target(&format!("{url}?prefix=c:")).downcast()
    else {
        panic!("not a cluster target");
    };
    assert!(
        urls.len() >= 2 && urls.iter().all(|u| u.starts_with("redis://")),
        "{urls:?}"
    );
    round_trip(&format!("{url}?prefix=open-cluster:")).await;
    smoke(&UrlFactory {
        base: url,
        param: "prefix",
    })
    .await;
}

/// The URL problem of `url`, which must be rejected before anything is contacted.
fn problem(url: &str) -> UrlError {
    match StoreUrl::parse(url) {
        Ok(parsed) => panic!("{url} was accepted as {parsed:?}"),
        Err(OpenError::Url { problem, .. }) => problem,
        Err(other) => panic!("{url}: not a URL error: {other}"),
    }
}

#[test]
fn bad_urls_are_typed_errors() {
    // mysql:// became a store in dedup-mysql; oracle:// still names none.
    let unknown_scheme = ["", "inbox.db", "oracle://h/db", "file:/tmp/x"];
    for url in unknown_scheme {
        assert!(
            matches!(
                problem(url),
                UrlError::UnknownScheme { .. } | UrlError::Malformed { .. }
            ),
            "{url:?}"
        );
    }
    let malformed = [
        "sqlite:",
        "sqlite://",
        "memory:/x",
        "postgres:h/db",
        "postgres://h:notaport/db",
        "mysql:h/db",
        "redis:h",
        "redis+cluster://",
        "redis+cluster://a:1,,b:2",
        "redis://h:1?tls_ca=/x",
    ];
    for url in malformed {
        assert!(
            matches!(problem(url), UrlError::Malformed { .. }),
            "{url:?}"
        );
    }
    let unknown_parameter = [
        ("sqlite:x.db?tabel=a", "tabel"),
        ("memory:?table=a", "table"),
        ("postgres://h/db?prefix=a", "prefix"),
        ("mysql://h/db?schema=a", "schema"),
        ("redis://h:1?table=a", "table"),
        ("redis+cluster://a:1?schema=x", "schema"),
    ];
    for (url, name) in unknown_parameter {
        match problem(url) {
            UrlError::UnknownParameter { name: n, .. } => assert_eq!(n, name, "{url}"),
            other => panic!("{url}: {other:?}"),
        }
    }
    let invalid_parameter = [
        "sqlite:x.db?synchronous=sometimes",
        "sqlite:x.db?pool_size=0",
        "sqlite:x.db?block_in_place=yes",
        "sqlite:x.db?clock=server",
        "sqlite:x.db?table=a&table=b",
        "postgres://h/db?clock=atomic",
        "postgres://h/db?sslmode=maybe",
        "mysql://h/db?ssl-mode=maybe",
        "postgres://h/db?connect_timeout=soon",
        "postgres://h/db?group_commit=off&group_commit_rounds=2",
        "postgres://h/db?group_commit=maybe",
        "postgres://h/db?group_commit_rounds=0",
        "redis://h:1?retention=5w",
        "memory:?clock=server",
    ];
    for url in invalid_parameter {
        assert!(
            matches!(problem(url), UrlError::InvalidParameter { .. }),
            "{url:?}"
        );
    }
    let invalid_config = [
        "sqlite:x.db?table=drop table",
        "postgres://h/db?schema=a-b",
        "redis://h:1?prefix=a b",
        "redis://h:1?retention=0s",
        "postgres://h/db?connect_timeout=0s",
        "postgres://h/db?group_commit_max=100000",
    ];
    for url in invalid_config {
        match problem(url) {
            UrlError::Config(e) => assert!(e.is_invalid_input(), "{url}: {e}"),
            other => panic!("{url}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_rejected_url_writes_nothing_and_contacts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never.db");
    for url in [
        format!("sqlite:{}?tabel=x", path.display()),
        format!("sqlite:{}?synchronous=off", path.display()),
    ] {
        let Err(e) = dedup::open(&url).await else {
            panic!("{url} was accepted")
        };
        assert!(e.url_problem().is_some(), "{e}");
        assert!(!path.exists(), "{url}: no file may be created");
    }
    // Port 1 has no server: a URL error (not a connect error) proves nothing was contacted.
    for url in [
        "postgres://u@127.0.0.1:1/db?tabel=x",
        "redis://127.0.0.1:1?prefx=a:",
        "redis+cluster://127.0.0.1:1?table=x",
    ] {
        let Err(e) = dedup::open(url).await else {
            panic!("{url} was accepted")
        };
        assert!(e.url_problem().is_some(), "{url}: {}", chain(&e));
        let core: dedup::Error = e.into();
        assert!(core.is_invalid_input(), "converts to InvalidInput");
    }
}

#[test]
fn url_errors_mask_passwords() {
    let e = StoreUrl::parse("postgres://app:hunter2@db/x?tabel=1").unwrap_err();
    let text = chain(&e);
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("app:***@db"), "{text}");
    for url in [
        "redis://:hunter2@h:1/",
        "postgres://app:hunter2@db/x?password=hunter2",
        "redis+cluster://:hunter2@a:1,:hunter2@b:2",
    ] {
        let parsed = StoreUrl::parse(url).unwrap();
        let shown = format!("{parsed} {parsed:?} {:?}", parsed.target());
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}

#[test]
fn overrides_replace_the_urls_parameters_and_are_checked_like_them() {
    let url =
        StoreUrl::parse_with("sqlite:/tmp/x.db?table=a&pool_size=2", &[("table", "b")]).unwrap();
    assert_eq!(url.location(), "/tmp/x.db, table b");
    assert_eq!(url.file(), Some(std::path::Path::new("/tmp/x.db")));
    let url = StoreUrl::parse_with("postgres://h/db", &[("schema", "s"), ("table", "t")]).unwrap();
    assert_eq!(url.location(), "table s.t");
    assert_eq!(url.file(), None);
    let url = StoreUrl::parse_with("redis://h:1", &[("prefix", "p:")]).unwrap();
    assert_eq!(url.location(), "key prefix p:");
    // A backend without that notion refuses it, as it would in the URL.
    let refused = StoreUrl::parse_with("sqlite:/tmp/x.db", &[("schema", "s")]).unwrap_err();
    assert!(
        matches!(
            refused.url_problem(),
            Some(UrlError::UnknownParameter { .. })
        ),
        "{refused:?}"
    );
    // An override is validated: an unsafe table name is refused before anything opens.
    let bad = StoreUrl::parse_with("sqlite:/tmp/x.db", &[("table", "drop table")]).unwrap_err();
    assert!(
        matches!(bad.url_problem(), Some(UrlError::Config(_))),
        "{bad:?}"
    );
}

#[tokio::test]
async fn open_admin_gives_the_operators_view_of_the_same_store() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("admin.db").display());
    round_trip(&url).await;
    let admin = dedup::open_admin(&url).await.unwrap();
    let stats = admin.stats(0).await.unwrap();
    assert_eq!(stats.completed, 1, "the record round_trip committed");
}

/// `open_outbox`: the outbox of a SQLite file (the same rows through a second open), and a
/// typed refusal, before anything is contacted, for the stores without an outbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_outbox_gives_sql_stores_outbox_and_refuses_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("o.db").display());
    let store = dedup::sqlite::SqliteStore::open(dir.path().join("o.db"))
        .await
        .unwrap();
    let conn = store.open_connection().unwrap();
    let m = dedup::outbox::OutboxMessage::new("orders", "m-1", b"x".to_vec()).unwrap();
    assert_eq!(store.outbox().enqueue(&conn, &[m]).unwrap(), 1);
    let outbox = dedup::open_outbox(&url).await.unwrap();
    assert_eq!(outbox.backend(), "sqlite");
    assert_eq!(outbox.stats().await.unwrap().pending, 1);

    // Port 1: nothing is contacted, so nothing needs to listen there. (The SQL stores,
    // MySQL / MariaDB included, have an outbox; Redis has none.)
    for (url, backend) in [("redis://127.0.0.1:1/0", "redis")] {
        let err = dedup::open_outbox(url).await.unwrap_err();
        assert!(
            matches!(err.url_problem(), Some(UrlError::NoOutbox { backend: b }) if *b == backend),
            "{url}: {err:?}"
        );
        assert!(
            chain(&err).contains("the outbox needs a SQL store"),
            "{}",
            chain(&err)
        );
    }
}
