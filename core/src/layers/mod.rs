//! Layers: wrappers that add behaviour to any store behind the same trait (as OpenDAL's
//! layers do). Stack them: `Observed::new(Retry::new(store, RetryPolicy::default()), opts)`
//! (outermost first: there each retried call is observed once, with its total time).
//!
//! - [`Retry`]: repeats operations that failed with a retryable error, following a
//!   [`RetryPolicy`] (the same rule the [`Inbox`](crate::Inbox) retries its commits with).
//! - [`Observed`]: a `tracing` span and `metrics` series per operation (names in
//!   [`metric_names`]), and in-process [`Counts`].

pub mod metric_names;
mod observe;
mod retry;

pub use observe::{Counts, ObserveOptions, Observed};
pub use retry::{Retry, RetryPolicy};
