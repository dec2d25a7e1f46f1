//! Where the store's blocking SQLite calls run: [`blocking`], on the calling worker thread
//! (`block_in_place`) or on tokio's blocking pool.
//!
//! Its own file because it is about threads, not connections: it runs any blocking work
//! (opening the store, a pooled connection's operation, a group of writes), and its
//! panic handling has nothing to do with SQLite.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

use dedup_core::Result;

use crate::error::SetupError;

/// Run the blocking `work` (SQLite calls) where blocking is allowed, and return what it
/// returned.
///
/// With `in_place` on a multi-threaded tokio runtime it runs right here, on the calling
/// thread, which `block_in_place` first turns into a blocking thread (tokio hands the
/// thread's other tasks to another worker). Otherwise it runs on tokio's blocking pool
/// (`spawn_blocking`). The first saves two thread hand-overs per call, a round trip of
/// about 30 µs, a third of a claim on a quiet store (see
/// [`SqliteConfig::block_in_place`](crate::SqliteConfig::block_in_place)). Either way
/// `work` runs to its end even if the caller stops waiting, and a panic inside it comes
/// back as [`SetupError::Panicked`] / [`SetupError::TaskFailed`] instead of unwinding into
/// the caller.
pub(crate) async fn blocking<T: Send + 'static>(
    in_place: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    let flavor = tokio::runtime::Handle::try_current().map(|rt| rt.runtime_flavor());
    if let (true, Ok(tokio::runtime::RuntimeFlavor::MultiThread)) = (in_place, flavor) {
        let ran = tokio::task::block_in_place(|| panic::catch_unwind(AssertUnwindSafe(work)));
        return ran.map_err(|payload| SetupError::Panicked(panic_message(&*payload)).into());
    }
    let task = tokio::task::spawn_blocking(work);
    Ok(task.await.map_err(SetupError::TaskFailed)?)
}

/// The text a panic was raised with, if it was text.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    match (
        payload.downcast_ref::<&str>(),
        payload.downcast_ref::<String>(),
    ) {
        (Some(text), _) => (*text).to_owned(),
        (None, Some(text)) => text.clone(),
        (None, None) => "(a panic without a message)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::thread;
    use std::time::Duration;

    use super::*;

    /// The thread `blocking` ran its work on, and whether that is the caller's.
    async fn ran_here(in_place: bool) -> bool {
        let caller = thread::current().id();
        blocking(in_place, move || thread::current().id() == caller)
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn blocking_work_runs_on_the_calling_thread_only_in_place_on_a_multi_threaded_runtime() {
        assert!(ran_here(true).await, "in place: the caller's thread");
        assert!(!ran_here(false).await, "not in place: the blocking pool");
        // Another task of the same runtime keeps running while one blocks in place.
        let (tx, rx) = std::sync::mpsc::channel();
        let other = tokio::spawn(async move { tx.send(()).unwrap() });
        let heard = blocking(true, move || rx.recv_timeout(Duration::from_secs(10)))
            .await
            .unwrap();
        assert!(heard.is_ok(), "the other task ran while this one blocked");
        other.await.unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn blocking_work_uses_the_blocking_pool_on_a_current_thread_runtime() {
        assert!(!ran_here(true).await);
        assert!(!ran_here(false).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_in_blocking_work_comes_back_as_an_error_either_way() {
        for in_place in [true, false] {
            let err = blocking(in_place, || -> () { panic!("boom in the work") })
                .await
                .unwrap_err();
            let mut text = err.to_string();
            let mut source = std::error::Error::source(&err);
            while let Some(cause) = source {
                text = format!("{text}: {cause}");
                source = cause.source();
            }
            assert!(text.contains("panicked"), "{in_place}: {text}");
            if in_place {
                assert!(text.contains("boom in the work"), "{text}");
            }
        }
    }
}
