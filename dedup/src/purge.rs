//! Removing old records: a [`Purger`] in the background, or one purge at a time.
//!
//! A [`Purger`] runs under a [`Retention`] and reports [`PurgerStats`]. One purge takes
//! [`PurgeOptions`] (batch size, limits, [`Pace`]) and returns a [`PurgeReport`].
//! [`PurgeRun`] is the last purge a store ran, as the store keeps it.

pub use dedup_core::{
    Pace, PurgeOptions, PurgeReport, PurgeRun, Purger, PurgerError, PurgerHandle, PurgerStats,
    PurgerWarning, Retention,
};
