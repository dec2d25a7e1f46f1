//! [`open`]: a ready store from a URL; [`open_admin`]: the operator's view of the same store.

use std::sync::Arc;

use dedup_core::backend::url::UrlError;
use dedup_core::outbox::OutboxStore;
use dedup_core::{Admin, Clock, DedupStore};

use crate::error::OpenError;
use crate::url::StoreUrl;

/// Open the store `url` names, ready to use: connected, schema created or migrated, on
/// the backend's default clock (the server's for PostgreSQL, MySQL and Redis unless the URL says
/// `clock=local`). See the crate docs for the URL forms and parameters.
///
/// The URL is checked completely before anything is contacted or written: an unknown
/// scheme or parameter, a bad value or a backend this build lacks is an
/// [`OpenError::Url`]. Server backends connect within their connect timeout (default
/// 5 s, `connect_timeout=` in the URL) and fail with the cause.
pub async fn open(url: &str) -> Result<Arc<dyn DedupStore>, OpenError> {
    StoreUrl::parse(url)?.open().await
}

/// [`open`], as the operator's view of the store: an [`Admin`] handle (which is also a
/// [`DedupStore`]) for listing, counting, purging and releasing by hand. Every backend
/// implements [`Admin`], so this is the same store `open` returns, with more methods.
pub async fn open_admin(url: &str) -> Result<Arc<dyn Admin>, OpenError> {
    StoreUrl::parse(url)?.open_admin().await
}

/// The transactional outbox of the store `url` names, for relays and operators (`dedup
/// outbox`): the outbox table of a store whose backend has one (opened, and migrated
/// unless the URL says `migrate=false`, as [`open`] does), or a fresh
/// [`MemoryOutbox`](dedup_core::outbox::MemoryOutbox) for `memory:`. A store without an
/// outbox (see [`crate::backends`]) is an [`OpenError::Url`] with [`UrlError::NoOutbox`],
/// before anything is contacted.
pub async fn open_outbox(url: &str) -> Result<Arc<dyn OutboxStore>, OpenError> {
    StoreUrl::parse(url)?.open_outbox().await
}

/// [`open`] with an injected clock for lease arithmetic (simulations, tests).
pub async fn open_with_clock(
    url: &str,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn DedupStore>, OpenError> {
    StoreUrl::parse(url)?.with_clock(clock).open().await
}

impl StoreUrl {
    /// Open the store (see [`open`]).
    pub async fn open(self) -> Result<Arc<dyn DedupStore>, OpenError> {
        Ok(self.open_admin().await?)
    }

    /// Open the store as an [`Admin`] handle (see [`open_admin`]).
    pub async fn open_admin(self) -> Result<Arc<dyn Admin>, OpenError> {
        let url = self.to_string();
        self.into_target()
            .open_admin()
            .await
            .map_err(|source| OpenError::Store { url, source })
    }

    /// Open the store's outbox (see [`open_outbox`]).
    pub async fn open_outbox(self) -> Result<Arc<dyn OutboxStore>, OpenError> {
        let url = self.to_string();
        if !self.descriptor().has_outbox {
            let backend = self.backend();
            return Err(OpenError::Url {
                url,
                problem: UrlError::NoOutbox { backend },
            });
        }
        self.into_target()
            .open_outbox()
            .await
            .map_err(|source| OpenError::Store { url, source })
    }
}
