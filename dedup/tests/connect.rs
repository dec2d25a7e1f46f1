//! First contact: a store that cannot be reached fails within its connect timeout, with the
//! operating system's or the server's cause in the error chain, a hint in the message, and
//! never the password.

mod common;

use std::io::ErrorKind;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::{chain, chain_has, server};
use dedup::OpenError;
use dedup::store::TimedOut;

/// A loopback port where nothing listens (bound, then closed again).
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A loopback server that accepts connections and never answers; it lives as long as the
/// returned listener's thread (the test process).
fn silent_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    port
}

/// Open `url`, which must fail; the error and how long it took.
async fn failure(url: &str) -> (OpenError, Duration) {
    let started = Instant::now();
    match dedup::open(url).await {
        Ok(_) => panic!("{} opened", dedup::url::redact(url)),
        Err(e) => (e, started.elapsed()),
    }
}

/// The checks every connect failure passes: the backend's error with its operation, no
/// password anywhere (message chain or `Debug`), no `Debug`-style dump in the message.
fn assert_plain_connect_error(e: &OpenError, backend: &str) {
    let text = chain(e);
    let store = e
        .store_error()
        .unwrap_or_else(|| panic!("not a store error: {text}"));
    assert_eq!(store.operation(), Some("connecting"), "{text}");
    assert!(
        text.contains(&format!("{backend} backend error while connecting")),
        "{text}"
    );
    assert!(
        !text.contains("hunter2") && !format!("{e:?}").contains("hunter2"),
        "{text}"
    );
    assert!(!text.contains("Backend {"), "{text}");
}

fn refused(e: &OpenError) -> bool {
    chain_has::<std::io::Error>(e, |io| io.kind() == ErrorKind::ConnectionRefused)
        || chain_has::<dedup::redis::redis::RedisError>(e, |r| r.is_connection_refusal())
}

/// `url(port)` for a port where nothing listens fails before its 3 s connect timeout, with
/// the refusal kept and the address in the hint.
async fn nothing_listening(backend: &str, url: impl Fn(u16) -> String) {
    let port = closed_port();
    let (e, took) = failure(&url(port)).await;
    assert_plain_connect_error(&e, backend);
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(refused(&e), "the OS cause is kept: {}", chain(&e));
    let hint = e.store_error().unwrap().hint().unwrap_or_default();
    assert!(
        hint.contains(&format!("nothing listens at 127.0.0.1:{port}")),
        "{hint}"
    );
    assert!(e.is_retryable());
}

/// `url(port)` for a server that accepts and never answers fails after its 500 ms connect
/// timeout, not much later, saying it timed out.
async fn silent_server(backend: &str, url: impl Fn(u16) -> String) {
    let (e, took) = failure(&url(silent_port())).await;
    assert_plain_connect_error(&e, backend);
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(1500),
        "took {took:?}"
    );
    let timed_out = chain_has::<TimedOut>(&e, |t| t.after == Duration::from_millis(500))
        || chain_has::<dedup::redis::redis::RedisError>(&e, |r| r.is_timeout());
    assert!(timed_out, "{}", chain(&e));
}

#[tokio::test]
async fn postgres_nothing_listening_fails_at_once_with_the_os_cause() {
    nothing_listening("postgres", |port| {
        format!("postgres://app:hunter2@127.0.0.1:{port}/db?connect_timeout=3s")
    })
    .await;
}

#[tokio::test]
async fn postgres_silent_server_fails_within_the_connect_timeout() {
    silent_server("postgres", |port| {
        format!("postgres://app:hunter2@127.0.0.1:{port}/db?connect_timeout=500ms")
    })
    .await;
}

#[tokio::test]
async fn mysql_nothing_listening_fails_at_once_with_the_os_cause() {
    nothing_listening("mysql", |port| {
        format!("mysql://app:hunter2@127.0.0.1:{port}/db?connect_timeout=3s")
    })
    .await;
}

#[tokio::test]
async fn mysql_silent_server_fails_within_the_connect_timeout() {
    silent_server("mysql", |port| {
        format!("mysql://app:hunter2@127.0.0.1:{port}/db?connect_timeout=500ms")
    })
    .await;
}

#[tokio::test]
async fn redis_nothing_listening_fails_at_once_with_the_os_cause() {
    nothing_listening("redis", |port| {
        format!("redis://:hunter2@127.0.0.1:{port}/?connect_timeout=3s")
    })
    .await;
}

#[tokio::test]
async fn redis_silent_server_fails_within_the_connect_timeout() {
    silent_server("redis", |port| {
        format!("redis://:hunter2@127.0.0.1:{port}/?connect_timeout=500ms")
    })
    .await;
}

#[tokio::test]
async fn redis_cluster_nothing_listening_fails_within_the_connect_timeout() {
    let url = format!(
        "redis+cluster://:hunter2@127.0.0.1:{},:hunter2@127.0.0.1:{}?connect_timeout=1s",
        closed_port(),
        closed_port()
    );
    let (e, took) = failure(&url).await;
    assert_plain_connect_error(&e, "redis");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert!(e.is_retryable(), "{}", chain(&e));
    // redis-rs keeps the nodes' errors of a cluster's first connection only as words.
    let text = chain(&e);
    assert!(
        text.contains("Connection refused"),
        "the OS cause is kept: {text}"
    );
    let hint = e.store_error().unwrap().hint().unwrap_or_default();
    assert!(hint.contains("nothing listens at 127.0.0.1:"), "{hint}");
}

#[tokio::test]
async fn sqlite_missing_folder_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-folder");
    let url = format!("sqlite:{}", missing.join("inbox.db").display());
    let (e, _) = failure(&url).await;
    let text = chain(&e);
    let store = e.store_error().expect("a store error");
    assert_eq!(
        store.operation(),
        Some("opening the database file"),
        "{text}"
    );
    assert!(
        store
            .hint()
            .is_some_and(|h| h.contains(&format!("{} does not exist", missing.display()))),
        "{text}"
    );
    assert!(
        chain_has::<dedup::sqlite::rusqlite::Error>(&e, |_| true),
        "the driver's error is kept: {text}"
    );
    assert!(!missing.exists());
}

#[tokio::test]
async fn postgres_unknown_role_and_database_are_named() {
    let Some(base) = server("DEDUP_POSTGRES_URL", "postgres_unknown_role") else {
        return;
    };
    let parsed = url::Url::parse(&base).unwrap();
    let mut role = parsed.clone();
    role.set_username("no_such_role").unwrap();
    role.set_password(Some("hunter2")).unwrap();
    let (e, _) = failure(role.as_str()).await;
    assert_plain_connect_error(&e, "postgres");
    let hint = e
        .store_error()
        .unwrap()
        .hint()
        .unwrap_or_default()
        .to_owned();
    assert!(
        hint.contains("role \"no_such_role\" does not exist"),
        "{}",
        chain(&e)
    );
    assert!(
        chain_has::<dedup::postgres::sqlx::Error>(&e, |s| s.as_database_error().is_some()),
        "the server's error is kept: {}",
        chain(&e)
    );

    let mut db = parsed;
    db.set_path("/no_such_database");
    let (e, _) = failure(db.as_str()).await;
    let hint = e
        .store_error()
        .unwrap()
        .hint()
        .unwrap_or_default()
        .to_owned();
    assert!(
        hint.contains("database \"no_such_database\" does not exist"),
        "{}",
        chain(&e)
    );
}

#[tokio::test]
async fn redis_rejected_password_is_not_shown() {
    let Some(base) = server("DEDUP_REDIS_URL", "redis_rejected_password") else {
        return;
    };
    // The test server has no password: AUTH with one is refused.
    let url = base.replacen("redis://", "redis://:hunter2@", 1);
    let (e, _) = failure(&url).await;
    assert_plain_connect_error(&e, "redis");
}

#[tokio::test]
async fn a_cluster_node_given_as_a_standalone_server_says_so() {
    let Some(urls) = server("DEDUP_REDIS_CLUSTER_URLS", "a_cluster_node_as_standalone") else {
        return;
    };
    let first = urls.split(',').next().unwrap().trim().to_owned();
    let (e, _) = failure(&first).await;
    let text = chain(&e);
    assert!(
        text.contains("Redis Cluster node") && text.contains("redis+cluster://"),
        "{text}"
    );
}

#[tokio::test]
async fn a_failing_operation_names_itself() {
    use dedup::Key;
    use dedup::store::ClaimOptions;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.db");
    let store = dedup::open(&format!("sqlite:{}", path.display()))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    // The table vanishes behind the store's back: the next claim fails in the database.
    let conn = dedup::sqlite::rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("DROP TABLE dedup_inbox").unwrap();
    let key = Key::new("c", "m").unwrap();
    let e = store
        .claim(&key, &ClaimOptions::lease(Duration::from_secs(5)))
        .await
        .expect_err("no table to claim in");
    assert_eq!(e.operation(), Some("claiming"), "{}", chain(&e));
    assert!(
        e.to_string()
            .starts_with("sqlite backend error while claiming"),
        "{}",
        chain(&e)
    );
}
