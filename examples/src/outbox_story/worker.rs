//! The worker process of a chaos run: one role, started by the run, SIGKILLed at its steps.

use std::path::PathBuf;

use super::broker::{Broker, BrokerKind};
use super::roles::Ctx;
use super::run::Role;
use super::{BoxError, Killer, Names};

/// What the run passes to a worker process (`outbox worker ...`).
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    #[arg(long, value_enum)]
    role: Role,
    #[arg(long)]
    store: String,
    #[arg(long, value_enum)]
    broker: BrokerKind,
    #[arg(long)]
    broker_url: String,
    #[arg(long)]
    run_id: String,
    #[arg(long)]
    run_dir: PathBuf,
    #[arg(long)]
    kill_rate: f64,
}

/// Run the role until killed. An error (a lost connection) exits, and the run starts the
/// worker again.
pub async fn work(args: WorkerArgs) -> Result<(), BoxError> {
    let broker = Broker {
        kind: args.broker,
        url: args.broker_url,
    };
    let names = Names::for_run(&args.run_id);
    let ctx = Ctx {
        store: args.store,
        broker,
        names,
    };
    let killer = Killer {
        dir: args.run_dir,
        rate: args.kill_rate,
    };
    let never = dedup_brokers::Shutdown::never();
    args.role.run(&ctx, Some(killer), never).await
}
