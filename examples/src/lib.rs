//! Shared pieces of the example programs: opening a store from a URL, the delivery
//! simulation behind the main demo, and table printing.
//!
//! The programs themselves live in `src/bin/`; see the README.

pub mod report;
pub mod rng;
pub mod sim;
pub mod store_url;

pub use store_url::{StoreUrl, open_store, open_store_with_clock, url_or_temp_sqlite};
