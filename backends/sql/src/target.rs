//! [`SqlTarget`]: what a sqlx backend's store URL opens (the driver's URL and the store's
//! configuration), written once over the backend's store ([`UrlStore`], [`SqlStore`]). Each backend
//! parses its own URL parameters into its configuration; opening is the same for all.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use dedup_core::backend::url::{
    BackendDescriptor, OpenTarget, Params, StoreTarget, UrlError, UrlParts, invalid, malformed,
    redact, tls_available, with_query,
};
use dedup_core::outbox::OutboxStore;
use dedup_core::{Admin, Clock, Result};

pub use crate::config::TargetConfig;
use crate::store::{SqlStore, connect_with};

/// What a sqlx backend's store offers its URL target beyond [`SqlStore`] (which
/// connects it): its names, and its outbox.
pub trait UrlStore: SqlStore + Admin {
    /// The target type's name in `Debug` output (`PostgresTarget`).
    const TARGET: &'static str;

    /// The backend's descriptor (its `DESCRIPTOR`).
    const DESCRIPTOR: &'static BackendDescriptor;

    /// The store's outbox.
    fn outbox_store(&self) -> Arc<dyn OutboxStore>;
}

/// What a sqlx backend's URL opens: the connection URL handed to the driver and the
/// store's configuration.
pub struct SqlTarget<S: UrlStore> {
    /// The connection URL handed to the driver (dedup's own parameters removed; it may
    /// hold a password: do not print it, [`redact`] it).
    pub url: String,
    /// The store's configuration.
    pub config: S::Config,
}

impl<S: UrlStore> Clone for SqlTarget<S> {
    fn clone(&self) -> Self {
        SqlTarget {
            url: self.url.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: UrlStore> fmt::Debug for SqlTarget<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(S::TARGET)
            .field("url", &redact(&self.url))
            .field("config", &self.config)
            .finish()
    }
}

#[async_trait]
impl<S: UrlStore> OpenTarget for SqlTarget<S> {
    fn descriptor(&self) -> &'static BackendDescriptor {
        S::DESCRIPTOR
    }

    fn location(&self) -> String {
        self.config.location()
    }

    fn set_clock(&mut self, clock: Arc<dyn Clock>) {
        self.config.clock = Some(clock);
    }

    fn clone_target(&self) -> Box<dyn OpenTarget> {
        Box::new(self.clone())
    }

    async fn open_admin(self: Box<Self>) -> Result<Arc<dyn Admin>> {
        Ok(Arc::new(connect_with::<S>(&self.url, self.config).await?))
    }

    async fn open_outbox(self: Box<Self>) -> Result<Arc<dyn OutboxStore>> {
        Ok(connect_with::<S>(&self.url, self.config)
            .await?
            .outbox_store())
    }
}

/// `url` parsed by `descriptor` as a `T` (its target type): for tests and tools that
/// adjust a target before opening it. A URL of another backend is [`UrlError::Malformed`].
pub fn parse_target<T: OpenTarget>(
    descriptor: &BackendDescriptor,
    url: &str,
) -> std::result::Result<T, UrlError> {
    let parts = UrlParts::split(url).ok_or_else(|| malformed("not a URL (no scheme)"))?;
    (descriptor.parse)(&parts)?
        .downcast::<T>()
        .map_err(|_| malformed(format!("not a {} URL", descriptor.name)))
}

/// A server's TLS mode URL parameter: its names, and which of its values connect with
/// TLS and which without.
#[derive(Debug)]
pub struct TlsModeParam {
    /// The parameter's names (the first is the driver's); the last one given wins.
    pub names: &'static [&'static str],
    /// The values connecting without TLS.
    pub plain: &'static [&'static str],
    /// The values connecting with TLS.
    pub tls: &'static [&'static str],
    /// Whether values are compared ignoring ASCII case.
    pub ignore_case: bool,
}

impl TlsModeParam {
    /// Take the mode from `params`: refused unless one of the known values, and when it
    /// asks for TLS, unless the backend was built with it (`tls_built`). The mode as given,
    /// as `name=value` under the driver's name.
    pub fn take(
        &self,
        params: &mut Params,
        tls_built: bool,
    ) -> std::result::Result<Option<String>, UrlError> {
        let is = |mode: &str, list: &[&str]| {
            list.iter().any(|known| {
                known == &mode || (self.ignore_case && known.eq_ignore_ascii_case(mode))
            })
        };
        let mut found = None;
        for name in self.names {
            if let Some(mode) = params.take(name) {
                let tls = if is(&mode, self.tls) {
                    true
                } else if is(&mode, self.plain) {
                    false
                } else {
                    let known = [self.plain, self.tls].concat().join(", ");
                    return Err(invalid(name, &mode, &format!("expected one of {known}")));
                };
                tls_available(tls, tls_built)?;
                found = Some(format!("{}={mode}", self.names[0]));
            }
        }
        Ok(found)
    }
}

/// The [`SqlTarget`] of a parsed URL: `config` checked, the parameters not taken (and
/// `tls_mode`, `name=value`) handed to the driver on `base`.
pub fn finish<S: UrlStore>(
    base: String,
    params: Params,
    config: S::Config,
    tls_mode: Option<String>,
) -> std::result::Result<StoreTarget, UrlError> {
    config.check().map_err(UrlError::Config)?;
    let mut driver = params.rest();
    if let Some(pair) = tls_mode {
        driver = Some(match driver {
            Some(q) => format!("{q}&{pair}"),
            None => pair,
        });
    }
    Ok(StoreTarget::new(SqlTarget::<S> {
        url: with_query(base, driver),
        config,
    }))
}
