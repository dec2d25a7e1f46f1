#![doc = include_str!("../README.md")]

mod actions;
mod charts;
mod config;
mod console;
mod flow;
mod gather;
mod guard;
mod health;
mod html;
mod message;
pub mod model;
mod pages;
mod problem;
mod replay;
mod state;
mod svg;

pub use config::{ConfigError, ConsoleConfig, MAX_PAGE_SIZE, MAX_SCAN_LIMIT};
pub use console::Console;
pub use guard::COOKIE;
pub use message::{BODY_LIMIT, BROKER_TIMEOUT, HEADER_LIMIT, Redact};
