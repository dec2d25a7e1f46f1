//! Property-test your own consumer: the kit runs an application's handler under the
//! lease-mode [`Inbox`](dedup_core::Inbox) or a transactional `TxInbox` through
//! proptest-generated schedules (several messages, duplicate deliveries, concurrent
//! workers, a worker killed at any step, injected failures and the redeliveries they
//! cause, leases that run out) and checks the consumer is effectively once:
//!
//! - **nothing lost**: after the schedule and a drain, every message's key is completed
//!   in the store, every message was acknowledged, and every effect the application
//!   expects ([`Kit::expect_effect`], each [`Kit::effects_query`]) happened for it; a key
//!   ends rejected (a stored failure, a dead letter) only for a message whose payload is
//!   poison ([`Kit::payloads`], [`Kit::poison`]);
//! - **transactional mode**: no effect happened twice for a message;
//! - **lease mode**: an effect happened twice only where a run was interrupted between
//!   that effect and its commit (killed there, or a later step of the same run failed or
//!   released the lease: nothing can take back an effect outside the store), and never
//!   when the handler passed the lease's idempotency key to a system that honours it.
//!
//! A failure is shrunk by proptest to the smallest schedule and printed as a story, with
//! the seed that replays it ([`Kit::seed`], or the [`SEED_ENV`] variable):
//!
//! ```text
//! dedup-testkit: the consumer broke a guarantee (lease mode)
//!   repeated: effect "invoice" happened 2 times for m0, 0 of them excused (...)
//! smallest schedule: 1 message, 2 workers: duplicate m0
//! what happened:
//!     1. broker: delivers m0
//!     2. broker: delivers m0 again
//!     3. drain: workers take turns until every delivery is acknowledged
//!     4. w0: takes m0
//!     5. w1: takes m0 (delivery 2)
//!     6. w0: reads m0: absent
//!     7. w1: reads m0: absent
//!     8. w0: effect "invoice" for m0
//!     9. w1: effect "invoice" for m0
//!    ...
//! replay: Kit::new().seed("3f...")? or DEDUP_TESTKIT_SEED=3f...
//! ```
//!
//! # How a kill at a step is deterministic
//!
//! Workers never race. Each worker is a tokio task on the kit's current-thread runtime,
//! and it can only ever wait at a *stopping point* of the kit: before every operation on
//! the store (the kit hands the consumer a view of the store that stops first), before
//! every call to the kit's [`Effects`] ledger (the application's external systems) or a
//! [`probe`](Effects::probe) the handler marks, before a transaction's commit, before an
//! ack or a nack. The driver applies the schedule one [`Step`] at a time: `Run(w)` lets
//! worker `w` pass the point it stands at and waits until it stands at the next; `Kill(w)`
//! answers "killed" at that point and at every later one, so the operation there and
//! everything after it never happens (no release, no ack: the broker redelivers);
//! `Fail(w)` answers an injected error there (a store error, a failed external call, a
//! lost ack: a handler error releases the lease and the consumer nacks, hence a
//! redelivery). So "killed after the effect and before the commit" is `Kill` while the
//! worker stands at [`Point::Commit`] (or [`Point::TxCommit`]); "before the claim" at
//! [`Point::Claim`]; "after the commit and before the ack" at [`Point::Ack`]. Given a
//! schedule, the run is the same every time: that is what lets proptest shrink it.
//!
//! Time is the kit's [`ManualClock`](dedup_core::ManualClock), given to the store
//! ([`Setup::sqlite`], [`Setup::postgres`], [`Setup::mysql`], [`Setup::memory_store`]). The
//! inbox's own renewal timer is off during a run; `Expire` moves the clock past the lease
//! and renews the leases of live workers itself, as the renewal task would have: only a
//! dead worker's lease runs out. (A live worker stalled past its lease, a GC pause, is not
//! modelled: in lease mode it would repeat effects no consumer can prevent without an
//! idempotency key.)
//!
//! After the steps the kit drains: workers take turns, the clock moves when turns pass
//! without progress, until every delivery is acknowledged (or the consumer is reported
//! stuck).
//!
//! # What it does not guarantee
//!
//! - It explores the interleavings of the kit's stopping points, not every interleaving
//!   of your code: work between two stopping points runs as one step. Mark more with
//!   [`Effects::probe`].
//! - Effects the kit does not see (a table the [`Kit::effects_query`] does not count, an
//!   HTTP call not made through [`Effects`]) are not checked.
//! - A consumer must propagate the kit's [`Interrupted`] error (`?`): a killed worker that
//!   swallows it and carries on is not a dead one.
//! - In transactional mode the `TxInbox` claims and releases on its own store: a kill
//!   inside the transaction rolls it back and the `TxInbox` releases the lease (a crashed
//!   process would leave it to run out), see `sqlite_tx`.
//! - One transaction at a time: while a worker stands inside a transaction no other
//!   worker moves (SQLite has one writer; the kit serialises PostgreSQL the same way).
//! - Consumers that spawn their own tasks are run deterministically only as far as the
//!   runtime's order is (the current-thread runtime on [`MemoryStore`](dedup_core::MemoryStore)).
//!
//! # Stores
//!
//! [`Kit::run`] uses a [`MemoryStore`](dedup_core::MemoryStore); [`Kit::run_with`] any
//! store the application builds from the kit's [`Setup`] (its SQLite file, its PostgreSQL
//! database), all cases against the one store (message ids are unique per case and per
//! run). The store lives on the kit's own tables, fresh per run and dropped after it (also
//! when it fails or panics), so the kit's clock never stamps a row of the service's own
//! inbox or outbox; [`Kit::named_tables`] opts in to tables of your choosing.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod bench;
mod check;
mod consumer;
mod gated;
mod kit;
mod report;
mod run;
mod schedule;
mod seed;
mod setup;
mod tables;
mod tx;
mod world;

pub use check::Violation;
pub use consumer::{Consumer, Cx, Effects, LeaseConsumer, Message, Mode, lease};
pub use kit::{Kit, Subject};
/// The proptest the kit runs on, for [`Kit::payloads`] strategies.
pub use proptest;
pub use report::{Failure, Report};
pub use schedule::{Schedule, Step};
pub use seed::SEED_ENV;
pub use setup::Setup;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use tx::{MySqlTx, mysql_tx};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use tx::{PostgresTx, postgres_tx};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use tx::{SqliteTx, sqlite_tx};
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub use tx::{SqlxTx, sqlx_tx};
pub use world::{InterruptKind, Interrupted, Point};

/// The README's example, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
