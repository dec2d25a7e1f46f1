//! The chaos harness: worker processes consume an at-least-once queue while they are
//! SIGKILLed at chosen points and the queue's PostgreSQL and the store's own server are
//! crash-restarted under them; then every message's effects are counted (see `dedup_chaos` for the protocol and
//! the checks).
//!
//! ```sh
//! cargo run --release -p dedup-chaos --features full            # every backend and mode
//! cargo run --release -p dedup-chaos --features full -- --backend redis --messages 100 --json
//! cargo run --release -p dedup-chaos --features full -- --failover --backend postgres --seed 13
//! sudo target/release/chaos partition      # needs root: `ip netns`
//! sudo target/release/chaos cluster-partition --seed 31
//! sudo target/release/chaos slow-link
//! ```
//!
//! `--failover` runs the store on a primary with a standby and promotes the standby under
//! load (`dedup_chaos::controller::RunConfig::failover`); `partition` cuts a
//! worker in a network namespace off while its lease runs out
//! (`dedup_chaos::partition`); `cluster-partition` cuts a Redis Cluster primary
//! off in a minority (`dedup_chaos::cluster_partition`); `slow-link` delays a
//! worker's requests so that its renewals arrive late (`dedup_chaos::slow_link`).
//!
//! `--backend` takes the registry's names (`dedup::url::backends()`) of the backends with
//! a chaos module (`dedup_chaos::backends`). Needs PostgreSQL 15 binaries (the
//! queue) and each chosen store's server binaries (`redis-server`, MariaDB), as
//! `scripts/services.sh` installs them; each run starts private servers of its own in a
//! temporary folder. Exits with status 1 when a check fails.

use std::time::Duration;

use clap::{Parser, Subcommand};
#[cfg(feature = "redis")]
use dedup_chaos::cluster_partition as cluster;
use dedup_chaos::partition::{self, CutWorkerArgs, Outcome, PartitionArgs, cut_worker};
use dedup_chaos::slow_link;
use dedup_chaos::worker::{WorkerArgs, work};
use dedup_chaos::{Figures, Mode, Replication, RunConfig, Window, backends, run};
use dedup_lab::report::{print_json, print_table};

/// Kill workers at every step of processing, restart the servers, count the effects.
#[derive(Parser, Debug)]
#[command(about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    worker: Option<Internal>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Internal {
    /// One worker process (started by the controller; not for direct use).
    Worker(WorkerArgs),
    /// The partition scenario: a worker in a network namespace of its own is cut off
    /// while its lease runs out (needs root; see `dedup_chaos::partition`).
    Partition(PartitionArgs),
    /// The partition scenario's worker in the namespace (not for direct use).
    CutWorker(CutWorkerArgs),
    /// The Redis Cluster partition scenario: a primary cut off in a minority (needs root;
    /// see `dedup_chaos::cluster_partition`).
    #[cfg(feature = "redis")]
    ClusterPartition(cluster::ClusterPartitionArgs),
    /// Its worker in the namespace (not for direct use).
    #[cfg(feature = "redis")]
    ClusterWorker(cluster::ClusterWorkerArgs),
    /// The slow link scenario: a worker whose packets are delayed renews its lease late
    /// (needs root; see `dedup_chaos::slow_link`).
    SlowLink(slow_link::SlowLinkArgs),
    /// Its worker in the namespace (not for direct use).
    SlowWorker(slow_link::SlowWorkerArgs),
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Backends to run, by their registry name (repeatable; default: every compiled-in
    /// backend with a chaos module).
    #[arg(long)]
    backend: Vec<String>,
    /// Modes to run (repeatable; default: both; transactional runs on the backends whose
    /// chaos module has a transactional handler).
    #[arg(long, value_enum)]
    mode: Vec<Mode>,
    /// Messages per run.
    #[arg(long, default_value_t = 300)]
    messages: u64,
    /// Worker processes at a time.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Probability that an announced window ends in a SIGKILL (the first of each window
    /// always does).
    #[arg(long, default_value_t = 0.03)]
    kill_rate: f64,
    /// Lease of every claim, ms.
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
    /// Visibility timeout of the queue, ms.
    #[arg(long, default_value_t = 1000)]
    visibility_ms: u64,
    /// Seed of the kill decisions (default: random).
    #[arg(long)]
    seed: Option<u64>,
    /// Fail a run whose queue is not drained within this many seconds.
    #[arg(long, default_value_t = 600)]
    deadline_secs: u64,
    /// Also print one `JSON {...}` line per run.
    #[arg(long)]
    json: bool,
    /// Lease mode only, with workers that skip the store: shows the checks failing.
    #[arg(long)]
    without_dedup: bool,
    /// Failover runs instead: the store on a primary with a replica, the primary SIGKILLed
    /// and the replica promoted under load (backends with a failover run: postgres, mysql,
    /// redis).
    #[arg(long)]
    failover: bool,
    /// With `--failover`: the standby's replication (repeatable; default: async and sync).
    #[arg(long, value_enum, requires = "failover")]
    replication: Vec<Replication>,
}

fn row(f: &Figures) -> Vec<String> {
    let name = |v: &dyn std::fmt::Debug| format!("{v:?}").to_lowercase();
    let mut row = vec![
        f.backend.unwrap_or("?").to_string(),
        name(&f.mode.map_or("?".into(), |m| name(&m))),
        f.messages.to_string(),
        f.deliveries.to_string(),
    ];
    row.extend(Window::ALL.map(|w| f.kills.get(w.name()).copied().unwrap_or(0).to_string()));
    row.extend([
        f.restarts.keys().copied().collect::<Vec<_>>().join("+"),
        f.effects.to_string(),
        f.doubled.to_string(),
        f.doubled_paired.to_string(),
        f.lost.to_string(),
        f.lease_lost.to_string(),
        f.replication.map_or("-".into(), |r| name(&r)),
        f.completions_lost.map_or("-".into(), |n| n.to_string()),
        format!("{:.1}", f.seconds),
    ]);
    row.into_iter()
        .map(|c| c.trim_matches('"').to_string())
        .collect()
}

/// `chaos partition`: run the scenario, print its steps; exit 1 when the contract broke.
async fn partition_main(
    args: &PartitionArgs,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let figures = match partition::run(args, &std::env::current_exe()?).await? {
        Outcome::Ran(figures) => figures,
        Outcome::Unavailable(why) => {
            println!("SKIPPED partition: cannot make a network namespace here: {why}");
            return Ok(());
        }
    };
    if args.json {
        print_json(&figures);
    }
    let steps = [
        (
            "first claim (in the namespace), fence",
            figures.first_fence.to_string(),
        ),
        (
            "its renewal while cut off",
            figures.renew_during_cut.clone(),
        ),
        (
            "second claim after the lease ran out",
            figures.second_claim.clone(),
        ),
        ("second fence", figures.second_fence.to_string()),
        (
            "second worker's downstream write",
            figures.second_write.clone(),
        ),
        (
            "first worker's downstream write after the heal",
            figures.first_write_after_heal.clone(),
        ),
        (
            "first worker's commit after the heal",
            figures.first_commit_after_heal.clone(),
        ),
        (
            "downstream row: writer, fence",
            format!(
                "{}, {}",
                figures.downstream_writer, figures.downstream_fence
            ),
        ),
    ];
    let rows: Vec<Vec<String>> = steps
        .into_iter()
        .map(|(s, v)| vec![s.to_string(), v])
        .collect();
    print_table(&["step", "answer"], &rows);
    let violations = figures.violations();
    if violations.is_empty() {
        println!("partition: every check passed");
        return Ok(());
    }
    for v in violations {
        println!("FAILED partition: {v}");
    }
    std::process::exit(1);
}

/// `chaos slow-link`: run it per delay, print one row each; exit 1 when the contract
/// broke.
async fn slow_link_main(
    args: &slow_link::SlowLinkArgs,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let rows = match slow_link::run(args, &std::env::current_exe()?).await? {
        slow_link::Outcome::Ran(rows) => rows,
        slow_link::Outcome::Unavailable(why) => {
            println!("SKIPPED slow-link: cannot make a network namespace here: {why}");
            return Ok(());
        }
    };
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|f| {
            [
                f.delay_ms,
                f.lease_ms,
                f.handler_ms,
                f.messages,
                f.renew_ms_mean,
                f.takeovers,
                f.renewals_refused,
                f.slow_writes_rejected,
                f.slow_commits_lease_lost,
                f.doubled_downstream,
            ]
            .map(|v| v.to_string())
            .into()
        })
        .collect();
    for f in &rows {
        if args.json {
            print_json(f);
        }
    }
    print_table(
        &[
            "delay ms",
            "lease ms",
            "handler ms",
            "messages",
            "renewal ms (mean)",
            "takeovers",
            "renewals refused",
            "slow writes rejected",
            "slow commits lease_lost",
            "doubled downstream",
        ],
        &table,
    );
    let violations: Vec<String> = rows.iter().flat_map(|f| f.violations()).collect();
    if violations.is_empty() {
        println!("slow-link: every check passed");
        return Ok(());
    }
    for v in violations {
        println!("FAILED slow-link: {v}");
    }
    std::process::exit(1);
}

/// A random seed (when `--seed` is not given).
fn random_seed() -> u64 {
    u64::from_le_bytes(
        uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or_default(),
    )
}

/// `chaos cluster-partition`: run it per node timeout, print one row per store; exit 1
/// when the contract broke.
#[cfg(feature = "redis")]
async fn cluster_partition_main(
    args: &cluster::ClusterPartitionArgs,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let seed = args.seed.unwrap_or_else(random_seed);
    println!("chaos cluster-partition: seed {seed}");
    let rows = match cluster::run(args, seed, &std::env::current_exe()?).await? {
        cluster::Outcome::Ran(rows) => rows,
        cluster::Outcome::Unavailable(why) => {
            println!("SKIPPED cluster-partition: cannot make a network namespace here: {why}");
            return Ok(());
        }
    };
    let ms = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|f| {
            vec![
                f.node_timeout_ms.to_string(),
                if f.wait { "WAIT 1" } else { "none" }.into(),
                f.claims_acked.to_string(),
                f.commits_acked.to_string(),
                f.errors.to_string(),
                ms(f.last_ack_ms),
                ms(f.replica_promoted_ms),
                ms(f.fresh_client_claim_ms),
                ms(f.long_lived_client_claim_ms),
                ms(f.rejoined_ms),
                f.completions_lost.to_string(),
                f.doubled.to_string(),
                f.leases_lost.to_string(),
                format!("{} / {}", f.late_commits_lease_lost, f.late_commits_ok),
            ]
        })
        .collect();
    for f in &rows {
        if args.json {
            print_json(f);
        }
    }
    print_table(
        &[
            "node timeout ms",
            "wait",
            "claims acked (cut)",
            "commits acked (cut)",
            "errors (cut)",
            "last ack ms",
            "replica promoted ms",
            "majority claim ms: fresh client",
            "long-lived client",
            "rejoined ms after heal",
            "completions lost",
            "doubled",
            "leases lost",
            "late commits lease_lost / ok",
        ],
        &table,
    );
    let violations: Vec<String> = rows.iter().flat_map(|f| f.violations()).collect();
    if violations.is_empty() {
        println!("cluster-partition: every check passed");
        return Ok(());
    }
    for v in violations {
        println!("FAILED cluster-partition: {v}");
    }
    std::process::exit(1);
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let cli = Cli::parse();
    match cli.worker {
        Some(Internal::Worker(args)) => return work(args).await,
        Some(Internal::CutWorker(args)) => return cut_worker(args).await,
        Some(Internal::Partition(args)) => return partition_main(&args).await,
        Some(Internal::SlowLink(args)) => return slow_link_main(&args).await,
        Some(Internal::SlowWorker(args)) => return slow_link::slow_worker(args).await,
        #[cfg(feature = "redis")]
        Some(Internal::ClusterPartition(args)) => return cluster_partition_main(&args).await,
        #[cfg(feature = "redis")]
        Some(Internal::ClusterWorker(args)) => return cluster::cluster_worker(args).await,
        None => {}
    }
    let args = cli.run;
    let chosen = match args.backend.as_slice() {
        [] => backends::all(),
        names => names
            .iter()
            .map(|n| backends::named(n))
            .collect::<Result<_, _>>()?,
    };
    let modes = match args.mode.as_slice() {
        [] if args.without_dedup => vec![Mode::Lease],
        [] => vec![Mode::Transactional, Mode::Lease],
        m => m.to_vec(),
    };
    let seed = args.seed.unwrap_or_else(random_seed);
    println!("chaos: seed {seed}");
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    let replications: Vec<Option<Replication>> = match (args.failover, &args.replication[..]) {
        (false, _) => vec![None],
        (true, []) => vec![Some(Replication::Async), Some(Replication::Sync)],
        (true, r) => r.iter().copied().map(Some).collect(),
    };
    let mut runs = Vec::new();
    for &chaos in &chosen {
        for &mode in &modes {
            for &failover in &replications {
                runs.push((chaos, mode, failover));
            }
        }
    }
    for (chaos, mode, failover) in runs {
        let backend = chaos.descriptor.name;
        {
            if mode == Mode::Transactional && chaos.transactional.is_none() {
                continue;
            }
            if failover.is_some() && chaos.failover.is_none() {
                println!("chaos: {backend} has no failover run; skipped");
                continue;
            }
            let config = RunConfig {
                backend: backend.to_owned(),
                mode,
                messages: args.messages,
                workers: args.workers,
                kill_rate: args.kill_rate,
                lease: Duration::from_millis(args.lease_ms),
                visibility: Duration::from_millis(args.visibility_ms),
                seed,
                deadline: Duration::from_secs(args.deadline_secs),
                exe: std::env::current_exe()?,
                without_dedup: args.without_dedup,
                failover,
            };
            let figures = run(&config).await?;
            if args.json {
                print_json(&figures);
            }
            for v in figures.violations() {
                failed.push(format!("{backend} {mode:?}: {v}"));
            }
            rows.push(row(&figures));
        }
    }
    if rows.is_empty() {
        let with_handler: Vec<_> = backends::all()
            .into_iter()
            .filter(|c| c.transactional.is_some())
            .map(|c| c.descriptor.name)
            .collect();
        return Err(format!(
            "nothing to run: transactional mode needs a backend whose chaos module has a \
             transactional handler ({})",
            with_handler.join(", ")
        )
        .into());
    }
    print_table(
        &[
            "backend",
            "mode",
            "messages",
            "deliveries",
            "kill:before_claim",
            "kill:claim_effect",
            "kill:effect_commit",
            "kill:commit_ack",
            "restarted",
            "effects",
            "doubled",
            "doubled paired",
            "lost",
            "lease lost",
            "replication",
            "completions lost",
            "seconds",
        ],
        &rows,
    );
    if failed.is_empty() {
        println!("chaos: every check passed");
        Ok(())
    } else {
        for f in &failed {
            println!("FAILED {f}");
        }
        std::process::exit(1);
    }
}
