#![doc = include_str!("../README.md")]

mod commands;
mod failure;
mod open;
mod render;
mod screen;

use std::process::ExitCode;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use dedup_core::Status;

use crate::failure::Failure;

/// dedup: look into and maintain a dedup store (the records of an idempotent consumer).
///
/// Exit codes: 0 done, 1 failure, 2 usage, 3 not found, 4 `replay` left some picked
/// messages among the dead letters.
#[derive(Debug, Parser)]
#[command(name = "dedup", version)]
struct Cli {
    #[command(flatten)]
    store: StoreArgs,
    /// Print the result as JSON on standard output (errors stay on standard error).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

/// Which store to open.
#[derive(Debug, Args)]
struct StoreArgs {
    /// The store: sqlite:PATH, postgres://..., mysql://..., redis://..., redis+cluster://h1:p1,h2:p2,
    /// memory: (with the `dedup` crate's URL parameters: table=, prefix=, connect_timeout=...)
    // `hide_env_values`: `--help` would print the URL, password and all.
    #[arg(
        long = "store",
        env = "DEDUP_STORE_URL",
        hide_env_values = true,
        global = true,
        value_name = "URL"
    )]
    url: Option<String>,
    /// The records table of an SQL store (default: dedup_inbox).
    #[arg(long, global = true, value_name = "NAME")]
    table: Option<String>,
    /// The PostgreSQL schema holding the table (default: public).
    #[arg(long, global = true, value_name = "NAME")]
    schema: Option<String>,
    /// The key prefix of a Redis store (default: dedup:).
    #[arg(long, global = true, value_name = "PREFIX")]
    prefix: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the store's table (or upgrade its schema); safe to run again.
    Migrate,
    /// Records by state, the oldest live lease, the most retried keys, the size.
    Stats {
        /// How many of the most retried keys to show.
        #[arg(long, default_value_t = 5)]
        top: usize,
    },
    /// The consumers the store holds records of, with their records counted by state.
    Consumers,
    /// One record, human readable.
    Inspect {
        /// The consumer (the service that processes the message).
        consumer: String,
        /// The message id.
        message_id: String,
    },
    /// The records of one consumer, in message id order.
    List {
        /// The consumer whose records to list (`dedup consumers` names them); also taken as
        /// `--consumer NAME`.
        #[arg(value_name = "CONSUMER", required_unless_present = "consumer_option")]
        consumer: Option<String>,
        /// The consumer, as an option.
        #[arg(
            long = "consumer",
            value_name = "CONSUMER",
            conflicts_with = "consumer"
        )]
        consumer_option: Option<String>,
        /// Only records in this state.
        #[arg(long, value_enum)]
        state: Option<StateArg>,
        /// At most this many records (1 to 10000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Start after this message id (the last one of the previous page).
        #[arg(long, value_name = "MESSAGE_ID")]
        after: Option<String>,
    },
    /// Remove records older than the retention (completed ones, and expired leases).
    Purge {
        /// The retention: a number and a unit (ms, s, m, h, d), e.g. 7d.
        #[arg(long, value_name = "DURATION")]
        older_than: String,
        /// The largest batch (records per statement, transaction or pipeline).
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        /// Count what would be removed, remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Run batches back to back instead of pacing them (maintenance windows only:
        /// consumers then wait behind whole batches).
        #[arg(long)]
        unpaced: bool,
    },
    /// Release a stuck key's lease so the next delivery retries it at once (its worker gets
    /// LeaseLost from then on).
    Release {
        /// The consumer.
        consumer: String,
        /// The message id.
        message_id: String,
        /// Release a live lease too (its worker gets LeaseLost at once on commit, renew and
        /// release).
        #[arg(long)]
        force: bool,
    },
    /// Remove a key's record so the next delivery processes the message as new (a
    /// dead-lettered message after the fix; fences start again at 1).
    Forget {
        /// The consumer.
        consumer: String,
        /// The message id.
        message_id: String,
        /// Remove a record held by a live lease too (its worker gets LeaseLost at once).
        #[arg(long)]
        force: bool,
    },
    /// Put a consumer's dead-lettered messages back where they came from, after the fix:
    /// each is forgotten, republished with its message id and settled once the broker
    /// confirms; a key processed since is settled and not run again. Exit code 0: every
    /// picked message replayed or already processed; 4: some were left (a key in flight, an
    /// id not among the dead letters).
    #[command(group(ArgGroup::new("pick").required(true).args(["id", "group", "all"])))]
    Replay {
        /// Where the consumer's dead letters are: amqp://...?queue=Q, redis://...?stream=S
        /// (its S:dead), nats://...?stream=S, kafka://HOST:PORT?topic=T,
        /// pubsub://PROJECT?subscription=S.
        #[arg(
            long,
            value_name = "URL",
            env = "DEDUP_DEAD_LETTERS_URL",
            hide_env_values = true
        )]
        dead_letters: String,
        /// The consumer whose messages to replay.
        #[arg(long, value_name = "NAME")]
        consumer: String,
        /// Replay this message id (repeat for several).
        #[arg(long, value_name = "ID")]
        id: Vec<String>,
        /// Replay the failed and dead-lettered keys of this failure group (the id the console
        /// shows).
        #[arg(long, value_name = "GROUP_ID")]
        group: Option<String>,
        /// Replay every dead-lettered copy of the consumer.
        #[arg(long)]
        all: bool,
        /// Say what would be replayed; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Read at most this many dead letters (the picked and the others).
        #[arg(long, default_value_t = 100_000, value_name = "N")]
        max_read: usize,
    },
    /// Serve the operator's console (a web page: failures grouped, stuck leases, the
    /// outbox backlog, and forget / release / retry / purge when writes are allowed).
    Console {
        /// The outbox to show too (an SQL store's URL: sqlite:, postgres://, mysql://).
        #[arg(long, value_name = "URL")]
        outbox: Option<String>,
        /// Where to listen. Beyond loopback, viewing needs the token too.
        #[arg(long, default_value = "127.0.0.1:8377", value_name = "ADDR:PORT")]
        listen: std::net::SocketAddr,
        /// Offer the actions (forget, release, retry, purge), guarded by the token.
        #[arg(long)]
        allow_writes: bool,
        /// The token for writes (and views beyond loopback); one is generated and printed
        /// when needed and not given.
        #[arg(
            long,
            env = "DEDUP_CONSOLE_TOKEN",
            hide_env_values = true,
            value_name = "TOKEN"
        )]
        token: Option<String>,
        /// Show in-flight keys first claimed longer ago than this as stuck.
        #[arg(long, default_value = "5m", value_name = "DURATION")]
        stuck_after: String,
        /// Where a consumer's dead letters are: its dead-lettered messages are shown, and
        /// replayed with writes allowed. Repeat per consumer. The URL is one of
        /// `amqp://...?queue=`, `redis://...?stream=`, `nats://...?stream=`,
        /// `kafka://...?topic=`, `pubsub://PROJECT?subscription=`
        /// (`billing=redis://HOST?stream=orders`).
        #[arg(long, value_name = "CONSUMER=URL")]
        dead_letters: Vec<String>,
    },
    /// Kept counts: make `stats`, `consumers` and the console's overview read counts the
    /// store keeps instead of every record (SQLite, PostgreSQL), at a cost on every write.
    Counts {
        #[command(subcommand)]
        command: CountsCommand,
    },
    /// The transactional outbox of an SQL store (sqlite:, postgres://, mysql://).
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
}

/// `dedup counts ...`.
#[derive(Debug, Subcommand)]
enum CountsCommand {
    /// Start keeping counts (the starting counts are computed at once, writers waiting
    /// meanwhile); every claim, commit and purge then also updates them.
    Enable,
    /// Stop keeping counts: drop the counts table, its triggers and its index.
    Disable,
    /// Whether the store keeps counts.
    Status,
}

/// `dedup outbox ...`.
#[derive(Debug, Subcommand)]
enum OutboxCommand {
    /// Rows by state (pending, held, sent, dead) and the age of the oldest unsent one.
    Stats,
    /// Rows in id order.
    List {
        /// Only rows in this state.
        #[arg(long, value_enum)]
        state: Option<OutboxStateArg>,
        /// Only rows for this destination.
        #[arg(long)]
        destination: Option<String>,
        /// At most this many rows (1 to 10000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Start after this row id (the last one of the previous page).
        #[arg(long, value_name = "ID")]
        after: Option<i64>,
    },
    /// Make a dead (or pending) row pending again, due now, its attempts reset.
    Retry {
        /// The row's id (see `dedup outbox list --state dead`).
        id: i64,
    },
    /// Remove sent rows older than the retention.
    Purge {
        /// The retention: a number and a unit (ms, s, m, h, d), e.g. 7d.
        #[arg(long, value_name = "DURATION")]
        retention: String,
        /// The largest batch (rows per statement or transaction).
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        /// Run batches back to back instead of pacing them.
        #[arg(long)]
        unpaced: bool,
    },
}

/// The states `outbox list --state` takes.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum OutboxStateArg {
    /// Waiting to be published.
    Pending,
    /// Taken by a relay.
    Held,
    /// Published.
    Sent,
    /// Failed too often; waiting for `dedup outbox retry`.
    Dead,
}

/// The states `list --state` takes.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum StateArg {
    /// In flight with a live lease.
    InFlight,
    /// In flight, lease expired or released.
    Expired,
    /// Processed (completed with a handler's outcome).
    Completed,
    /// Completed with a failure stored as its result.
    Failed,
    /// Dead-lettered: it used up its attempts.
    DeadLetter,
}

impl From<StateArg> for Status {
    fn from(s: StateArg) -> Self {
        match s {
            StateArg::InFlight => Status::InFlight,
            StateArg::Expired => Status::Expired,
            StateArg::Completed => Status::Completed,
            StateArg::Failed => Status::Failed,
            StateArg::DeadLetter => Status::DeadLettered,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return Failure::new("cannot start the async runtime")
                .cause(e)
                .report();
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}
