//! The worker of the cluster partition scenario ([`super::cluster_partition`]), started
//! inside the network namespace beside the isolated primary. It opens two stores on the
//! cluster (without and with `WAIT`), prints `READY`, and on `go` claims and commits its
//! messages through both at once, one every 50 ms, each call bounded to 3 s, reporting
//! each answer (`CLAIMED|COMMITTED|FAILED <store> <id> <ms after go> [error]`), until
//! `stop` (then `STOPPED`). On `late` it commits the keys it holds uncommitted
//! (`LATE <store> <id> <ms> ok|lease_lost|error ...`), prints `END` and exits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dedup_core::{Claim, ClaimOptions, DedupStore, Lease};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Mutex;

use super::cluster_partition::LEASE;
use super::protocol::key;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `chaos cluster-worker` (started by `chaos cluster-partition`; not for direct use).
#[derive(clap::Args, Clone, Debug)]
pub struct ClusterWorkerArgs {
    /// The store without `WAIT` (a `redis+cluster://` URL seeded with the isolated node).
    #[arg(long)]
    pub store: String,
    /// The store with `wait_replicas=1`.
    #[arg(long)]
    pub store_wait: String,
    /// Message ids for the first store, comma-separated.
    #[arg(long)]
    pub ids: String,
    /// Message ids for the second.
    #[arg(long)]
    pub ids_wait: String,
}

/// A call bounded to 3 s: its answer, or a timeout as an error text.
async fn bounded<T>(
    call: impl std::future::Future<Output = dedup_core::Result<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(Duration::from_secs(3), call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(one_line(&e)),
        Err(_) => Err("no answer within 3 s".into()),
    }
}

/// An error and its sources on one line.
fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text.replace('\n', " ")
}

fn parse_ids(list: &str) -> Result<Vec<u64>, BoxError> {
    Ok(list.split(',').map(str::parse).collect::<Result<_, _>>()?)
}

/// The leases claimed and not committed by one store's loop.
type Held = Arc<Mutex<Vec<Lease>>>;

/// One store's loop: claim and commit `ids` until `stop`.
async fn cut_loop(
    name: &'static str,
    store: Arc<dyn DedupStore>,
    ids: Vec<u64>,
    go: Instant,
    stop: Arc<AtomicBool>,
    held: Held,
) {
    let ms = || go.elapsed().as_millis();
    for id in ids {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match bounded(store.claim(&key(id), &ClaimOptions::lease(LEASE))).await {
            Ok(Claim::Acquired(lease)) => {
                println!("CLAIMED {name} {id} {}", ms());
                match bounded(store.commit(&lease, Some(b"cut"))).await {
                    Ok(()) => println!("COMMITTED {name} {id} {}", ms()),
                    Err(e) => {
                        println!("FAILED {name} {id} {} commit: {e}", ms());
                        held.lock().await.push(lease);
                    }
                }
            }
            Ok(other) => println!("FAILED {name} {id} {} claim answered {other:?}", ms()),
            Err(e) => println!("FAILED {name} {id} {} claim: {e}", ms()),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The worker (see the module docs).
pub async fn cluster_worker(args: ClusterWorkerArgs) -> Result<(), BoxError> {
    let stores: [(&'static str, Arc<dyn DedupStore>, Vec<u64>); 2] = [
        (
            "plain",
            dedup::open(&args.store).await?,
            parse_ids(&args.ids)?,
        ),
        (
            "wait",
            dedup::open(&args.store_wait).await?,
            parse_ids(&args.ids_wait)?,
        ),
    ];
    println!("READY");
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    if stdin.next_line().await?.as_deref() != Some("go") {
        return Err("expected `go`".into());
    }
    let go = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    let mut helds = Vec::new();
    for (name, store, ids) in &stores {
        let held = Held::default();
        helds.push((*name, store.clone(), held.clone()));
        loops.push(tokio::spawn(cut_loop(
            name,
            store.clone(),
            ids.clone(),
            go,
            stop.clone(),
            held,
        )));
    }
    if stdin.next_line().await?.as_deref() != Some("stop") {
        return Err("expected `stop`".into());
    }
    stop.store(true, Ordering::SeqCst);
    for l in loops {
        l.await?;
    }
    println!("STOPPED");
    if stdin.next_line().await?.as_deref() != Some("late") {
        return Err("expected `late`".into());
    }
    for (name, store, held) in helds {
        for lease in held.lock().await.iter() {
            let answer = match store.commit(lease, Some(b"late")).await {
                Ok(()) => "ok".to_string(),
                Err(e) if e.is_lease_lost() => "lease_lost".to_string(),
                Err(e) => format!("error {}", one_line(&e)),
            };
            let id = lease.key.message_id().trim_start_matches('m');
            println!("LATE {name} {id} {} {answer}", go.elapsed().as_millis());
        }
    }
    println!("END");
    Ok(())
}
