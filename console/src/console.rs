//! [`Console`]: the router, its state, and the view handlers (HTML and `/api` JSON).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use dedup_brokers::backlog::Backlog;
use dedup_core::health::{HealthChecks, Probe};
use dedup_core::outbox::OutboxStore;
use dedup_core::{Admin, Key};
use serde::Deserialize;

use crate::config::{ConfigError, ConsoleConfig};
use crate::problem::{Problem, need_outbox};
use crate::state::{Inner, html};
use crate::{actions, charts, flow, gather, health, message, pages};

/// The operator's console over one store, and optionally its outbox.
///
/// [`Console::router`] gives the axum router. Serve it alone, or nest it in your own
/// service. Clones share the store and the configuration.
///
/// # Examples
///
/// ```
/// use axum::body::Body;
/// use dedup_console::{Console, ConsoleConfig};
/// use http::Request;
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let url = "sqlite::memory:";
/// let admin = dedup::open_admin(url).await?;
/// let console = Console::new(admin, url, ConsoleConfig::default())?;
///
/// let request = Request::get("/api/overview").body(Body::empty())?;
/// let response = console.router().oneshot(request).await?;
/// assert_eq!(response.status(), 200);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Console {
    inner: Arc<Inner>,
}

impl Console {
    /// A console over `admin`, as `config` says.
    ///
    /// `store_url` names the store in the console's header. Any password in it is removed
    /// before it is shown.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when `config` is unusable ([`ConsoleConfig::validate`]):
    /// - [`ConfigError::NoToken`]: writes or guarded views with neither a token nor
    ///   `host_auth`;
    /// - [`ConfigError::WeakToken`]: a token under 16 characters;
    /// - [`ConfigError::OutOfRange`]: a page size or scan limit out of range;
    /// - [`ConfigError::BasePath`]: a base path that is not empty and does not start with
    ///   `/`, or ends with one.
    pub fn new(
        admin: Arc<dyn Admin>,
        store_url: &str,
        config: ConsoleConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let checks = HealthChecks::new().with_store("store", admin.clone());
        Ok(Console {
            inner: Arc::new(Inner {
                checks,
                flow: Default::default(),
                admin,
                outbox: None,
                config,
                store: dedup_core::backend::url::redact(store_url),
                csrf: uuid::Uuid::new_v4().simple().to_string(),
                dead: Default::default(),
            }),
        })
    }

    /// The same console with `edit` applied to its state (shared by no clone yet: a
    /// clone keeps the state it had).
    fn edit(self, edit: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = Arc::unwrap_or_clone(self.inner);
        edit(&mut inner);
        Console {
            inner: Arc::new(inner),
        }
    }

    /// The same console reading `consumer`'s dead letters at `url`: the key and failure
    /// group pages show a dead-lettered key's message (headers and body), and offer its
    /// replay (with `allow_writes`).
    ///
    /// `url` is what `dedup_brokers::replay::open` opens (`redis://HOST?stream=orders`,
    /// `kafka://HOST?topic=orders.dead`, ...), each broker behind this crate's feature of
    /// the same name. It is opened per page and per replay, not at once: a broker down
    /// now makes those pages say so, not this call fail.
    pub fn with_dead_letters(self, consumer: impl Into<String>, url: impl Into<String>) -> Self {
        let (consumer, url) = (consumer.into(), url.into());
        self.edit(|inner| {
            inner.dead.urls.insert(consumer, url);
        })
    }

    /// The same console passing every dead-lettered copy it shows through `redact`
    /// first: it gets the headers and the whole payload, and masks what must not be seen
    /// (a header's value, a JSON field). A replay republishes the copy as it is, not
    /// redacted.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn example(console: dedup_console::Console) -> dedup_console::Console {
    /// console.with_redact(|headers, _body| {
    ///     for (name, value) in headers.iter_mut() {
    ///         if name.eq_ignore_ascii_case("authorization") {
    ///             *value = "***".into();
    ///         }
    ///     }
    /// })
    /// # }
    /// ```
    pub fn with_redact(
        self,
        redact: impl Fn(&mut Vec<(String, String)>, &mut Vec<u8>) + Send + Sync + 'static,
    ) -> Self {
        self.edit(|inner| inner.dead.redact = Some(Arc::new(redact)))
    }

    /// The same console answering `/healthz` and `/readyz` with `probe` too: a
    /// consumer's (`dedup_brokers::Health::probe`), the relay's
    /// (`Relay::health`), or one of the application's own.
    ///
    /// The console's store is always probed, as `store`.
    pub fn with_probe(self, probe: impl Probe + 'static) -> Self {
        self.edit(|inner| inner.checks = inner.checks.clone().with(probe))
    }

    /// The same console charting `backlog` on the overview: a broker's count of the
    /// messages waiting for a consumer, read at each flow sample (at most 5 s each).
    pub fn with_backlog(self, backlog: Arc<dyn Backlog>) -> Self {
        self.edit(|inner| inner.flow.backlogs.push(backlog))
    }

    /// The same console sampling the flow every `every` (default 60 s; zero: only when
    /// the overview is read). Each sample reads the counts the overview shows: cheap
    /// where the store keeps them, a read of every record where it does not.
    pub fn with_flow_every(self, every: Duration) -> Self {
        self.edit(|inner| inner.flow.every = every)
    }

    /// The health routes alone (`/healthz`, `/readyz`), to mount outside an auth layer
    /// the console's other routes sit behind: probes carry no credentials.
    /// [`router`](Self::router) has them too.
    pub fn health_router(&self) -> Router {
        Router::new()
            .route("/healthz", get(health::healthz))
            .route("/readyz", get(health::readyz))
            .with_state(self.inner.clone())
    }

    /// The same console showing `outbox` too.
    ///
    /// It adds the outbox's overview line, its dead rows, and their retry.
    pub fn with_outbox(self, outbox: Arc<dyn OutboxStore>) -> Self {
        self.edit(|inner| inner.outbox = Some(outbox))
    }

    /// The router: the HTML views, their JSON under `/api/...`, the confirmation pages
    /// and the actions.
    ///
    /// Mount it with `Router::nest` at [`ConsoleConfig::base_path`]. Put your
    /// authentication layer on it when [`ConsoleConfig::host_auth`] is set.
    pub fn router(&self) -> Router {
        flow::start(&self.inner);
        Router::new()
            .route("/", get(overview))
            .route("/healthz", get(health::healthz))
            .route("/readyz", get(health::readyz))
            .route("/api/flow", get(api_flow))
            .route("/failures", get(failures))
            .route("/failures/group", get(failure_group))
            .route("/key", get(key))
            .route("/stuck", get(stuck))
            .route("/outbox", get(outbox))
            .route("/signin", get(actions::signin_form).post(actions::signin))
            .route("/api/overview", get(api_overview))
            .route("/api/failures", get(api_failures))
            .route("/api/key", get(api_key))
            .route("/api/stuck", get(api_stuck))
            .route("/api/outbox/dead", get(api_outbox))
            .route("/confirm/{action}", get(actions::confirm))
            .route("/act/{action}", post(actions::act))
            .route("/api/session", get(actions::api_session))
            .route("/api/act/{action}", post(actions::api_act))
            .layer(axum::middleware::map_response_with_state(
                self.inner.clone(),
                crate::state::frame,
            ))
            .with_state(self.inner.clone())
    }
}

type Shared = State<Arc<Inner>>;

async fn overview_data(inner: &Inner) -> Result<crate::model::Overview, Problem> {
    let o = gather::overview(inner.admin.as_ref(), inner.outbox.as_ref(), &inner.store)
        .await
        .map_err(Problem::store("reading the overview"))?;
    inner.flow.record(&o);
    Ok(o)
}

async fn overview(State(inner): Shared, headers: HeaderMap) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    let o = overview_data(&inner).await?;
    let body = pages::overview(&inner, &o) + &charts::section(&inner.flow.figures());
    Ok(html(&inner, "Overview", &body, true))
}

async fn api_flow(State(inner): Shared, headers: HeaderMap) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    Ok(Json(inner.flow.figures()).into_response())
}

async fn api_overview(State(inner): Shared, headers: HeaderMap) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    Ok(Json(overview_data(&inner).await?).into_response())
}

async fn failures(State(inner): Shared, headers: HeaderMap) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    let (f, _) = gather::failures(inner.admin.as_ref(), &inner.config, 5)
        .await
        .map_err(Problem::store("reading the failures"))?;
    Ok(html(&inner, "Failures", &pages::failures(&inner, &f), true))
}

async fn api_failures(State(inner): Shared, headers: HeaderMap) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    let (f, _) = gather::failures(inner.admin.as_ref(), &inner.config, inner.config.page_size)
        .await
        .map_err(Problem::store("reading the failures"))?;
    Ok(Json(f).into_response())
}

/// `?id=GROUP&page=N`.
#[derive(Deserialize)]
pub(crate) struct GroupQuery {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) page: usize,
}

async fn failure_group(
    State(inner): Shared,
    headers: HeaderMap,
    Query(q): Query<GroupQuery>,
) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    let (f, members) = gather::failures(inner.admin.as_ref(), &inner.config, 0)
        .await
        .map_err(Problem::store("reading the failures"))?;
    let Some(g) = f.groups.iter().find(|g| g.id == q.id) else {
        return Err(Problem::NotFound(format!(
            "no failure group {} (it may have been forgotten)",
            q.id
        )));
    };
    let keys = members
        .into_iter()
        .find(|(id, _)| *id == q.id)
        .map(|(_, m)| m)
        .unwrap_or_default();
    let now = inner
        .admin
        .now()
        .await
        .map_err(Problem::store("reading the clock"))?;
    let mut body = pages::failure_group(&inner, g, &keys, q.page, now);
    let shown = keys.iter().skip(q.page * inner.config.page_size);
    let shown: Vec<_> = shown.take(inner.config.page_size).collect();
    body.push_str(&message::group_section(&inner, &shown, now).await);
    Ok(html(&inner, "Failure group", &body, false))
}

/// `?consumer=C&id=M`.
#[derive(Deserialize)]
pub(crate) struct KeyQuery {
    pub(crate) consumer: String,
    pub(crate) id: String,
}

impl KeyQuery {
    pub(crate) fn key(&self) -> Result<Key, Problem> {
        Key::new(self.consumer.clone(), self.id.clone())
            .map_err(|e| Problem::BadInput(format!("not a key: {}", dedup_core::error_chain(&e))))
    }
}

async fn key_data(inner: &Inner, q: &KeyQuery) -> Result<crate::model::KeyView, Problem> {
    let key = q.key()?;
    let d = gather::key_detail(inner.admin.as_ref(), &key)
        .await
        .map_err(Problem::store("reading the key"))?
        .ok_or_else(|| Problem::NotFound(format!("no record for {key}")))?;
    let message = message::of_key(inner, &d).await;
    Ok(crate::model::KeyView { key: d, message })
}

async fn key(
    State(inner): Shared,
    headers: HeaderMap,
    Query(q): Query<KeyQuery>,
) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    let v = key_data(&inner, &q).await?;
    let body = pages::key(&inner, &v.key) + &message::key_section(&v.message);
    Ok(html(&inner, "Key", &body, false))
}

async fn api_key(
    State(inner): Shared,
    headers: HeaderMap,
    Query(q): Query<KeyQuery>,
) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    Ok(Json(key_data(&inner, &q).await?).into_response())
}

/// `?older_than=5m`.
#[derive(Deserialize)]
pub(crate) struct StuckQuery {
    older_than: Option<String>,
}

impl StuckQuery {
    fn threshold(&self, inner: &Inner) -> Result<Duration, Problem> {
        match &self.older_than {
            None => Ok(inner.config.stuck_after),
            Some(t) => dedup_core::parse_duration(t).map_err(|e| {
                Problem::BadInput(format!("older_than: {}", dedup_core::error_chain(&e)))
            }),
        }
    }
}

async fn stuck_data(inner: &Inner, q: &StuckQuery) -> Result<crate::model::Stuck, Problem> {
    let t = q.threshold(inner)?;
    gather::stuck(
        inner.admin.as_ref(),
        &inner.config,
        t,
        inner.config.page_size,
    )
    .await
    .map_err(Problem::store("reading the leases"))
}

async fn stuck(
    State(inner): Shared,
    headers: HeaderMap,
    Query(q): Query<StuckQuery>,
) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    let s = stuck_data(&inner, &q).await?;
    Ok(html(
        &inner,
        "Stuck leases",
        &pages::stuck(&inner, &s),
        true,
    ))
}

async fn api_stuck(
    State(inner): Shared,
    headers: HeaderMap,
    Query(q): Query<StuckQuery>,
) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    Ok(Json(stuck_data(&inner, &q).await?).into_response())
}

async fn outbox_data(inner: &Inner) -> Result<crate::model::DeadRows, Problem> {
    let o = need_outbox(inner)?;
    gather::dead_groups(o.as_ref(), &inner.config, inner.config.page_size)
        .await
        .map_err(Problem::store("reading the outbox"))
}

async fn outbox(State(inner): Shared, headers: HeaderMap) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    let d = outbox_data(&inner).await?;
    Ok(html(
        &inner,
        "Outbox dead rows",
        &pages::outbox(&inner, &d),
        true,
    ))
}

async fn api_outbox(State(inner): Shared, headers: HeaderMap) -> Result<Response, Problem> {
    inner.check_view(&headers)?;
    Ok(Json(outbox_data(&inner).await?).into_response())
}
