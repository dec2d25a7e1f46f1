//! The transactional outbox: messages written in the producer's own transaction and
//! published after it commits.
//!
//! The inbox stops a message from being processed twice; the outbox makes sure the
//! messages a transaction sends leave the database exactly when the transaction commits:
//!
//! 1. A producer builds [`OutboxMessage`]s (checked when built) and writes them with its
//!    backend's `enqueue` inside the transaction that writes its business rows (a
//!    transactional-inbox handler gives them ids from a [`ConsumerOutbox`]). A rollback
//!    writes nothing; a commit makes the rows visible.
//! 2. A [`Relay`] takes due rows from the [`OutboxStore`] under a hold, publishes them
//!    through a [`Publisher`], and marks them sent (or failed, or dead after
//!    [`RelayConfig::max_attempts`]).
//! 3. The consumer uses the message id as its inbox key: a row published twice (a relay
//!    killed between the publish and the mark) is a duplicate its inbox drops.
//!
//! What it guarantees, and what not: every committed row is published at least once
//! while a relay runs and the broker accepts it, never a rolled-back one, with one id
//! across every copy; rows of one ordering key in commit order, one at a time. Exactly
//! once is the consumer's inbox's job. A dead row waits for an operator (`dedup outbox
//! retry`); it does not block other rows.
//!
//! [`MemoryOutbox`] is the reference model; the SQL backends implement the same contract
//! on a table, checked by the same clauses in `dedup-conformance`.

mod listen;
mod memory;
mod message;
mod publisher;
mod relay;
mod relay_health;
mod store;

pub use memory::{MemoryOutbox, MemoryOutboxTx};
pub use message::{
    ConsumerOutbox, MAX_DELAY, MAX_DESTINATION_LEN, MAX_HEADER_NAME_LEN, MAX_HEADER_VALUE_LEN,
    MAX_HEADERS, MAX_MESSAGE_ID_LEN, MAX_ORDERING_KEY_LEN, MAX_PAYLOAD_LEN, OutboxMessage,
    derived_message_id,
};
pub use publisher::{InjectedFailure, MemoryPublisher, Publisher};
pub use relay::{Relay, RelayConfig, RelayHandle, RelayRound};
pub use relay_health::{RelayHealth, RelayHealthSnapshot};
pub use store::{
    AfterFailure, DestinationStats, DestinationTally, Held, MAX_ERROR_LEN, OutboxEntry,
    OutboxQuery, OutboxRow, OutboxState, OutboxStats, OutboxStore, cut_error,
};
