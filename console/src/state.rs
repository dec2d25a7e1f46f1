//! The state every handler shares, and the page frame it fills.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};
use dedup_core::Admin;
use dedup_core::outbox::OutboxStore;

use crate::config::ConsoleConfig;
use crate::html::page;

/// The state every handler shares.
#[derive(Clone)]
pub(crate) struct Inner {
    pub(crate) admin: Arc<dyn Admin>,
    pub(crate) outbox: Option<Arc<dyn OutboxStore>>,
    pub(crate) config: ConsoleConfig,
    /// The store's URL with any password removed.
    pub(crate) store: String,
    /// The CSRF token every form carries (random per console).
    pub(crate) csrf: String,
    /// Where each consumer's dead letters are, and the redaction hook (the message view,
    /// replay).
    pub(crate) dead: crate::message::DeadLetterConfig,
    /// The flow's samples, how often it samples, and the brokers' backlogs it reads.
    pub(crate) flow: crate::flow::Flow,
    /// What `/healthz` and `/readyz` ask: the store, and the probes the application added.
    pub(crate) checks: dedup_core::health::HealthChecks,
}

/// `body` in the console's page frame (its base path and store in the header).
pub(crate) fn html(inner: &Inner, title: &str, body: &str, refresh: bool) -> Response {
    Html(page(
        &inner.config.base_path,
        &inner.store,
        inner.outbox.is_some(),
        title,
        body,
        refresh,
    ))
    .into_response()
}

/// An error page's title and body (escaped HTML), left in a response's extensions by a
/// refusal or a problem, which know nothing of the console: [`frame`] puts them in the
/// page frame on the way out. The store is not named on these pages (a refused visitor
/// may not see it).
#[derive(Clone)]
pub(crate) struct Unframed {
    pub(crate) title: &'static str,
    pub(crate) body: String,
}

/// The router's last step: an [`Unframed`] error page gets the console's frame (its base
/// path, so the links work where the router is nested).
pub(crate) async fn frame(State(inner): State<Arc<Inner>>, mut response: Response) -> Response {
    let Some(u) = response.extensions_mut().remove::<Unframed>() else {
        return response;
    };
    let html = page(
        &inner.config.base_path,
        "",
        inner.outbox.is_some(),
        u.title,
        &u.body,
        false,
    );
    (response.status(), Html(html)).into_response()
}
