//! `wait_for_replicas`: a commit waits for replica acknowledgement (`WAIT`), and says so,
//! retryably, when too few replicas acknowledged: the commit itself has happened.

mod common;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Server, Target, config};
use dedup_core::{
    Claim, ClaimOptions, CommitRequest, DedupStore, Error, Key, ManualClock, RecordState,
};
use dedup_redis::redis::{self, IntoConnectionInfo};
use dedup_redis::{RedisConfig, RedisStore, ReplicationShortfall};

fn shortfall(result: Result<(), Error>) -> ReplicationShortfall {
    match result {
        Err(e @ Error::Backend { .. }) => {
            assert!(
                e.is_retryable(),
                "a replication shortfall is retryable: {e:?}"
            );
            let source = std::error::Error::source(&e).expect("source");
            *source
                .downcast_ref::<ReplicationShortfall>()
                .unwrap_or_else(|| panic!("source must be a ReplicationShortfall: {e:?}"))
        }
        other => panic!("expected a replication shortfall, got {other:?}"),
    }
}

async fn claim(store: &RedisStore, key: &Key) -> dedup_core::Lease {
    store
        .claim(key, &ClaimOptions::default())
        .await
        .unwrap()
        .into_lease()
        .expect("acquired")
}

/// More replicas than any test server has: the commit happens, the wait falls short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_replicas_is_a_retryable_error_after_the_commit() {
    for target in Target::all("too_few_replicas_is_a_retryable_error_after_the_commit") {
        let clock = Arc::new(ManualClock::starting_now());
        let config = RedisConfig {
            wait_for_replicas: Some((5, Duration::from_millis(20))),
            ..config("replicas_short", &clock)
        };
        let store = target.open(config).await;
        let key = Key::new("wait", "m1").unwrap();
        let lease = claim(&store, &key).await;

        let s = shortfall(store.commit(&lease, Some(b"out")).await);
        assert_eq!(s.wanted, 5);
        assert!(s.acknowledged < 5, "{s:?}");
        // The commit happened on the primary.
        match store.get(&key).await.unwrap().map(|r| r.state) {
            Some(RecordState::Completed { outcome, .. }) => {
                assert_eq!(outcome.as_deref(), Some(&b"out"[..]))
            }
            other => panic!(
                "{}: the commit must have happened: {other:?}",
                target.name()
            ),
        }
        // Retrying is safe: the same token's commit is Ok on the primary, and waits again.
        shortfall(store.commit(&lease, Some(b"other")).await);
        assert!(matches!(
            store.claim(&key, &ClaimOptions::default()).await.unwrap(),
            Claim::Completed { outcome: Some(o), .. } if o == b"out"
        ));
        // Batches too.
        let k2 = Key::new("wait", "m2").unwrap();
        let l2 = claim(&store, &k2).await;
        shortfall(
            store
                .commit_many(&[CommitRequest {
                    lease: l2,
                    outcome: None,
                }])
                .await
                .map(|_| ()),
        );
        // A commit that wrote nothing (lease lost) is LeaseLost, not a shortfall.
        let mut forged = lease.clone();
        forged.token = dedup_core::LeaseToken::random();
        assert!(
            store
                .commit(&forged, None)
                .await
                .unwrap_err()
                .is_lease_lost()
        );
    }
}

/// A replica of the standalone test server, started for this test and stopped on drop.
struct Replica {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn start_replica(primary_url: &str) -> Option<Replica> {
    let info = primary_url.into_connection_info().expect("primary url");
    let (host, port) = match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
        other => panic!("unsupported test address {other:?}"),
    };
    let free_port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let dir = std::env::temp_dir().join(format!("dedup-redis-replica-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("replica dir");
    let spawned = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &free_port.to_string()])
        .args(["--replicaof", &host, &port.to_string()])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--repl-diskless-load",
            "on-empty-db",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let child = match spawned {
        Ok(child) => child,
        Err(e) if !dedup_conformance::strict() => {
            eprintln!("SKIPPED the replica test: cannot run redis-server ({e})");
            let _ = std::fs::remove_dir_all(&dir);
            return None;
        }
        Err(e) => panic!("cannot run redis-server for the replica test: {e}"),
    };
    let replica = Replica {
        child,
        dir,
        url: format!("redis://127.0.0.1:{free_port}/"),
    };
    // Wait (polling, bounded) until the replica is connected and synced.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info: Option<String> = async {
            let mut c = redis::Client::open(replica.url.as_str())
                .ok()?
                .get_multiplexed_async_connection()
                .await
                .ok()?;
            redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut c)
                .await
                .ok()
        }
        .await;
        if info.is_some_and(|i| i.contains("master_link_status:up")) {
            return Some(replica);
        }
        assert!(
            Instant::now() < deadline,
            "the replica did not sync in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_waits_for_a_real_replica() {
    // Redis only: the replica is a redis-server started here, which cannot follow a Valkey
    // 9 primary (another RDB version); a commit with a replica wait is the same script on
    // both servers.
    let Some(target) = Target::standalone(Server::Redis) else {
        eprintln!("SKIPPED a_commit_waits_for_a_real_replica: DEDUP_REDIS_URL is not set");
        return;
    };
    let url = target.node_urls().remove(0);
    let Some(replica) = start_replica(&url).await else {
        return;
    };
    let clock = Arc::new(ManualClock::starting_now());
    let config = RedisConfig {
        wait_for_replicas: Some((1, Duration::from_secs(2))),
        ..config("replicas_real", &clock)
    };
    let store = target.open(config).await;
    let key = Key::new("wait", "real").unwrap();
    let lease = claim(&store, &key).await;
    store
        .commit(&lease, Some(b"replicated"))
        .await
        .expect("one replica acknowledges");
    // Acknowledged means the replica has it.
    let mut c = redis::Client::open(replica.url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // The packed record (see the crate README, "Record layout"): completed, with the outcome
    // last.
    let value: Option<Vec<u8>> = redis::cmd("GET")
        .arg(store.redis_key(&key))
        .query_async(&mut c)
        .await
        .unwrap();
    let value = value.expect("the replica holds the record");
    assert!(value.starts_with(b"2,c,"), "{value:?}");
    assert!(value.ends_with(b",replicated"), "{value:?}");
    drop(replica);
}
