//! The state every handler shares, and the page frame it fills.

use std::sync::Arc;

use axum::response::{Html, IntoResponse, Response};
use dedup_core::Admin;
use dedup_core::outbox::OutboxStore;

use crate::config::ConsoleConfig;
use crate::html::page;

/// The state every handler shares.
pub(crate) struct Inner {
    pub(crate) admin: Arc<dyn Admin>,
    pub(crate) outbox: Option<Arc<dyn OutboxStore>>,
    pub(crate) config: ConsoleConfig,
    /// The store's URL with any password removed.
    pub(crate) store: String,
    /// The CSRF token every form carries (random per console).
    pub(crate) csrf: String,
}

/// `body` in the console's page frame (its base path and store in the header).
pub(crate) fn html(inner: &Inner, title: &str, body: &str, refresh: bool) -> Response {
    Html(page(
        &inner.config.base_path,
        &inner.store,
        title,
        body,
        refresh,
    ))
    .into_response()
}
