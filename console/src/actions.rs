//! The actions: a confirmation page (`GET /confirm/{action}`) that says what will change,
//! then the form it posts (`POST /act/{action}`), guarded, fenced where a fence exists,
//! logged with `tracing` and counted in `dedup_console_actions_total`.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Form, Json};
use dedup_core::{Forgot, Key, PurgeOptions, Record, Released};
use serde::Deserialize;
use std::fmt::Write;

use crate::gather;
use crate::guard::COOKIE;
use crate::html::{esc, home, qs};
use crate::model::{ActionDone, Session};
use crate::problem::{Problem, need_outbox};
use crate::state::{Inner, html};

/// The parameters of every action (each uses some).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Params {
    #[serde(default)]
    csrf: String,
    consumer: Option<String>,
    /// A message id (forget, release), a failure group (forget-group) or an outbox row id
    /// (outbox-retry).
    id: Option<String>,
    fence: Option<u64>,
    group: Option<String>,
    all: Option<String>,
}

impl Params {
    fn key(&self) -> Result<Key, Problem> {
        let (Some(c), Some(m)) = (&self.consumer, &self.id) else {
            return Err(Problem::BadInput("consumer and id are required".into()));
        };
        Key::new(c.clone(), m.clone())
            .map_err(|e| Problem::BadInput(format!("not a key: {}", dedup_core::error_chain(&e))))
    }

    /// The failure group an action names (`id`).
    fn group_id(&self) -> Result<String, Problem> {
        self.id
            .clone()
            .ok_or_else(|| Problem::BadInput("the group's id is required".into()))
    }

    fn fence(&self) -> Result<u64, Problem> {
        self.fence
            .ok_or_else(|| Problem::BadInput("the fence seen is required".into()))
    }

    /// The parameters as hidden form fields.
    fn hidden(&self) -> String {
        let mut out = String::new();
        let mut field = |name: &str, v: &str| {
            let _ = write!(out, "<input type=hidden name={name} value=\"{}\">", esc(v));
        };
        for (name, v) in [
            ("consumer", &self.consumer),
            ("id", &self.id),
            ("group", &self.group),
            ("all", &self.all),
        ] {
            if let Some(v) = v {
                field(name, v);
            }
        }
        if let Some(f) = self.fence {
            field("fence", &f.to_string());
        }
        out
    }
}

/// Counts an action in `dedup_console_actions_total{action, result}`.
pub(crate) fn count(action: &'static str, result: &'static str, n: u64) {
    metrics::counter!("dedup_console_actions_total", "action" => action, "result" => result)
        .increment(n.max(1));
}

/// What an action would change, in words, before it runs.
async fn preview(inner: &Inner, action: &str, p: &Params) -> Result<String, Problem> {
    Ok(match action {
        "forget" => {
            let k = p.key()?;
            format!(
                "Forget <strong>{}</strong> of <em>{}</em> (fence {}): its record is removed and \
                 the next delivery of the message runs again, from fence 1.",
                esc(k.message_id()),
                esc(k.consumer()),
                p.fence()?
            )
        }
        "release" => {
            let k = p.key()?;
            format!(
                "Release the lease on <strong>{}</strong> of <em>{}</em> (fence {}): the worker \
                 that holds it gets <code>LeaseLost</code> on commit, and the next delivery \
                 takes the key over.",
                esc(k.message_id()),
                esc(k.consumer()),
                p.fence()?
            )
        }
        "forget-group" => {
            let id = p.id.clone().unwrap_or_default();
            let (f, _) = gather::failures(inner.admin.as_ref(), &inner.config, 10)
                .await
                .map_err(Problem::store("reading the failures"))?;
            let g = f
                .groups
                .iter()
                .find(|g| g.id == id)
                .ok_or_else(|| Problem::NotFound(format!("no failure group {id}")))?;
            let keys: Vec<String> = g.keys.iter().map(|k| esc(&k.message_id)).collect();
            format!(
                "Forget the <strong>{}</strong> keys of the group <em>{}: {}</em> ({}{}): each \
                 runs again on its next delivery.",
                g.count,
                esc(&g.kind),
                esc(&g.first_line),
                keys.join(", "),
                if g.count > keys.len() { ", ..." } else { "" }
            )
        }
        "replay" => crate::replay::preview_key(inner, &p.key()?, p.fence()?),
        "replay-group" => crate::replay::preview_group(inner, &p.group_id()?).await?,
        "outbox-retry" => {
            need_outbox(inner)?;
            match (&p.id, &p.group, &p.all) {
                (Some(id), _, _) => format!(
                    "Retry the dead outbox row {}: it is published again.",
                    esc(id)
                ),
                (_, Some(g), _) => format!("Retry every dead outbox row of group {}.", esc(g)),
                (_, _, Some(_)) => "Retry every dead outbox row.".to_owned(),
                _ => return Err(Problem::BadInput("id, group or all is required".into())),
            }
        }
        "purge" => format!(
            "Purge now: remove completed records processed more than {} ago and in-flight \
             records whose lease expired that long ago.",
            crate::html::age(inner.config.purge_retention)
        ),
        other => return Err(Problem::NotFound(format!("no action {other}"))),
    })
}

pub(crate) async fn confirm(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(action): Path<String>,
    Query(p): Query<Params>,
) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    if !inner.config.allow_writes {
        return Err(Problem::BadInput("this console is read-only".into()));
    }
    let what = preview(&inner, &action, &p).await?;
    let body = format!(
        "<p>{what}</p><form method=post action=\"{}/act/{}\">\
         <input type=hidden name=csrf value=\"{}\">{}<button id=confirm type=submit>Confirm</button> \
         <a href=\"{}\">Cancel</a></form>",
        esc(&inner.config.base_path),
        esc(&qs(&action)),
        esc(&inner.csrf),
        p.hidden(),
        home(&inner.config.base_path),
    );
    Ok(html(&inner, "Confirm", &body, false))
}

pub(crate) async fn act(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(action): Path<String>,
    Form(p): Form<Params>,
) -> Result<Response, Problem> {
    inner.check_write(&headers, &p.csrf)?;
    let (_, done) = run(&inner, &action, &p).await?;
    let body = format!(
        "<p class=done id=result>{}</p><p><a href=\"{}\">Overview</a></p>",
        esc(&done),
        home(&inner.config.base_path)
    );
    Ok(html(&inner, "Done", &body, false))
}

/// `POST /api/act/{action}`: the same action, its parameters a JSON object (with `csrf`),
/// guarded the same way; the answer is JSON ([`ActionDone`]), and so is a refusal or an
/// error (`{"status", "error"}`).
pub(crate) async fn api_act(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(action): Path<String>,
    body: Result<Json<Params>, JsonRejection>,
) -> Response {
    let result = async {
        let Json(p) = body.map_err(|e| Problem::BadInput(format!("the request body: {e}")))?;
        inner.check_write(&headers, &p.csrf)?;
        let (changed, message) = run(&inner, &action, &p).await?;
        Ok::<_, Problem>(ActionDone {
            action: action.clone(),
            changed,
            message,
        })
    }
    .await;
    match result {
        Ok(done) => Json(done).into_response(),
        Err(problem) => problem.into_json_response(),
    }
}

/// `GET /api/session`: what a script needs before an action: the CSRF token every write
/// carries, whether writes are allowed, and whether this request is authenticated.
pub(crate) async fn api_session(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    Ok(Json(Session {
        csrf: inner.csrf.clone(),
        writes_allowed: inner.config.allow_writes,
        authenticated: inner.authenticated(&headers),
    })
    .into_response())
}

/// Refuse an action whose key moved on since the operator looked.
pub(crate) fn changed(action: &'static str, key: &Key, seen: u64, now: u64) -> Problem {
    count(action, "changed", 1);
    Problem::Conflict(format!(
        "{key} changed since you looked (fence {seen}, now {now}): nothing done, look again"
    ))
}

/// An action's answer: how many records or rows it changed, and what it did, in words.
fn done(changed: u64, message: String) -> (u64, String) {
    (changed, message)
}

/// Run `action` (its input already guarded): how many records or rows it changed, and what
/// it did in words (plain text: the HTML answer escapes it).
async fn run(inner: &Inner, action: &str, p: &Params) -> Result<(u64, String), Problem> {
    let admin = inner.admin.as_ref();
    match action {
        "forget" | "release" => {
            let key = p.key()?;
            let seen = p.fence()?;
            let record = admin
                .get(&key)
                .await
                .map_err(Problem::store("reading the key"))?
                .ok_or_else(|| Problem::NotFound(format!("no record for {key}")))?;
            if record.fence != seen {
                return Err(changed(
                    if action == "forget" {
                        "forget"
                    } else {
                        "release"
                    },
                    &key,
                    seen,
                    record.fence,
                ));
            }
            if action == "forget" {
                let r = admin
                    .forget(&key, false)
                    .await
                    .map_err(Problem::store("forgetting the key"))?;
                tracing::info!(key = %key, result = ?r, "dedup console: forget");
                Ok(match r {
                    Forgot::Forgot { status, .. } => {
                        count("forget", "done", 1);
                        done(1, format!("Forgot {} (it was {}).", key, status.as_str()))
                    }
                    Forgot::LiveLease { .. } => {
                        count("forget", "refused", 1);
                        done(
                            0,
                            format!(
                                "Not forgotten: {} holds a live lease (release it first).",
                                key
                            ),
                        )
                    }
                    Forgot::NotFound => {
                        count("forget", "not-found", 1);
                        done(0, format!("{} has no record any more.", key))
                    }
                })
            } else {
                let r = admin
                    .release_key(&key, true)
                    .await
                    .map_err(Problem::store("releasing the lease"))?;
                tracing::info!(key = %key, result = ?r, "dedup console: release");
                Ok(match r {
                    Released::Released {
                        fence,
                        attempt,
                        was_live,
                    } => {
                        count("release", "done", 1);
                        done(
                            1,
                            format!(
                                "Released the lease on {} (fence {fence}, attempt {attempt}, {}).",
                                key,
                                if was_live { "was live" } else { "had expired" }
                            ),
                        )
                    }
                    other => {
                        count("release", "refused", 1);
                        done(0, format!("Nothing released on {}: {other:?}.", key))
                    }
                })
            }
        }
        "replay" => crate::replay::run_key(inner, &p.key()?, p.fence()?).await,
        "replay-group" => crate::replay::run_group(inner, &p.group_id()?).await,
        "forget-group" => {
            let id = p.id.clone().unwrap_or_default();
            let mut forgot = 0u64;
            for r in &group_records(inner, &id).await? {
                if let Forgot::Forgot { .. } = admin
                    .forget(&r.key, false)
                    .await
                    .map_err(Problem::store("forgetting a key"))?
                {
                    forgot += 1;
                }
            }
            tracing::info!(group = %id, forgot, "dedup console: forget group");
            count("forget-group", "done", forgot);
            Ok(done(forgot, format!("Forgot {forgot} keys of group {id}.")))
        }
        "outbox-retry" => {
            let outbox = need_outbox(inner)?;
            let ids: Vec<i64> = if let Some(id) = &p.id {
                vec![
                    id.parse()
                        .map_err(|_| Problem::BadInput(format!("not a row id: {id}")))?,
                ]
            } else {
                let (rows, _) = gather::dead_rows(outbox.as_ref(), inner.config.scan_limit)
                    .await
                    .map_err(Problem::store("reading the outbox"))?;
                rows.iter()
                    .filter(|e| {
                        p.all.is_some()
                            || p.group.as_deref() == Some(gather::dead_group_of(e).0.as_str())
                    })
                    .map(|e| e.row.id)
                    .collect()
            };
            let mut retried = Vec::new();
            for id in ids {
                if outbox
                    .retry(id)
                    .await
                    .map_err(Problem::store("retrying a row"))?
                {
                    retried.push(id);
                }
            }
            tracing::info!(rows = ?retried, "dedup console: outbox retry");
            count("outbox-retry", "done", retried.len() as u64);
            Ok(done(
                retried.len() as u64,
                format!(
                    "Returned {} dead outbox rows to pending: {}.",
                    retried.len(),
                    retried
                        .iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ))
        }
        "purge" => {
            // The store keeps the run as its last (the overview shows it).
            let report = admin
                .purge(&PurgeOptions::older_than(inner.config.purge_retention))
                .await
                .map_err(Problem::store("purging"))?;
            tracing::info!(
                completed = report.completed,
                expired = report.expired,
                "dedup console: purge"
            );
            count("purge", "done", 1);
            Ok(done(
                report.completed + report.expired,
                format!(
                    "Purged {} completed and {} expired records.",
                    report.completed, report.expired
                ),
            ))
        }
        other => Err(Problem::NotFound(format!("no action {other}"))),
    }
}

/// The records of failure group `id`, read now: a key that failed again differently since
/// has left the group.
pub(crate) async fn group_records(inner: &Inner, id: &str) -> Result<Vec<Record>, Problem> {
    let (_, members) = gather::failures(inner.admin.as_ref(), &inner.config, 0)
        .await
        .map_err(Problem::store("reading the failures"))?;
    let records = members
        .into_iter()
        .find(|(g, _)| g == id)
        .map(|(_, m)| m)
        .ok_or_else(|| Problem::NotFound(format!("no failure group {id}")))?;
    Ok(records
        .into_iter()
        .filter(|r| gather::failure_group_of(r).is_some_and(|g| g.0 == id))
        .collect())
}

/// `GET /signin`.
pub(crate) async fn signin_form(State(inner): State<Arc<Inner>>) -> Response {
    let body = format!(
        "<form method=post action=\"{}/signin\"><input type=hidden name=csrf value=\"{}\">\
         <label>Token <input type=password name=token id=token autocomplete=off></label> \
         <button id=signin type=submit>Sign in</button></form>",
        esc(&inner.config.base_path),
        esc(&inner.csrf)
    );
    html(&inner, "Sign in", &body, false)
}

/// The sign-in form's fields.
#[derive(Deserialize)]
pub(crate) struct SignIn {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    token: String,
}

/// `POST /signin`: keep the token in a cookie when it is right.
pub(crate) async fn signin(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Form(f): Form<SignIn>,
) -> Result<Response, Problem> {
    inner.check_origin(&headers)?;
    let mut probe = HeaderMap::new();
    probe.insert(
        header::AUTHORIZATION,
        format!("Bearer {}", f.token)
            .parse()
            .map_err(|_| Problem::BadInput("the token holds characters a header cannot".into()))?,
    );
    if f.csrf != inner.csrf || inner.config.token.is_none() || !inner.authenticated(&probe) {
        count("signin", "refused", 1);
        return Err(Problem::Unauthorized("wrong token".into()));
    }
    count("signin", "done", 1);
    let path = if inner.config.base_path.is_empty() {
        "/"
    } else {
        &inner.config.base_path
    };
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; SameSite=Strict; Path={path}",
        f.token
    );
    let mut resp = html(
        &inner,
        "Signed in",
        "<p class=done id=result>Signed in.</p>",
        false,
    );
    resp.headers_mut().insert(
        header::SET_COOKIE,
        cookie
            .parse()
            .map_err(|_| Problem::BadInput("bad token".into()))?,
    );
    *resp.status_mut() = StatusCode::OK;
    Ok(resp.into_response())
}
