#![doc = include_str!("../README.md")]

mod actions;
mod config;
mod console;
mod gather;
mod guard;
mod html;
mod message;
pub mod model;
mod pages;
mod problem;
mod replay;
mod state;

pub use config::{ConfigError, ConsoleConfig, MAX_PAGE_SIZE, MAX_SCAN_LIMIT};
pub use console::Console;
pub use guard::COOKIE;
pub use message::{BODY_LIMIT, BROKER_TIMEOUT, HEADER_LIMIT, Redact};
