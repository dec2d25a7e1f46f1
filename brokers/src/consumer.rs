//! What every broker's consumer type has in common, written once: `health()`, `run()`
//! and `Debug`.
//!
//! A broker's consumer is a struct with a `config: ConsumerConfig` field and a
//! `health: Health` field, and implements [`Source`](crate::Source). Its folder says what
//! is its own: how it connects, fetches and settles. [`consumer_plumbing!`] adds the rest.

/// Adds `health()`, `run()` and `Debug` to a broker's consumer type.
///
/// - `debug`: the fields `Debug` shows, before `config` (clients and connections are left
///   out).
/// - `on_shutdown`: what the consumer does on `shutdown`, after "it" (sentences).
/// - `errors`: the errors no reconnect fixes, which end `run`, each a list item.
/// - `redelivery`: when the broker delivers again what was not settled: the end of that
///   sentence.
macro_rules! consumer_plumbing {
    (
        $consumer:ident,
        debug: [$($field:ident),* $(,)?],
        on_shutdown: $on_shutdown:literal,
        errors: [$($error:literal),+ $(,)?],
        redelivery: $redelivery:literal $(,)?
    ) => {
        impl $consumer {
            /// The consumer's live state for probes (connected, in flight, last settle,
            /// reconnects): take it before [`run`](Self::run); it follows that run.
            pub fn health(&self) -> $crate::Health {
                self.health.clone()
            }

            /// Consumes until `shutdown` fires, or until an error no reconnect fixes.
            ///
            #[doc = concat!("On `shutdown` it ", $on_shutdown)]
            /// Then it returns the counts of what happened. See [`consume`](crate::consume)
            /// for the loop.
            ///
            /// # Errors
            ///
            /// A lost connection or a restarting broker does not end it: it connects again,
            /// with backoff. It returns an error no reconnect fixes:
            $(#[doc = concat!("- ", $error)])+
            ///
            /// # Cancel safety
            ///
            /// Dropping the future is not a graceful stop: fire `shutdown` instead. Handlers
            /// already started are aborted at their next await point. An
            /// [`Inbox`](dedup_core::Inbox) releases their leases in the background.
            #[doc = concat!("The broker delivers again what was not settled", $redelivery)]
            pub async fn run<H: $crate::Handle>(
                self,
                handler: H,
                shutdown: $crate::Shutdown,
            ) -> Result<$crate::ConsumerStats, $crate::BrokerError> {
                let config = self.config.clone();
                let health = self.health.clone();
                $crate::consume_with_health(self, config, handler, shutdown, health).await
            }
        }

        impl std::fmt::Debug for $consumer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($consumer))
                    $(.field(stringify!($field), &self.$field))*
                    .field("config", &self.config)
                    .finish_non_exhaustive()
            }
        }
    };
}

pub(crate) use consumer_plumbing;
