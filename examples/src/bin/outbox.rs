//! The inbox and the outbox together, on PostgreSQL or MySQL / MariaDB and RabbitMQ or Kafka: an orders API writes each
//! order and its `OrderPlaced` in one transaction; relays publish the outbox; billing
//! consumes with `TxInbox` and writes the invoice and `InvoiceCreated` in its transaction;
//! mail consumes with the lease-mode `Inbox` and sends one e-mail per invoice. Prints
//! orders, invoices, e-mails, doubled and lost (see `dedup_examples::outbox_story`).
//!
//! ```sh
//! eval "$(scripts/services.sh env)"   # after scripts/services.sh start postgres rabbitmq
//! cargo run --release -p dedup-examples --features full --bin outbox -- \
//!     --store "$DEDUP_POSTGRES_URL" --amqp "$DEDUP_AMQP_URL"
//! # The same on MySQL / MariaDB (scripts/services.sh start mariadb):
//! cargo run --release -p dedup-examples --features full --bin outbox -- \
//!     --store "$DEDUP_MYSQL_URL" --amqp "$DEDUP_AMQP_URL"
//! # The same on Kafka (scripts/services.sh start kafka: Tansu):
//! cargo run --release -p dedup-examples --features full --bin outbox -- \
//!     --store "$DEDUP_POSTGRES_URL" --broker kafka --kafka "$DEDUP_KAFKA_BROKERS"
//! # The same with every role in its own process, SIGKILLed at every step, and PostgreSQL
//! # and the broker crash-restarted mid-run (private servers in a temporary folder; with
//! # `--broker kafka` a private Tansu on S3 storage served by a private S3 server):
//! cargo run --release -p dedup-examples --features full --bin outbox -- --chaos
//! # ... with MariaDB as the store (flushing its log at every commit):
//! cargo run --release -p dedup-examples --features full --bin outbox -- --chaos --chaos-store mariadb
//! ```
//!
//! Exits with status 1 when an order is lost or doubled.

use std::time::Duration;

use clap::{Parser, Subcommand};
use dedup_examples::outbox_story::broker::BrokerKind;
use dedup_examples::outbox_story::run::{ChaosStore, RunConfig, run};
use dedup_examples::outbox_story::worker::{WorkerArgs, work};
use dedup_examples::report::{print_json, print_table};

/// Orders -> outbox -> RabbitMQ or Kafka -> billing (TxInbox + outbox) -> mail (Inbox).
#[derive(Parser, Debug)]
#[command(about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    worker: Option<Internal>,
    /// The store: a postgres:// or mysql:// URL (not with --chaos, which starts its own
    /// server: see --chaos-store).
    #[arg(long, alias = "postgres")]
    store: Option<String>,
    /// The broker.
    #[arg(long, value_enum, default_value_t = BrokerKind::Rabbitmq)]
    broker: BrokerKind,
    /// RabbitMQ URL, with `--broker rabbitmq` (not with --chaos, which starts its own).
    #[arg(long)]
    amqp: Option<String>,
    /// Kafka bootstrap servers, with `--broker kafka` (not with --chaos, which starts its
    /// own).
    #[arg(long)]
    kafka: Option<String>,
    /// Orders to place.
    #[arg(long, default_value_t = 100)]
    orders: u64,
    /// Run each role in worker processes that are SIGKILLed at every step, and
    /// crash-restart the store's server and the broker (RabbitMQ or Kafka) mid-run.
    #[arg(long)]
    chaos: bool,
    /// With --chaos: the store server to start privately and crash-restart mid-run.
    #[arg(long, value_enum, default_value_t = ChaosStore::Postgres)]
    chaos_store: ChaosStore,
    /// With --chaos: the probability of a kill at a step after its first (which always
    /// kills).
    #[arg(long, default_value_t = 0.02)]
    kill_rate: f64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 240)]
    timeout_secs: u64,
    /// One JSON line instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Internal {
    /// One worker process (started by --chaos; not for direct use).
    Worker(WorkerArgs),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(main_result().await)
}

async fn main_result() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    if let Some(Internal::Worker(args)) = cli.worker {
        return work(args)
            .await
            .map_err(|e| e as Box<dyn std::error::Error>);
    }
    let config = RunConfig {
        orders: cli.orders,
        store: cli.store,
        broker: cli.broker,
        broker_url: match cli.broker {
            BrokerKind::Rabbitmq => cli.amqp,
            BrokerKind::Kafka => cli.kafka,
        },
        chaos_store: cli.chaos_store,
        kill_rate: cli.chaos.then_some(cli.kill_rate),
        timeout: Duration::from_secs(cli.timeout_secs),
    };
    let figures = run(&config)
        .await
        .map_err(|e| e as Box<dyn std::error::Error>)?;
    if cli.json {
        print_json(&figures);
    } else {
        print_table(
            &[
                "orders", "requests", "invoices", "e-mails", "doubled", "lost", "kills",
                "restarts", "seconds",
            ],
            &[vec![
                figures.orders.to_string(),
                figures.requests.to_string(),
                figures.invoices.to_string(),
                figures.emails.to_string(),
                figures.doubled.to_string(),
                figures.lost.to_string(),
                figures.kills.values().sum::<u64>().to_string(),
                figures.restarts.len().to_string(),
                format!("{:.1}", figures.seconds),
            ]],
        );
    }
    let violations = figures.violations();
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations.join("; ").into())
    }
}
