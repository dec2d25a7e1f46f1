//! The store's "now": an injected clock, or the server's, sampled.
//!
//! JetStream has no command that reads the server's time inside a write, as Redis's
//! `TIME` does in a script. So the server clock asks the stream leader for its time (the
//! `ts` of a stream info answer) [`ASKS`] times at most once per [`SAMPLE_EVERY`], keeps
//! the answer of the shortest round trip, and in between adds the time this process
//! measured since (a monotonic clock). Every client of the bucket
//! thus follows the leader's clock, whatever its own wall clock says. The error is at most
//! half the shortest round trip, plus the drift of two clocks over one sample period (parts per
//! million), plus the skew between the old and the new leader's clocks after a failover.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use dedup_core::{Result, Timestamp};

use crate::messages::Messages;

/// Round trips per sample; the shortest one's answer is kept.
const ASKS: usize = 3;

/// How long one sample of the server's time is used.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// The server's clock, as last sampled.
#[derive(Debug, Default)]
pub(crate) struct ServerClock {
    /// When the sample was taken here, and the server's time then.
    sample: Mutex<Option<(Instant, Timestamp)>>,
}

impl ServerClock {
    /// The server's time now; asks the server when the sample is missing or old.
    pub(crate) async fn now(&self, messages: &Messages) -> Result<Timestamp> {
        if let Some(now) = self.sampled(SAMPLE_EVERY) {
            return Ok(now);
        }
        // NTP's rule: of a few round trips, trust the shortest, whose middle is the
        // closest to the instant the server read its clock.
        let mut best: Option<(Duration, Instant, Timestamp)> = None;
        for _ in 0..ASKS {
            let asked = Instant::now();
            let server = messages.server_time().await?;
            let round_trip = asked.elapsed();
            if best.is_none_or(|(shortest, ..)| round_trip < shortest) {
                best = Some((round_trip, asked + round_trip / 2, server));
            }
        }
        if let Some((_, taken, server)) = best {
            *self.sample.lock().unwrap_or_else(|e| e.into_inner()) = Some((taken, server));
        }
        self.sampled(Duration::MAX)
            .ok_or_else(|| crate::error::unreadable("server time"))
    }

    /// The sampled time moved on by what elapsed here, when the sample is younger than
    /// `max_age`.
    fn sampled(&self, max_age: Duration) -> Option<Timestamp> {
        let sample = *self.sample.lock().unwrap_or_else(|e| e.into_inner());
        let (taken, server) = sample?;
        let elapsed = taken.elapsed();
        (elapsed < max_age).then(|| server.saturating_add(elapsed))
    }
}
