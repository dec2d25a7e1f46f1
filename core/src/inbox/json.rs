//! Typed outcomes (`serde` feature): [`Inbox::handle_json`].

use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Handled, Inbox, InboxError};
use crate::{BoxError, DedupStore, Fingerprint, Key, Lease};

impl<S: DedupStore + ?Sized + 'static> Inbox<S> {
    /// [`handle`](Inbox::handle) for a handler that returns a typed value.
    ///
    /// The value is stored as JSON (`serde_json`), so it stays readable in the store. A
    /// duplicate gets it back decoded as `T`. A key completed without an outcome decodes
    /// as JSON `null`: fine for `Option<_>` and `()`.
    ///
    /// Evolve `T` as you evolve any JSON message: add optional fields, do not rename.
    /// Like `handle`, it runs the handler again after a [`Transient`](super::Transient)
    /// error, under [`InboxConfig::handler_retry`](super::InboxConfig::handler_retry).
    ///
    /// # Errors
    ///
    /// The errors of [`handle`](Inbox::handle). [`InboxError::Outcome`] also covers a
    /// value that cannot be encoded, and a stored outcome that is not `T`'s JSON (written
    /// by another version of the handler, or raw bytes).
    ///
    /// # Panics
    ///
    /// As [`handle`](Inbox::handle): a handler's panic continues after the release.
    ///
    /// # Cancel safety
    ///
    /// As [`handle`](Inbox::handle).
    ///
    /// # Examples
    ///
    /// ```
    /// use dedup_core::{Handled, Inbox, Key, MemoryStore};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize, Debug, PartialEq)]
    /// struct Receipt {
    ///     charged_cents: u64,
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let inbox = Inbox::new(MemoryStore::new());
    /// let key = Key::new("billing", "order-42")?;
    /// let charge = |_lease| async { Ok::<_, std::io::Error>(Receipt { charged_cents: 1250 }) };
    ///
    /// inbox.handle_json(&key, None, charge).await?;
    /// let again = inbox.handle_json(&key, None, charge).await?;
    /// assert!(matches!(again, Handled::Duplicate { outcome: Receipt { charged_cents: 1250 }, .. }));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
    pub async fn handle_json<T, F, Fut, E>(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: F,
    ) -> Result<Handled<T>, InboxError>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(Lease) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        self.run(
            key,
            fingerprint,
            handler,
            &self.config().handler_retry,
            encode::<T>,
            decode::<T>,
        )
        .await
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Option<Vec<u8>>, BoxError> {
    Ok(Some(serde_json::to_vec(value)?))
}

fn decode<T: DeserializeOwned>(bytes: Option<Vec<u8>>) -> Result<T, BoxError> {
    Ok(serde_json::from_slice(bytes.as_deref().unwrap_or(b"null"))?)
}
