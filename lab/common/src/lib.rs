//! What the example programs, the bench and the chaos runs share: printing results as a
//! table and as JSON lines, how a program reports a failure, a seeded random number
//! generator, and (features) private servers and the integration tests' helpers.

pub mod exit;
#[cfg(feature = "programs")]
pub mod programs;
pub mod report;
pub mod rng;
#[cfg(feature = "servers")]
pub mod servers;
