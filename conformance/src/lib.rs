#![doc = include_str!("../README.md")]

pub mod clauses;
pub mod counting;
pub mod foreign;
mod harness;
pub mod linearizability;
mod macros;
mod memory_factory;
pub mod model;
pub mod outbox;
pub mod pool;
pub mod proxy;
pub mod purgers;
pub mod restart;
mod support;

pub use harness::{
    StoreFactory, TestContext, TransactionalFactory, TxEnd, TxInboxFactory, TxJob, TxWork,
    server_url, should_run, strict,
};
pub use memory_factory::{MemoryFactory, Namespaces};
