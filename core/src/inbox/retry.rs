//! [`HandlerRetry`]: running a failed handler again in process, before the delivery is given
//! back, for the errors the handler marks [`Transient`].

use std::fmt;
use std::time::Duration;

use crate::BoxError;

/// A handler error that running the handler again may fix (a timeout of a downstream call,
/// a connection refused, HTTP 503): the inbox runs the handler again under
/// [`InboxConfig::handler_retry`](super::InboxConfig::handler_retry) before it gives the
/// delivery back. Any other handler error is final for this delivery.
///
/// Wrap the error where the handler knows it is transient:
///
/// ```
/// use dedup_core::Transient;
/// fn call_courier() -> Result<(), std::io::Error> {
///     Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "courier API timed out"))
/// }
/// let err = call_courier().map_err(Transient::new).unwrap_err();
/// assert!(Transient::is_in(&err));
/// assert_eq!(err.to_string(), "courier API timed out");
/// ```
///
/// It displays as the error it wraps and keeps it as its `source`;
/// [`InboxError::handler_error`](super::InboxError::handler_error) looks through it.
#[derive(Debug)]
pub struct Transient(BoxError);

impl Transient {
    /// Mark `error` as transient.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Transient(error.into())
    }

    /// The wrapped error.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// The wrapped error, unwrapped.
    pub fn into_inner(self) -> BoxError {
        self.0
    }

    /// Whether `error`, or an error in its source chain, is a [`Transient`].
    pub fn is_in(error: &(dyn std::error::Error + 'static)) -> bool {
        let mut current = Some(error);
        while let Some(e) = current {
            if e.is::<Transient>() {
                return true;
            }
            current = e.source();
        }
        false
    }
}

impl fmt::Display for Transient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Transient {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// How many times, and after which delays, an inbox runs a handler again in process after
/// a [`Transient`] error, before it gives the delivery back (MassTransit's
/// `UseMessageRetry`). Used by [`Inbox::handle`](super::Inbox::handle) (and so by every
/// broker consumer built on it), `Inbox::handle_json` and the
/// SQL backends' transactional inboxes.
///
/// Each run is a new attempt: the inbox keeps the lease through the delay (a duplicate
/// delivery meanwhile answers [`Handled::Busy`](super::Handled::Busy)), then releases it
/// and claims the key again, so the attempt count and the fence grow by one, every run
/// counts toward [`max_attempts`](super::InboxConfig::max_attempts), and a downstream
/// system fencing by the lease sees each run as a new owner. If another worker claims the
/// key in the instant between the release and the new claim, this call answers what that
/// claim answered (usually `Busy`).
///
/// When the retries are used up, the error is given back as
/// [`InboxError::Handler`](super::InboxError::Handler) and the lease released, whatever the
/// [`FailurePolicy`](super::FailurePolicy): a transient error is never stored as the key's
/// result. The broker's redelivery (and, past `max_attempts`, the dead letter) takes over.
///
/// The handler's side effects are not undone between runs: make them idempotent (with
/// [`Lease::idempotency_key`](crate::Lease::idempotency_key)) or transactional.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandlerRetry {
    /// Runs after the first one (0: never run again).
    pub max_retries: u32,
    /// The delay before each run again.
    pub backoff: Backoff,
}

/// The delay before a handler runs again; see [`HandlerRetry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backoff {
    /// Run again at once.
    Immediate,
    /// The same delay before every run.
    Interval(Duration),
    /// `initial`, doubling before each later run, at most `max`; with `jitter`, each delay
    /// is drawn uniformly between half of it and all of it, so workers that failed
    /// together do not retry together.
    Exponential {
        /// The delay before the first run again.
        initial: Duration,
        /// The largest delay.
        max: Duration,
        /// Spread each delay over its upper half at random.
        jitter: bool,
    },
}

impl Default for HandlerRetry {
    /// No retry in process: the first failure is given back ([`HandlerRetry::NEVER`]).
    fn default() -> Self {
        HandlerRetry::NEVER
    }
}

impl HandlerRetry {
    /// No retry in process.
    pub const NEVER: HandlerRetry = HandlerRetry {
        max_retries: 0,
        backoff: Backoff::Immediate,
    };

    /// `max_retries` runs again at once.
    pub fn immediate(max_retries: u32) -> Self {
        HandlerRetry {
            max_retries,
            backoff: Backoff::Immediate,
        }
    }

    /// `max_retries` runs again, each after `every`.
    pub fn interval(max_retries: u32, every: Duration) -> Self {
        HandlerRetry {
            max_retries,
            backoff: Backoff::Interval(every),
        }
    }

    /// `max_retries` runs again after `initial`, doubling up to `max`, with jitter.
    pub fn exponential(max_retries: u32, initial: Duration, max: Duration) -> Self {
        HandlerRetry {
            max_retries,
            backoff: Backoff::Exponential {
                initial,
                max,
                jitter: true,
            },
        }
    }

    /// Whether the handler runs again after its `retries`-th retry failed with `error`
    /// (`retries` is 0 after the first run).
    pub(crate) fn again(&self, retries: u32, error: &(dyn std::error::Error + 'static)) -> bool {
        retries < self.max_retries && Transient::is_in(error)
    }

    /// The delay before retry number `retry` (1 for the first).
    pub fn delay(&self, retry: u32) -> Duration {
        self.backoff.delay(retry)
    }
}

impl Backoff {
    /// The delay before retry number `retry` (1 for the first).
    pub fn delay(&self, retry: u32) -> Duration {
        match *self {
            Backoff::Immediate => Duration::ZERO,
            Backoff::Interval(every) => every,
            Backoff::Exponential {
                initial,
                max,
                jitter,
            } => {
                let doublings = retry.saturating_sub(1).min(31);
                let full = initial.saturating_mul(1 << doublings).min(max);
                if jitter {
                    // Uniform in [full / 2, full], from the random bits of a v4 UUID.
                    let unit =
                        (uuid::Uuid::new_v4().as_u128() as u64 >> 11) as f64 / (1u64 << 53) as f64;
                    full.mul_f64(0.5 + unit / 2.0)
                } else {
                    full
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_delays_double_up_to_the_cap() {
        let plain = HandlerRetry {
            max_retries: 10,
            backoff: Backoff::Exponential {
                initial: Duration::from_millis(100),
                max: Duration::from_millis(700),
                jitter: false,
            },
        };
        let delays: Vec<_> = (1..=5).map(|r| plain.delay(r).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 700, 700]);
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let jittered =
            HandlerRetry::exponential(10, Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<_> = (0..200).map(|_| jittered.delay(3)).collect();
        assert!(
            delays
                .iter()
                .all(|d| *d >= Duration::from_millis(200) && *d <= Duration::from_millis(400))
        );
        assert!(delays.iter().any(|d| *d != delays[0]), "no jitter at all");
    }

    #[test]
    fn only_transient_errors_within_the_limit_run_again() {
        let retry = HandlerRetry::immediate(2);
        let transient: BoxError = Box::new(Transient::new("timeout"));
        let plain: BoxError = "card declined".into();
        assert!(retry.again(0, &*transient));
        assert!(retry.again(1, &*transient));
        assert!(!retry.again(2, &*transient));
        assert!(!retry.again(0, &*plain));
        assert!(!HandlerRetry::NEVER.again(0, &*transient));
    }
}
