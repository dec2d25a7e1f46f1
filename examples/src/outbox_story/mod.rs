//! The whole story of `src/bin/outbox.rs`: an orders API, an outbox relay, a billing
//! consumer and a mail consumer, on PostgreSQL or MySQL / MariaDB ([`db`]) and RabbitMQ
//! ([`rabbit`]) or Kafka ([`kafka`]), chosen by [`broker::Broker`].
//!
//! 1. `POST /orders` (behind `dedup-http`'s `Idempotency-Key` layer) writes the order and
//!    its `OrderPlaced` message in one transaction ([`api`]).
//! 2. Relays publish the outbox to the broker, `Ok` only on its confirm ([`roles::relay`]).
//! 3. Billing consumes `OrderPlaced` through `TxInbox`: the invoice and its
//!    `InvoiceCreated` message (ids from `ConsumerOutbox`) commit with the inbox record
//!    ([`roles::billing`]).
//! 4. Mail consumes `InvoiceCreated` through the lease-mode `Inbox` and sends one e-mail
//!    per invoice through a provider that honours the lease's idempotency key
//!    ([`roles::mail`]).
//!
//! [`run`] runs it all; with chaos on, it runs the roles as processes it SIGKILLs at every
//! step, and crash-restarts the store server (PostgreSQL or MariaDB) and the broker
//! (RabbitMQ, or Kafka: Tansu on S3 storage) under them. [`Db::count`] reads what happened: every order
//! must have exactly one invoice and one e-mail.

pub mod api;
pub mod broker;
pub mod db;
pub mod kafka;
pub mod rabbit;
pub mod roles;
pub mod run;
pub mod worker;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

pub use db::Db;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where one run keeps everything: a PostgreSQL schema (or, on MySQL / MariaDB, a table
/// prefix) and two queues (Kafka: topics) of its own.
#[derive(Clone, Debug)]
pub struct Names {
    /// The schema (PostgreSQL) or table prefix (MySQL) of the business tables, the inbox
    /// and the outbox.
    pub schema: String,
    /// The queue `OrderPlaced` goes to.
    pub orders_queue: String,
    /// The queue `InvoiceCreated` goes to.
    pub invoices_queue: String,
}

impl Names {
    /// Fresh names for a run.
    pub fn fresh() -> Self {
        Self::for_run(&uuid::Uuid::new_v4().simple().to_string()[..10])
    }

    /// The names of run `id` (`[a-z0-9]`).
    pub fn for_run(id: &str) -> Self {
        Names {
            schema: format!("outbox_story_{id}"),
            orders_queue: format!("orders-{id}"),
            invoices_queue: format!("invoices-{id}"),
        }
    }

    /// The run id these names were made from.
    pub fn run_id(&self) -> &str {
        self.schema.trim_start_matches("outbox_story_")
    }

    /// The dedup store (inbox and outbox tables) and business tables of the run on the
    /// store at `url` (PostgreSQL: the run's schema; MySQL / MariaDB: its table prefix).
    pub async fn store(&self, url: &str) -> Result<Db, BoxError> {
        Db::open(url, self).await
    }
}

/// What a run did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figures {
    /// Orders the client placed (each once).
    pub orders: u64,
    /// `POST /orders` requests sent, client retries with the same key included.
    pub requests: u64,
    /// Order rows written.
    pub order_rows: u64,
    /// Invoices written.
    pub invoices: u64,
    /// E-mails the provider accepted.
    pub emails: u64,
    /// Calls made to the mail provider (a call repeated after a kill is refused by it).
    pub mail_calls: u64,
    /// Orders with more than one invoice or e-mail.
    pub doubled: u64,
    /// Orders without an invoice or without an e-mail.
    pub lost: u64,
    /// Outbox rows still unsent (pending, held or dead) at the end.
    pub unsent: u64,
    /// SIGKILLs by where they landed.
    pub kills: BTreeMap<String, u64>,
    /// Worker processes that exited by themselves (a broker connection lost in a restart)
    /// and were started again.
    pub worker_exits: u64,
    /// Server crash-restarts made mid-run.
    pub restarts: BTreeMap<&'static str, u64>,
    /// Wall time, in seconds.
    pub seconds: f64,
}

impl Figures {
    /// The checks this run failed (empty: passed): no order lost, none doubled.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.order_rows != self.orders {
            out.push(format!(
                "{} order rows for {} orders",
                self.order_rows, self.orders
            ));
        }
        if self.lost > 0 {
            out.push(format!("{} orders without an invoice or e-mail", self.lost));
        }
        if self.doubled > 0 {
            out.push(format!(
                "{} orders with a doubled invoice or e-mail",
                self.doubled
            ));
        }
        out
    }

    /// Whether every order has its invoice and e-mail (the run may stop waiting).
    pub fn complete(&self) -> bool {
        self.orders > 0 && self.invoices >= self.orders && self.emails >= self.orders
    }
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} orders, {} invoices, {} e-mails, {} doubled, {} lost",
            self.orders, self.invoices, self.emails, self.doubled, self.lost
        )
    }
}

/// Where a worker may be killed, and how often.
#[derive(Clone, Debug)]
pub struct Killer {
    /// The run's folder: one marker file per point already hit, and `kills.log`.
    pub dir: PathBuf,
    /// Probability that a point kills after its first time (the first always does).
    pub rate: f64,
}

impl Killer {
    /// Kill this process (SIGKILL, no cleanup) at `point`: always the first time any
    /// worker reaches it, afterwards with the configured probability.
    ///
    /// One point at a time per process, held through the kill: a worker handles several
    /// deliveries at once, and without it another task could mark a point as reached in
    /// the milliseconds this one spends killing the process, which then dies before that
    /// point kills or is logged (so the point would never count as killed at).
    pub fn point(&self, point: &str) {
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _turn = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let first = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.dir.join(format!("reached-{point}")))
            .is_ok();
        if !first && !crate::rng::Rng::new(random_seed()).chance(self.rate) {
            return;
        }
        use std::io::Write;
        if let Ok(mut log) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.join("kills.log"))
        {
            let _ = writeln!(log, "{point}");
            let _ = log.sync_all();
        }
        let _ = std::process::Command::new("kill")
            .args(["-9", &std::process::id().to_string()])
            .status();
        // SIGKILL does not return; this line is for the type checker.
        std::process::abort();
    }
}

/// An optional [`Killer`]: `None` in the demo.
pub fn checkpoint(killer: &Option<Killer>, point: &str) {
    if let Some(k) = killer {
        k.point(point);
    }
}

fn random_seed() -> u64 {
    uuid::Uuid::new_v4().as_u128() as u64
}
