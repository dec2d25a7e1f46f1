//! What a worker and the per-backend modules share: the key of each message, the effects
//! table and file, the announcement of a window to the controller, and retrying store
//! calls across a server restart.

use std::future::Future;
use std::io::{BufRead, Write as _};
use std::time::{Duration, Instant};

use dedup_core::{Key, Result};

use super::Window;

/// The effects table of transactional mode (in the store's database).
pub const EFFECTS_TABLE: &str = "chaos_effects";
/// The effects file of lease mode (in the run's folder).
pub const EFFECTS_FILE: &str = "effects.log";
/// The consumer of every key.
pub const CONSUMER: &str = "chaos";

/// The key of message `id`.
pub fn key(id: u64) -> Key {
    Key::new(CONSUMER, format!("m{id}")).expect("valid key")
}

/// Announce `window` for message `id` and wait for the controller's go-ahead (it may kill
/// this process instead). A closed stdin ends the worker.
pub fn announce(window: Window, id: u64) {
    println!("AT {window} {id}");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(n) if n > 0 => {}
        _ => std::process::exit(0),
    }
}

/// Call `op` until it succeeds or fails with an error `retryable` rejects (or for a
/// minute: a server restart takes seconds).
pub async fn retried_if<T, E, F, Fut>(
    what: &str,
    retryable: fn(&E) -> bool,
    mut op: F,
) -> std::result::Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, E>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match op().await {
            Err(e) if retryable(&e) && Instant::now() < deadline => {
                eprintln!("{what}: retrying after {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// [`retried_if`] for store calls: retries the errors the store calls retryable.
pub async fn retried<T, F, Fut>(what: &str, op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    retried_if(what, dedup_core::Error::is_retryable, op).await
}
