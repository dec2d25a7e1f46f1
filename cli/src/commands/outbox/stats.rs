//! `dedup outbox stats`: rows by state, the age of the oldest unsent one, and the same by
//! destination.

use dedup_core::outbox::DestinationStats;
use serde_json::{Value, json};

use crate::StoreArgs;
use crate::failure::Failure;
use crate::open::{Access, open_outbox};
use crate::render::{print, span, utc};
use crate::screen::line;

use super::time_json;

/// Show the outbox's stats, in all and by destination.
pub(super) async fn run(args: &StoreArgs, as_json: bool) -> Result<(), Failure> {
    let (outbox, backend) = open_outbox(args, Access::Read).await?;
    let stats = outbox
        .stats()
        .await
        .map_err(|e| Failure::store("cannot read the outbox's stats", e))?;
    let destinations = outbox
        .stats_by_destination()
        .await
        .map_err(|e| Failure::store("cannot read the outbox's stats by destination", e))?;
    let json = json!({
        "backend": backend,
        "now": time_json(stats.now),
        "pending": stats.pending,
        "held": stats.held,
        "sent": stats.sent,
        "dead": stats.dead,
        "oldest_unsent": stats.oldest_unsent.map(time_json),
        "oldest_unsent_age_ms": stats.oldest_unsent.map(|_| stats.oldest_unsent_age().as_millis() as u64),
        "destinations": destinations.iter().map(destination_json).collect::<Vec<_>>(),
    });
    print(as_json, json, || {
        [
            format!("outbox:   {backend}"),
            format!("now:      {}", utc(stats.now)),
            format!("pending:  {} (waiting to be published)", stats.pending),
            format!("held:     {} (taken by a relay)", stats.held),
            format!("sent:     {} (until purged)", stats.sent),
            format!("dead:     {} (see `dedup outbox retry`)", stats.dead),
            match stats.oldest_unsent {
                Some(t) => format!(
                    "oldest unsent: written {} ({} ago)",
                    utc(t),
                    span(stats.oldest_unsent_age())
                ),
                None => "oldest unsent: none".into(),
            },
            destinations_text(&destinations),
        ]
        .join("\n")
    });
    Ok(())
}

/// One destination's stats as JSON.
fn destination_json(d: &DestinationStats) -> Value {
    let s = &d.stats;
    json!({
        "destination": d.destination,
        "pending": s.pending,
        "held": s.held,
        "sent": s.sent,
        "dead": s.dead,
        "oldest_unsent": s.oldest_unsent.map(time_json),
        "oldest_unsent_age_ms": s.oldest_unsent.map(|_| s.oldest_unsent_age().as_millis() as u64),
    })
}

/// The per-destination table of `dedup outbox stats`.
fn destinations_text(destinations: &[DestinationStats]) -> String {
    let mut out = String::from("by destination:");
    if destinations.is_empty() {
        out.push_str(" none (no rows)");
    }
    for d in destinations {
        let s = &d.stats;
        let lag = match s.oldest_unsent {
            Some(_) => format!("oldest unsent {} ago", span(s.oldest_unsent_age())),
            None => "nothing unsent".into(),
        };
        out.push_str(&format!(
            "\n  {}: pending {}, held {}, sent {}, dead {}, {lag}",
            line(&d.destination),
            s.pending,
            s.held,
            s.sent,
            s.dead
        ));
    }
    out
}
