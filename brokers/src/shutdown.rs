//! [`Shutdown`]: telling a running consumer to stop, gracefully.

use tokio::sync::watch;

/// Tells consumers to stop: see [`shutdown`].
#[derive(Debug)]
pub struct ShutdownTrigger(watch::Sender<bool>);

/// What a consumer watches to know when to stop. Cloneable: one trigger stops many
/// consumers.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

/// A trigger and the signal it sets.
///
/// On the signal, a consumer stops taking deliveries. It lets the handlers it started
/// finish and settle their deliveries with the broker. It gives back what it holds
/// unstarted. Then its `run` returns.
///
/// # Examples
///
/// ```
/// use dedup_brokers::shutdown;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (trigger, signal) = shutdown();
/// let watcher = signal.clone(); // one trigger stops many consumers
/// assert!(!signal.is_set());
///
/// trigger.shut_down();
/// watcher.wait().await;
/// assert!(signal.is_set());
/// # }
/// ```
pub fn shutdown() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger(tx), Shutdown(rx))
}

impl ShutdownTrigger {
    /// Ask every consumer watching this trigger to stop.
    pub fn shut_down(&self) {
        self.0.send_replace(true);
    }
}

impl Shutdown {
    /// A signal that never fires (the consumer runs until its task is dropped or the
    /// broker closes).
    pub fn never() -> Self {
        // A dropped trigger never fires (see `wait`).
        Shutdown(watch::channel(false).1)
    }

    /// Whether the stop was asked for.
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until the stop is asked for.
    ///
    /// A trigger dropped without firing never fires: this then waits forever.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: use it in `tokio::select!`.
    pub async fn wait(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|stop| *stop).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
