//! What the main demo prints around the delivery simulation: a progress bar per run and
//! the table comparing the two consumers.

use indicatif::{ProgressBar, ProgressStyle};

use crate::report::{print_json, print_table};
use crate::sim::{Consumer, SimConfig, SimReport};

/// A bar counting the acks of `consumer`'s run, shown only for long runs (5000 messages
/// or more).
pub fn progress_bar(cfg: &SimConfig, consumer: Consumer) -> ProgressBar {
    // Every published copy is acknowledged once; the bar counts those.
    let expected = (cfg.messages as f64 * (1.0 + cfg.duplicate_rate)) as u64;
    let bar = if cfg.messages >= 5000 {
        ProgressBar::new(expected)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix:>6} [{bar:40}] {pos}/{len} acks ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("{consumer:?}").to_lowercase());
    bar
}

/// Print one table row per run, then what the time column means. `lease_ms` is the dedup
/// consumer's lease; `json` also prints each report as a JSON line.
pub fn print_reports(reports: &[SimReport], lease_ms: u64, json: bool) {
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            vec![
                r.consumer.clone(),
                r.messages.to_string(),
                r.deliveries.to_string(),
                r.duplicates_suppressed.to_string(),
                r.side_effects.to_string(),
                r.doubled.to_string(),
                r.lost.to_string(),
                format!("{:.2}s", r.time_ms as f64 / 1000.0),
            ]
        })
        .collect();
    print_table(
        &[
            "consumer",
            "messages",
            "deliveries",
            "duplicates suppressed",
            "charges",
            "doubled",
            "lost",
            "time",
        ],
        &rows,
    );
    let crashes = reports.iter().find(|r| r.consumer == "dedup");
    println!(
        "time: wall clock of each run. A crashed dedup worker's message is taken over only \
         when its lease ({} ms) expires, so the dedup time includes those waits ({} crashes \
         simulated; the naive consumer never waits, it charges again instead). \
         --lease-ms shortens them.",
        lease_ms,
        crashes.map_or(0, |r| r.crashes)
    );
    if json {
        reports.iter().for_each(print_json);
    }
}
