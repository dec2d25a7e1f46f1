#![doc = include_str!("../README.md")]

pub mod clauses;
mod harness;
mod macros;

pub use harness::{
    StoreFactory, TestContext, TransactionalFactory, TxEnd, server_url, should_run, strict,
};
