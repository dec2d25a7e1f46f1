#![doc = include_str!("../README.md")]

mod actions;
mod config;
mod console;
mod gather;
mod guard;
mod html;
pub mod model;
mod pages;
mod problem;
mod state;

pub use config::{ConfigError, ConsoleConfig, MAX_PAGE_SIZE, MAX_SCAN_LIMIT};
pub use console::Console;
pub use guard::COOKIE;
