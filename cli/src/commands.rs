//! The commands, one file each: each opens the store, does one thing, and prints it for
//! people or as JSON. This file holds the dispatcher and the helpers they share.

mod console;
mod consumers;
mod counts;
mod forget;
mod inspect;
mod list;
mod migrate;
mod outbox;
mod purge;
mod release;
mod replay;
mod stats;

use dedup_core::Key;

use crate::failure::Failure;
use crate::{Cli, Command};

/// The key the operator typed.
fn key(consumer: &str, message_id: &str) -> Result<Key, Failure> {
    Key::new(consumer, message_id).map_err(|e| Failure::store("invalid key", e))
}

/// The store's "now" (relative times are shown against it).
async fn now(store: &dyn dedup_core::Admin) -> Result<dedup_core::Timestamp, Failure> {
    store
        .now()
        .await
        .map_err(|e| Failure::store("cannot read the store's clock", e))
}

/// Run the command `cli` names.
pub(crate) async fn run(cli: Cli) -> Result<(), Failure> {
    let args = &cli.store;
    let as_json = cli.json;
    match cli.command {
        Command::Migrate => migrate::run(args, as_json).await,
        Command::Stats { top } => stats::run(args, as_json, top).await,
        Command::Consumers => consumers::run(args, as_json).await,
        Command::Inspect {
            consumer,
            message_id,
        } => inspect::run(args, as_json, &consumer, &message_id).await,
        Command::List {
            consumer,
            consumer_option,
            state,
            limit,
            after,
        } => {
            let consumer = consumer.or(consumer_option).unwrap_or_default();
            list::run(args, as_json, consumer, state, limit, after).await
        }
        Command::Purge {
            older_than,
            batch,
            dry_run,
            unpaced,
        } => purge::run(args, as_json, &older_than, batch, dry_run, unpaced).await,
        Command::Release {
            consumer,
            message_id,
            force,
        } => release::run(args, as_json, &consumer, &message_id, force).await,
        Command::Forget {
            consumer,
            message_id,
            force,
        } => forget::run(args, as_json, &consumer, &message_id, force).await,
        Command::Replay {
            dead_letters,
            consumer,
            id,
            group,
            all,
            dry_run,
            max_read,
        } => {
            let replay_args = replay::ReplayArgs {
                dead_letters,
                consumer,
                ids: id,
                group,
                all,
                dry_run,
                max_read,
            };
            replay::run(args, as_json, replay_args).await
        }
        Command::Console {
            outbox,
            listen,
            allow_writes,
            token,
            stuck_after,
            dead_letters,
        } => {
            let console_args = console::ConsoleArgs {
                outbox,
                listen,
                allow_writes,
                token,
                stuck_after,
                dead_letters,
            };
            console::run(args, console_args).await
        }
        Command::Counts { command } => counts::run(args, as_json, command).await,
        Command::Outbox { command } => outbox::run(args, as_json, command).await,
    }
}
