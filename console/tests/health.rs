//! `/healthz` and `/readyz`: answered without the token, 200 or 503 as the store and a
//! consumer come and go. Both run on a private `redis-server` this test starts and kills.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use common::web::get;
use dedup::{Inbox, InboxConfig, MemoryStore};
use dedup_brokers::redis_streams::StreamConsumer;
use dedup_brokers::{ConsumerConfig, Delivery, shutdown, with_inbox};
use dedup_console::{Console, ConsoleConfig};
use serde_json::Value;

/// A `redis-server` of this test's own, on a free port, killed on drop.
struct PrivateRedis {
    port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl PrivateRedis {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut redis = PrivateRedis {
            port,
            child: None,
            _dir: tempfile::tempdir().unwrap(),
        };
        redis.restart();
        redis
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts it (again, on the same port) and waits until it answers.
    fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self._dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server runs (Debian's redis-server package)");
        self.child = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis never came up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills it (by its process id) and waits for it to be gone.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `path`'s status and JSON body, waiting up to 15 s for `status`.
async fn until(app: &Router, path: &str, status: StatusCode) -> Value {
    let start = Instant::now();
    loop {
        let (got, body) = get(app, path).await;
        if got == status {
            return serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{path} stays {got}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A console whose views need the token: the probes do not.
fn guarded() -> ConsoleConfig {
    let mut config = ConsoleConfig::default();
    config.token = Some(common::TOKEN.to_owned());
    config.views_need_token = true;
    config
}

fn probe<'a>(body: &'a Value, name: &str) -> &'a Value {
    body["probes"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no probe {name}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_while_the_store_is_away() {
    let mut redis = PrivateRedis::start();
    let url = format!("{}?prefix=console-health:", redis.url());
    let admin = dedup::open_admin(&url).await.expect("open the store");
    let app = Console::new(admin, &url, guarded()).unwrap().router();
    let (status, _) = get(&app, "/api/overview").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "views need the token");

    let ready = until(&app, "/readyz", StatusCode::OK).await;
    assert_eq!(ready["status"], "ok");
    assert_eq!(probe(&ready, "store")["ready"], true);

    redis.kill();
    let ready = until(&app, "/readyz", StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(ready["status"], "fail");
    let store = probe(&ready, "store");
    assert_eq!(store["ready"], false, "{ready}");
    assert!(
        ["unreachable", "timed out"].contains(&store["detail"].as_str().unwrap()),
        "{ready}"
    );
    let text = ready.to_string();
    assert!(
        !text.contains(&redis.port.to_string()),
        "no address: {text}"
    );
    // A store away is no reason to restart the service.
    let (status, live) = get(&app, "/healthz").await;
    assert_eq!(status, StatusCode::OK, "{live}");

    redis.restart();
    until(&app, "/readyz", StatusCode::OK).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_a_consumer_connection() {
    let mut redis = PrivateRedis::start();
    let client = redis::Client::open(redis.url()).unwrap();
    let config = ConsumerConfig {
        retry_delay: Duration::from_millis(50),
        max_retry_delay: Duration::from_millis(200),
        ..ConsumerConfig::default()
    };
    let consumer = StreamConsumer::new(client, "orders", "billing", "w1", config);
    let health = consumer.health();
    let handler = with_inbox(
        Inbox::from_arc(Arc::new(MemoryStore::new()), InboxConfig::default()),
        |_lease, _delivery: Delivery| async { Ok::<_, std::io::Error>(None) },
    );
    let (stop, signal) = shutdown();
    let running = tokio::spawn(consumer.run(handler, signal));

    let store = "sqlite::memory:";
    let admin = dedup::open_admin(store).await.unwrap();
    let app = Console::new(admin, store, guarded())
        .unwrap()
        .with_probe(health.probe("orders"))
        .router();
    let ready = until(&app, "/readyz", StatusCode::OK).await;
    assert_eq!(probe(&ready, "consumer orders")["connected"], true);

    redis.kill();
    let ready = until(&app, "/readyz", StatusCode::SERVICE_UNAVAILABLE).await;
    let orders = probe(&ready, "consumer orders");
    assert_eq!(orders["connected"], false, "{ready}");
    assert_eq!(orders["detail"], "not connected", "{ready}");
    assert_eq!(probe(&ready, "store")["ready"], true, "{ready}");
    let (status, _) = get(&app, "/healthz").await;
    assert_eq!(status, StatusCode::OK, "reconnecting is alive");

    // It comes back, and the consumer reconnects by itself.
    redis.restart();
    until(&app, "/readyz", StatusCode::OK).await;
    stop.shut_down();
    running.await.unwrap().unwrap();
}
