//! `/healthz` and `/readyz`: the probes Kubernetes (or a load balancer) asks, outside
//! the token guard.
//!
//! Probes carry no token, so the answer says only how each part is: names, flags and
//! times. The console's own store is always probed; the application adds its consumers
//! and relay with [`Console::with_probe`](crate::Console::with_probe).

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use dedup_core::health::HealthReport;

use crate::model::{Health, ProbeLine};
use crate::state::Inner;

fn millis(t: SystemTime) -> Option<i64> {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    i64::try_from(d.as_millis()).ok()
}

/// `report` as the JSON body, with 200 when `ok`, else 503.
fn answer(report: HealthReport, ok: bool) -> Response {
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Health {
        status: if ok { "ok" } else { "fail" },
        live: report.live,
        ready: report.ready,
        probes: report
            .probes
            .into_iter()
            .map(|p| ProbeLine {
                name: p.name,
                ready: p.ready,
                live: p.live,
                detail: p.detail,
                connected: p.connected,
                in_flight: p.in_flight,
                last_activity: p.last_activity.and_then(millis),
            })
            .collect(),
    };
    let mut response = (status, Json(body)).into_response();
    response.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    response
}

/// `GET /healthz`: liveness. 503 once a probe says a restart may help (a consumer's
/// handler stuck, a relay's rounds stalled). A store or broker away is not a reason.
pub(crate) async fn healthz(State(inner): State<Arc<Inner>>) -> Response {
    let report = inner.checks.report().await;
    let ok = report.live;
    answer(report, ok)
}

/// `GET /readyz`: readiness. 503 while a probe is not ready (the store unreachable, a
/// consumer disconnected, the relay's publishes failing).
pub(crate) async fn readyz(State(inner): State<Arc<Inner>>) -> Response {
    let report = inner.checks.report().await;
    let ok = report.ready;
    answer(report, ok)
}
