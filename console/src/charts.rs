//! The overview's flow section: the [`Flow`] figures as SVG charts.

use std::fmt::Write;
use std::time::Duration;

use crate::html::{age, esc, time};
use crate::model::Flow;
use crate::svg::{Kind, Series, chart};

const PROCESSED: &str = "#2a7a3a";
const FAILED: &str = "#b02020";
const LEVEL: &str = "#2456a6";

fn count(v: u64) -> String {
    v.to_string()
}

fn lag(ms: u64) -> String {
    age(Duration::from_millis(ms))
}

/// The flow section of the overview: a chart per consumer (processed and failed per
/// minute), the outbox's lag, and each broker's backlog.
pub fn section(f: &Flow) -> String {
    let mut b = String::from("<h2>Flow, last hour</h2>");
    let every = match f.sample_every_ms {
        0 => "when the overview is read".to_owned(),
        ms => format!("every {}", age(Duration::from_millis(ms))),
    };
    let since = match f.first_sample_at {
        Some(at) => format!("since {} UTC", time(dedup_core::Timestamp::from_millis(at))),
        None => "none yet".to_owned(),
    };
    let _ = write!(
        b,
        "<p class=note id=flow-note>Counts sampled by this console {every} ({} samples, {since}); \
         it starts empty after a restart. Per minute: records newly processed, failed or \
         dead-lettered.</p><div id=flow>",
        f.samples
    );
    for c in &f.consumers {
        let svg = chart(
            &format!("{}: processed and failed per minute", c.consumer),
            Kind::Bars,
            &[
                Series {
                    label: "processed",
                    color: PROCESSED,
                    values: &c.processed,
                },
                Series {
                    label: "failed",
                    color: FAILED,
                    values: &c.failed,
                },
            ],
            count,
        );
        let _ = write!(
            b,
            "<figure data-consumer=\"{}\"><figcaption>{}</figcaption>{svg}</figure>",
            esc(&c.consumer),
            esc(&c.consumer)
        );
    }
    if let Some(o) = &f.outbox {
        let svg = chart(
            "outbox: lag (the oldest unsent row's age)",
            Kind::Lines,
            &[Series {
                label: "lag",
                color: LEVEL,
                values: &o.lag_ms,
            }],
            lag,
        );
        let _ = write!(
            b,
            "<figure id=flow-outbox><figcaption>outbox lag</figcaption>{svg}</figure>"
        );
    }
    for k in &f.brokers {
        let svg = chart(
            &format!("{}: {}", k.name, k.what),
            Kind::Lines,
            &[Series {
                label: k.what,
                color: LEVEL,
                values: &k.waiting,
            }],
            count,
        );
        let _ = write!(
            b,
            "<figure data-backlog=\"{}\"><figcaption>{} ({})</figcaption>{svg}</figure>",
            esc(&k.name),
            esc(&k.name),
            esc(k.what)
        );
    }
    b.push_str("</div>");
    b
}
