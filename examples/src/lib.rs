//! Shared pieces of the example programs: the default store URL, the delivery simulation
//! behind the main demo, the `billing` and `metrics` programs' harness, table printing,
//! and how every program reports a failure.
//!
//! The programs themselves live in `src/bin/`; see the README.

#[cfg(feature = "sqlite")]
pub mod billing;
#[cfg(any(feature = "rabbitmq", feature = "redis", feature = "kafka"))]
pub mod orders;
#[cfg(all(
    feature = "postgres",
    feature = "mysql",
    feature = "rabbitmq",
    feature = "kafka",
    feature = "http",
    feature = "sqlite",
    feature = "redis"
))]
pub mod outbox_story;
pub mod sim;
pub mod sim_output;
pub mod store_url;
pub mod workload;

pub use dedup_lab::{exit, report, rng};
pub use store_url::url_or_temp_sqlite;

/// The workspace README's snippets, compiled (and run where they need no server) as doc
/// tests: `cargo test -p dedup-examples --doc --all-features`.
#[cfg(all(doctest, feature = "postgres", feature = "rabbitmq"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The snippets of the docs pages the README links to, compiled the same way.
#[cfg(all(doctest, feature = "postgres", feature = "rabbitmq"))]
#[doc = include_str!("../../docs/production.md")]
pub struct ProductionDoctests;

/// The operator's page's snippets (`docs/operating.md`).
#[cfg(all(doctest, feature = "postgres", feature = "rabbitmq"))]
#[doc = include_str!("../../docs/operating.md")]
pub struct OperatingDoctests;
