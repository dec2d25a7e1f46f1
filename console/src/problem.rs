//! [`Problem`]: a failed request, as an HTML page or as `/api` JSON.

use std::sync::Arc;

use axum::Extension;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use dedup_core::outbox::OutboxStore;

use crate::guard::Refusal;
use crate::html::esc;
use crate::state::{Inner, Unframed};

/// A failed request: refused, bad input, or the store failing.
pub(crate) enum Problem {
    Refused(Refusal),
    BadInput(String),
    NotFound(String),
    Conflict(String),
    Unauthorized(String),
    Store(&'static str, dedup_core::Error),
    /// A broker failed mid-action (a replay): what failed and what was done before.
    Broker(String),
}

impl From<Refusal> for Problem {
    fn from(r: Refusal) -> Self {
        Problem::Refused(r)
    }
}

impl Problem {
    pub(crate) fn store(what: &'static str) -> impl FnOnce(dedup_core::Error) -> Problem {
        move |e| Problem::Store(what, e)
    }
}

impl Problem {
    /// The status and the reason, logged (a store failure) or counted (a refusal).
    fn parts(self) -> (StatusCode, String) {
        match self {
            Problem::Refused(r) => {
                r.note();
                (r.status, r.reason)
            }
            Problem::BadInput(t) => (StatusCode::BAD_REQUEST, t),
            Problem::NotFound(t) => (StatusCode::NOT_FOUND, t),
            Problem::Conflict(t) => (StatusCode::CONFLICT, t),
            Problem::Unauthorized(t) => (StatusCode::UNAUTHORIZED, t),
            Problem::Broker(t) => (StatusCode::SERVICE_UNAVAILABLE, t),
            Problem::Store(what, e) => {
                tracing::error!(error = %dedup_core::error_chain(&e), "dedup console: {what} failed");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{what} failed: {}", dedup_core::error_chain(&e)),
                )
            }
        }
    }

    /// The answer of an `/api` request: `{"status", "error"}` with the same status.
    pub(crate) fn into_json_response(self) -> Response {
        let (status, error) = self.parts();
        (
            status,
            Json(crate::model::ApiError {
                status: status.as_u16(),
                error,
            }),
        )
            .into_response()
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let (status, text) = match self {
            Problem::Refused(r) => return r.into_response(),
            other => other.parts(),
        };
        let page = Unframed {
            title: "Error",
            body: format!("<p class=refused>{}</p>", esc(&text)),
        };
        (status, Extension(page)).into_response()
    }
}

/// The console's outbox, or `NotFound` when it was started without one.
pub(crate) fn need_outbox(inner: &Inner) -> Result<&Arc<dyn OutboxStore>, Problem> {
    inner
        .outbox
        .as_ref()
        .ok_or_else(|| Problem::NotFound("this console was started without an outbox".into()))
}
