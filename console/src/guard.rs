//! Who may look and who may write: the token (a bearer header or the sign-in cookie), the
//! CSRF token every form carries, and the `Origin` a write must come from.

use axum::Extension;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::html::{esc, home};
use crate::state::{Inner, Unframed};

/// The cookie the sign-in form sets.
pub const COOKIE: &str = "dedup_console_token";

/// Why a request was refused.
#[derive(Debug)]
pub struct Refusal {
    /// 401 (sign in) or 403 (never allowed).
    pub status: StatusCode,
    /// The reason, for the operator.
    pub reason: String,
    base: String,
}

impl Refusal {
    /// Count and log the refusal (`dedup_console_refused_total{status}`).
    pub(crate) fn note(&self) {
        metrics::counter!("dedup_console_refused_total", "status" => self.status.as_str().to_owned())
            .increment(1);
        tracing::warn!(status = %self.status, reason = %self.reason, "dedup console refused a request");
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        self.note();
        let body = format!(
            "<p class=refused>{}</p><p><a href=\"{b}/signin\">Sign in</a> · <a href=\"{h}\">Overview</a></p>",
            esc(&self.reason),
            b = esc(&self.base),
            h = home(&self.base)
        );
        let page = Unframed {
            title: "Refused",
            body,
        };
        (self.status, Extension(page)).into_response()
    }
}

/// Compare two strings in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The token the request carries: `Authorization: Bearer`, or the sign-in cookie.
fn presented(headers: &HeaderMap) -> Option<String> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        && let Some(t) = v.strip_prefix("Bearer ")
    {
        return Some(t.trim().to_owned());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, v)| v.to_owned())
}

impl Inner {
    fn refuse(&self, status: StatusCode, reason: impl Into<String>) -> Refusal {
        Refusal {
            status,
            reason: reason.into(),
            base: self.config.base_path.clone(),
        }
    }

    /// Whether the request is authenticated: by the host, or with the right token.
    pub(crate) fn authenticated(&self, headers: &HeaderMap) -> bool {
        if self.config.host_auth {
            return true;
        }
        match (&self.config.token, presented(headers)) {
            (Some(t), Some(p)) => same(t, &p),
            _ => false,
        }
    }

    /// May the request view pages?
    pub(crate) fn check_view(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if self.config.views_need_token && !self.authenticated(headers) {
            return Err(self.refuse(
                StatusCode::UNAUTHORIZED,
                "this console needs its token to view: sign in",
            ));
        }
        Ok(())
    }

    /// Does the request come from this console's own pages? (`Origin` and
    /// `Sec-Fetch-Site`, when the browser sends them, must name this host.)
    pub(crate) fn check_origin(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == "cross-site")
        {
            return Err(self.refuse(
                StatusCode::FORBIDDEN,
                "refused: a request from a foreign origin (Sec-Fetch-Site: cross-site)",
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("null");
            let host = headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let bare = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .unwrap_or("");
            if host.is_empty() || !bare.eq_ignore_ascii_case(host) {
                return Err(self.refuse(
                    StatusCode::FORBIDDEN,
                    format!("refused: a request from a foreign origin ({origin})"),
                ));
            }
        }
        Ok(())
    }

    /// May the request write? Writes allowed, same origin, the form's CSRF token, and
    /// authenticated.
    pub(crate) fn check_write(&self, headers: &HeaderMap, csrf: &str) -> Result<(), Refusal> {
        if !self.config.allow_writes {
            return Err(self.refuse(
                StatusCode::FORBIDDEN,
                "this console is read-only (start it with writes allowed)",
            ));
        }
        self.check_origin(headers)?;
        if !same(csrf, &self.csrf) {
            return Err(self.refuse(
                StatusCode::FORBIDDEN,
                "refused: the form's CSRF token is missing or stale (reload the page)",
            ));
        }
        if !self.authenticated(headers) {
            return Err(self.refuse(
                StatusCode::UNAUTHORIZED,
                "a write needs the console's token: sign in",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bearer_and_cookie() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=b; dedup_console_token=xyz".parse().unwrap(),
        );
        assert_eq!(presented(&h).as_deref(), Some("xyz"));
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(presented(&h).as_deref(), Some("abc"));
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
    }
}
