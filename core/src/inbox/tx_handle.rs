//! [`TxHandle`]: what a transactional inbox whose handler runs on an async connection
//! offers to code that is generic over the backend (a broker consumer's handler).

use futures::future::BoxFuture;

use super::{Handled, InboxError};
use crate::{BoxError, Fingerprint, Key, Lease};

/// A transactional inbox whose handler gets the open transaction as `&mut Self::Conn` and
/// returns a boxed future: `dedup_postgres::TxInbox` (`PgConnection`) and
/// `dedup_mysql::TxInbox` (`MySqlConnection`). It lets code generic over the backend, such
/// as `dedup_brokers::with_tx_inbox`, run a handler in the inbox's transaction without
/// depending on the backend's crate.
///
/// [`handle_tx`](Self::handle_tx) is the backend's `handle`: the handler's writes and the
/// key's completion commit in one transaction; the handler may run more than once (a
/// retry, a later delivery after a failure), each time in a fresh transaction, and must
/// not commit or roll back the transaction itself.
pub trait TxHandle: Send + Sync + 'static {
    /// The connection the open transaction runs on.
    type Conn: Send + ?Sized;

    /// Process `key` at most once inside a transaction of the inbox's own, running
    /// `handler` with the transaction and the lease.
    fn handle_tx<'a, H, E>(
        &'a self,
        key: &'a Key,
        fingerprint: Option<Fingerprint>,
        handler: H,
    ) -> BoxFuture<'a, Result<Handled, InboxError>>
    where
        H: for<'c> FnMut(
                &'c mut Self::Conn,
                &'c Lease,
            ) -> BoxFuture<'c, Result<Option<Vec<u8>>, E>>
            + Send
            + 'a,
        E: Into<BoxError> + Send + 'a;
}
