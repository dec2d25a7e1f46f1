//! [`Setup`]: what a [`Kit::run_with`](crate::Kit::run_with) setup builds its store from
//! (the kit's clock and the kit's own tables), and the cleanup that drops those tables
//! after the run.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use dedup_core::{ManualClock, MemoryStore};
use futures::future::BoxFuture;

/// One thing to undo after a run (drop a table the kit created).
type Cleanup = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// What a run undoes when it ends, in the order it was registered.
#[derive(Clone, Default)]
pub(crate) struct Cleanups(Arc<Mutex<Vec<Cleanup>>>);

impl Cleanups {
    fn push(&self, cleanup: Cleanup) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(cleanup);
    }

    fn take(&self) -> Vec<Cleanup> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The kit's runtime and what to undo on it: dropping a `Rig` (after the run, or while a
/// panic unwinds through it) runs the cleanups, then shuts the runtime down.
pub(crate) struct Rig {
    pub(crate) runtime: tokio::runtime::Runtime,
    pub(crate) cleanups: Cleanups,
}

impl Drop for Rig {
    fn drop(&mut self) {
        for cleanup in self.cleanups.take() {
            // A cleanup reports its own failure (it must not panic: this may run while a
            // panic unwinds).
            self.runtime.block_on(cleanup());
        }
    }
}

/// What a [`Kit::run_with`](crate::Kit::run_with) setup gets: the kit's clock and the
/// tables the kit's store lives in.
///
/// By default those tables are the kit's own: fresh names per run (`dedup_testkit_<12 hex
/// digits>` and that plus `_outbox`; on MySQL / MariaDB also the outbox's `_keys` table),
/// created when the store opens and dropped after the run, also when it fails or a panic
/// unwinds through it (with their rows in the schema versions table). The kit's clock (which the kit moves hours ahead to expire leases)
/// only ever stamps rows of those tables, so a run against the database of a live service
/// leaves the service's inbox and outbox alone: its relay never sees the kit's messages.
/// [`Kit::named_tables`](crate::Kit::named_tables) opts in to tables of your choosing (a
/// copy of your service's schema), which the kit then keeps.
///
/// Build the store with [`sqlite`](Self::sqlite) (feature `sqlite`),
/// [`postgres`](Self::postgres) (feature `postgres`), [`mysql`](Self::mysql) (feature
/// `mysql`) or [`memory_store`](Self::memory_store): they put it on these tables and this
/// clock and register the cleanup. For another store, [`clock`](Self::clock),
/// [`inbox_table`](Self::inbox_table), [`outbox_table`](Self::outbox_table) and
/// [`on_cleanup`](Self::on_cleanup) are the parts.
pub struct Setup {
    clock: Arc<ManualClock>,
    inbox_table: String,
    outbox_table: String,
    owned: bool,
    cleanups: Cleanups,
}

impl fmt::Debug for Setup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Setup")
            .field("inbox_table", &self.inbox_table)
            .field("outbox_table", &self.outbox_table)
            .field("owned", &self.owned)
            .finish_non_exhaustive()
    }
}

impl Setup {
    pub(crate) fn new(
        clock: Arc<ManualClock>,
        (inbox_table, outbox_table): (String, String),
        owned: bool,
        cleanups: Cleanups,
    ) -> Self {
        Setup {
            clock,
            inbox_table,
            outbox_table,
            owned,
            cleanups,
        }
    }

    /// The kit's clock. The kit moves it (hours, over a run) to expire leases: give it
    /// only to a store on [`inbox_table`](Self::inbox_table) and
    /// [`outbox_table`](Self::outbox_table), never to one on your service's own tables
    /// (its rows would be stamped in the future). [`sqlite`](Self::sqlite),
    /// [`postgres`](Self::postgres) and [`memory_store`](Self::memory_store) do that for
    /// you.
    pub fn clock(&self) -> Arc<ManualClock> {
        Arc::clone(&self.clock)
    }

    /// The records table of the run's store.
    pub fn inbox_table(&self) -> &str {
        &self.inbox_table
    }

    /// The outbox table of the run's store.
    pub fn outbox_table(&self) -> &str {
        &self.outbox_table
    }

    /// Whether the tables are the kit's own (dropped after the run): `false` only with
    /// [`Kit::named_tables`](crate::Kit::named_tables).
    pub fn owns_tables(&self) -> bool {
        self.owned
    }

    /// A [`MemoryStore`] on the kit's clock (nothing to drop).
    pub fn memory_store(&self) -> MemoryStore {
        MemoryStore::with_clock(self.clock())
    }

    /// Run `cleanup` on the kit's runtime when the run ends (passed, failed, or unwinding
    /// from a panic), after the store and the consumer are dropped. For a store the kit
    /// cannot build itself: drop its tables here. `cleanup` reports its own failures (a
    /// panic in it while another unwinds aborts the process).
    pub fn on_cleanup<F, Fut>(&self, cleanup: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.cleanups.push(Box::new(move || Box::pin(cleanup())));
    }
}
