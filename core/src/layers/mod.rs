//! Layers: wrappers that add behaviour to any store behind the same trait (as OpenDAL's
//! layers do). Stack them: `Observed::new(Retry::new(store, RetryPolicy::default()), opts)`
//! (outermost first: there each retried call is observed once, with its total time).
//!
//! - [`Retry`]: repeats operations that failed with a retryable error, following a
//!   [`RetryPolicy`] (the same rule the [`Inbox`](crate::Inbox) retries its commits with).
//! - [`Observed`]: a `tracing` span and `metrics` series per operation (names in
//!   [`metric_names`]), and in-process [`Counts`].
//!
//! Both are a [`Layered`] store: a [`StoreLayer`] around the store it wraps. Write a layer
//! of your own the same way. Override the operations it changes; the others go to the
//! wrapped store unchanged.

mod layer;
pub mod metric_names;
mod observe;
mod retry;

pub use layer::{Layered, StoreLayer};
pub use observe::{Counts, ObserveOptions, Observed, Observer};
pub use retry::{Retry, RetryPolicy};
