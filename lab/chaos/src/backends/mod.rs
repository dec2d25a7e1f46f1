//! What is truly per backend in the chaos harness, one module per backend, each exporting
//! a [`ChaosBackend`] chosen by the store URL's descriptor: the private store a run uses
//! (and how to crash it), and, for transactional mode, the handler that inserts the effect
//! row through the backend's `TxInbox` in the transaction that completes the key, with
//! the effects table in the same database. Lease mode needs none of this: the workers open
//! any registered URL with `dedup::open`.

#[cfg(feature = "mysql")]
mod mysql;
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use dedup::url::{BackendDescriptor, StoreTarget};
use dedup_core::{Handled, InboxConfig, InboxError};
use dedup_lab::servers::ReplicaPair;
use futures::future::BoxFuture;

use super::Replication;
use super::proxy::SwitchingProxy;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One backend's part in the chaos harness.
pub struct ChaosBackend {
    /// The backend, as the registry has it (its name is the `--backend` value).
    pub descriptor: &'static BackendDescriptor,
    /// Start the run's store of this backend, private to the run, with its state in the
    /// folder given; the second argument is the URL of the queue's server (a PostgreSQL
    /// the controller crash-restarts in every run), which a store may share. Blocking.
    pub start: fn(&Path, &str) -> Result<StoreServer, BoxError>,
    /// Transactional mode on this backend (`None`: lease mode only).
    pub transactional: Option<Transactional>,
    /// Failover runs on this backend (`None`: none): start a store on a primary with a
    /// standby replicated as given, behind a front that follows a promotion; its
    /// [`Restart`] kills the primary and promotes the standby. Blocking, in a Tokio
    /// runtime.
    pub failover: Option<StartFailover>,
}

/// [`ChaosBackend::failover`].
pub type StartFailover = fn(&Path, Replication) -> Result<StoreServer, BoxError>;

/// The store of one run.
pub struct StoreServer {
    /// Its URL (for `dedup::open`).
    pub url: String,
    /// How to crash and restart its server mid-run (`None`: nothing of its own to
    /// restart: a file, or the queue's server).
    pub restart: Option<Restart>,
}

/// A server the controller crashes and restarts once, at two thirds of the messages.
pub struct Restart {
    /// Its name in [`Figures::restarts`](super::Figures::restarts).
    pub name: &'static str,
    /// Crash it and start it again on its data; returns when it answers. Blocking. It
    /// owns the server, which stops when this is dropped.
    pub crash_restart: Arc<dyn Fn() -> Result<(), BoxError> + Send + Sync>,
}

/// [`ChaosBackend::transactional`]: the effects table and the handler of one backend.
pub struct Transactional {
    /// Create the effects table in the store's database (the store's own tables exist).
    pub prepare: for<'a> fn(&'a StoreTarget) -> BoxFuture<'a, Result<(), BoxError>>,
    /// Per message, how many effect rows the table holds.
    pub effects: Effects,
    /// Open the backend's `TxInbox` on the store with this configuration.
    pub open: OpenHandler,
}

/// [`Transactional::effects`]: per message, how many effect rows the table holds.
pub type Effects =
    for<'a> fn(&'a StoreTarget) -> BoxFuture<'a, Result<HashMap<u64, u64>, BoxError>>;

/// [`Transactional::open`]: the backend's handler on the store, with this configuration.
pub type OpenHandler = for<'a> fn(
    &'a StoreTarget,
    InboxConfig,
) -> BoxFuture<'a, dedup_core::Result<Box<dyn TxHandler>>>;

/// A backend's transactional handler.
#[async_trait]
pub trait TxHandler: Send + Sync {
    /// Handle message `id` as worker `worker`: claim, announce `claim_effect`, insert the
    /// effect row (message, worker, fence), announce `effect_commit`, commit; all in one
    /// transaction through the backend's `TxInbox`.
    async fn handle(&self, id: u64, worker: u32) -> Result<Handled, InboxError>;
}

/// The chaos modules of the compiled-in backends: one per backend module above.
pub fn all() -> Vec<&'static ChaosBackend> {
    let mut all: Vec<&'static ChaosBackend> = vec![&postgres::CHAOS];
    #[cfg(feature = "sqlite")]
    all.push(&sqlite::CHAOS);
    #[cfg(feature = "mysql")]
    all.push(&mysql::CHAOS);
    #[cfg(feature = "redis")]
    all.push(&redis::CHAOS);
    // In the registry's order.
    all.sort_by_key(|c| dedup::url::backends().position(|d| std::ptr::eq(d, c.descriptor)));
    all
}

/// The chaos module of the backend `descriptor` describes.
pub fn of(descriptor: &BackendDescriptor) -> Option<&'static ChaosBackend> {
    all()
        .into_iter()
        .find(|c| std::ptr::eq(c.descriptor, descriptor))
}

/// The chaos module of the registered backend named `name`.
pub fn named(name: &str) -> Result<&'static ChaosBackend, BoxError> {
    let descriptor = dedup::url::backends()
        .find(|d| d.name == name)
        .ok_or_else(|| {
            let known: Vec<_> = dedup::url::backends().map(|d| d.name).collect();
            format!(
                "no backend {name:?} in this build (it has {})",
                known.join(", ")
            )
        })?;
    of(descriptor).ok_or_else(|| {
        let known: Vec<_> = all().iter().map(|c| c.descriptor.name).collect();
        format!(
            "backend {name:?} has no chaos module (lab/chaos/src/backends/); these do: {}",
            known.join(", ")
        )
        .into()
    })
}

/// The statement creating the effects table (every SQL dialect here takes it).
pub(crate) fn effects_ddl() -> String {
    format!(
        "CREATE TABLE {} (msg bigint NOT NULL, worker bigint, fence bigint)",
        super::protocol::EFFECTS_TABLE
    )
}

/// A failover run's store: the primary of `pair` behind a [`SwitchingProxy`], reached at
/// the URL `url` makes of the front's address; the restart SIGKILLs the primary, promotes
/// the replica and points the front at it.
pub(crate) fn behind_switching_front(
    pair: ReplicaPair,
    url: impl FnOnce(std::net::SocketAddr) -> String,
) -> Result<StoreServer, BoxError> {
    let replica = socket_addr(&pair.standby_url)?;
    let proxy = SwitchingProxy::start(
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        socket_addr(pair.primary_url())?,
    )?;
    Ok(StoreServer {
        url: url(proxy.addr()),
        restart: Some(Restart {
            name: "failover",
            crash_restart: Arc::new(move || {
                pair.promote()?;
                proxy.switch(replica);
                Ok(())
            }),
        }),
    })
}

/// `host:port` of a `scheme://user[:password]@host:port/db` URL.
pub(crate) fn socket_addr(url: &str) -> Result<std::net::SocketAddr, BoxError> {
    let authority = url
        .rsplit_once('@')
        .and_then(|(_, rest)| rest.split('/').next())
        .ok_or_else(|| format!("no host:port in {}", dedup_core::backend::url::redact(url)))?;
    Ok(authority.parse()?)
}

/// `target` as the type of the backend it was chosen by.
pub(crate) fn target<T: dedup_core::backend::url::OpenTarget>(
    target: &StoreTarget,
) -> dedup_core::Result<&T> {
    target.downcast_ref::<T>().ok_or_else(|| {
        dedup_core::Error::invalid(
            "store URL",
            format!(
                "the chaos module for {} got a URL of {}",
                std::any::type_name::<T>(),
                target.descriptor().name
            ),
        )
    })
}
