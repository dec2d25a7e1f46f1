//! [`open`]: a ready store from a URL; [`open_admin`]: the operator's view of the same store.

use std::sync::Arc;

use dedup_core::backend::url::UrlError;
use dedup_core::outbox::OutboxStore;
use dedup_core::{Admin, Clock, DedupStore};

use crate::error::OpenError;
use crate::url::StoreUrl;

/// Opens the store `url` names, ready to use.
///
/// The store is connected, and its schema created or migrated. Its clock is the
/// backend's default: the server's for PostgreSQL, MySQL and Redis, unless the URL says
/// `clock=local`. See the [crate docs](crate) for the URL forms and parameters.
///
/// # Errors
///
/// - [`OpenError::Url`]: an unknown scheme or parameter, a bad value, or a backend this
///   build lacks. The URL is checked completely before anything is contacted or written.
/// - [`OpenError::Store`]: the backend could not open the store. Its `source` is the
///   store's [`Error`](dedup_core::Error), with the driver's cause. Server backends give
///   up after their connect timeout (5 s by default, `connect_timeout=` in the URL).
///
/// # Examples
///
/// ```
/// use dedup::store::ClaimOptions;
/// use dedup::{DedupStore, Key};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let dir = tempfile::tempdir()?;
/// let url = format!("sqlite:{}?table=billing_inbox", dir.path().join("inbox.db").display());
/// let store = dedup::open(&url).await?;
///
/// let key = Key::new("billing", "order-42")?;
/// assert!(store.claim(&key, &ClaimOptions::default()).await?.is_acquired());
///
/// // A mistyped parameter is refused before anything is opened.
/// match dedup::open("sqlite:inbox.db?tabel=x").await {
///     Err(typo) => assert!(typo.url_problem().is_some()),
///     Ok(_) => unreachable!("the typo is refused"),
/// }
/// # Ok(())
/// # }
/// ```
pub async fn open(url: &str) -> Result<Arc<dyn DedupStore>, OpenError> {
    StoreUrl::parse(url)?.open().await
}

/// [`open`], as the operator's view of the store.
///
/// The [`Admin`] handle lists, counts, purges and releases by hand. It is also a
/// [`DedupStore`]. Every backend implements [`Admin`], so this is the same store `open`
/// returns, with more methods.
///
/// # Errors
///
/// As [`open`].
///
/// # Examples
///
/// ```
/// use dedup::Admin;
/// use dedup::admin::ListFilter;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let admin = dedup::open_admin("sqlite::memory:").await?;
/// let records = admin.list(&ListFilter::consumer("billing")).await?;
/// assert!(records.is_empty());
/// # Ok(())
/// # }
/// ```
pub async fn open_admin(url: &str) -> Result<Arc<dyn Admin>, OpenError> {
    StoreUrl::parse(url)?.open_admin().await
}

/// The transactional outbox of the store `url` names, for relays and operators.
///
/// It opens the outbox table of a store whose backend has one. Like [`open`], it
/// migrates unless the URL says `migrate=false`. For `memory:` it is a fresh
/// [`MemoryOutbox`](dedup_core::outbox::MemoryOutbox). The `dedup outbox` commands use it.
///
/// # Errors
///
/// - As [`open`].
/// - [`OpenError::Url`] with [`UrlError::NoOutbox`]: the backend has no outbox (see
///   [`crate::url::backends`]). Nothing was contacted.
///
/// # Examples
///
/// ```
/// use dedup::outbox::OutboxStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let outbox = dedup::open_outbox("sqlite::memory:").await?;
/// assert_eq!(outbox.stats().await?.pending, 0);
/// # Ok(())
/// # }
/// ```
pub async fn open_outbox(url: &str) -> Result<Arc<dyn OutboxStore>, OpenError> {
    StoreUrl::parse(url)?.open_outbox().await
}

/// [`open`] with an injected clock for lease arithmetic.
///
/// Use it for simulations and tests. A [`ManualClock`](dedup_core::ManualClock) makes
/// leases expire when the test says.
///
/// # Errors
///
/// As [`open`].
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use dedup::store::{ClaimOptions, ManualClock};
/// use dedup::{DedupStore, Key};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let clock = Arc::new(ManualClock::starting_now());
/// let store = dedup::open_with_clock("memory:", clock.clone()).await?;
/// let key = Key::new("billing", "order-42")?;
/// let options = ClaimOptions::lease(Duration::from_secs(30));
/// assert!(store.claim(&key, &options).await?.is_acquired());
///
/// // Past the lease, another worker takes the key over.
/// clock.advance(Duration::from_secs(31));
/// assert_eq!(store.claim(&key, &options).await?.lease().map(|l| l.attempt), Some(2));
/// # Ok(())
/// # }
/// ```
pub async fn open_with_clock(
    url: &str,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn DedupStore>, OpenError> {
    StoreUrl::parse(url)?.with_clock(clock).open().await
}

impl StoreUrl {
    /// Opens the store (see [`open`]).
    ///
    /// # Errors
    ///
    /// [`OpenError::Store`] when the backend could not open the store.
    pub async fn open(self) -> Result<Arc<dyn DedupStore>, OpenError> {
        Ok(self.open_admin().await?)
    }

    /// Opens the store as an [`Admin`] handle (see [`open_admin`]).
    ///
    /// # Errors
    ///
    /// [`OpenError::Store`] when the backend could not open the store.
    pub async fn open_admin(self) -> Result<Arc<dyn Admin>, OpenError> {
        let url = self.to_string();
        self.into_target()
            .open_admin()
            .await
            .map_err(|source| OpenError::Store { url, source })
    }

    /// Opens the store's outbox (see [`open_outbox`]).
    ///
    /// # Errors
    ///
    /// [`OpenError::Url`] with [`UrlError::NoOutbox`] for a backend without an outbox;
    /// [`OpenError::Store`] when the backend could not open it.
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
