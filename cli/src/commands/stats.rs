//! `dedup stats`: records by state, the oldest live lease, the most retried keys, the size,
//! and the last purge run.

use dedup_core::{PurgeRun, Timestamp};
use serde_json::{Value, json};

use crate::StoreArgs;
use crate::failure::Failure;
use crate::open::{Access, Opened, open};
use crate::render::{bytes, print, span, summary_json, utc, when};
use crate::screen::line;

/// Show the store's stats, with the `top` most retried keys.
pub(super) async fn run(args: &StoreArgs, as_json: bool, top: usize) -> Result<(), Failure> {
    let Opened {
        store,
        backend,
        location,
        ..
    } = open(args, Access::Read).await?;
    let stats = store
        .stats(top)
        .await
        .map_err(|e| Failure::store("cannot read the store's stats", e))?;
    // A role that may read the records but not the purge runs still gets its stats.
    let last_purge = store
        .last_purge()
        .await
        .map_err(|e| dedup_core::error_chain(&e));
    let json = json!({
        "backend": backend,
        "location": location,
        "now": { "utc": crate::render::rfc3339(stats.now), "ms": stats.now.as_millis() },
        "in_flight": stats.in_flight,
        "expired": stats.expired,
        "completed": stats.completed,
        "failed": stats.failed,
        "dead_lettered": stats.dead_lettered,
        "total": stats.total(),
        "oldest_live": stats.oldest_live.as_ref().map(summary_json),
        "most_retried": stats.most_retried.iter().map(summary_json).collect::<Vec<_>>(),
        "size_bytes": stats.size_bytes,
        "last_purge": last_purge.as_ref().ok().and_then(Option::as_ref).map(purge_run_json),
        "last_purge_error": last_purge.as_ref().err(),
    });
    print(as_json, json, || {
        let now = stats.now;
        let mut out = vec![
            format!("store:       {backend}, {location}"),
            format!("now:         {}", utc(now)),
            format!("in flight:   {} (live leases)", stats.in_flight),
            format!(
                "expired:     {} (lease ran out or released: retried on next delivery)",
                stats.expired
            ),
            format!("processed:   {}", stats.completed),
            format!(
                "failed:      {} (a stored failure is their result)",
                stats.failed
            ),
            format!(
                "dead-lettered: {} (used up their attempts: `dedup list --state dead-letter`)",
                stats.dead_lettered
            ),
            format!("total:       {}", stats.total()),
        ];
        out.push(match &stats.oldest_live {
            Some(o) => format!(
                "oldest live lease: {} / {} (attempt {}, fence {}), expires {}",
                line(o.key.consumer()),
                line(o.key.message_id()),
                o.attempt,
                o.fence,
                when(o.at, now)
            ),
            None => "oldest live lease: none".into(),
        });
        if stats.most_retried.is_empty() {
            out.push("most retried: none (no key needed a second attempt)".into());
        } else {
            out.push("most retried:".into());
            out.extend(stats.most_retried.iter().map(|s| {
                format!(
                    "  attempt {:<4} {:<10} {} / {}",
                    s.attempt,
                    s.status.as_str(),
                    line(s.key.consumer()),
                    line(s.key.message_id())
                )
            }));
        }
        out.push(format!(
            "size:        {}",
            stats
                .size_bytes
                .map_or("unknown for this backend".into(), bytes)
        ));
        out.push(purge_run_line(&last_purge, now));
        out.join("\n")
    });
    Ok(())
}

/// The store's last purge run as JSON.
fn purge_run_json(run: &PurgeRun) -> Value {
    json!({
        "finished_at": { "utc": crate::render::rfc3339(run.finished_at), "ms": run.finished_at.as_millis() },
        "removed": run.removed,
        "took_ms": run.took_ms(),
        "stopped_early": run.stopped_early,
    })
}

/// The store's last purge run as `dedup stats` shows it: when, how many, how long, and
/// whether it kept up (or why it could not be read).
fn purge_run_line(run: &Result<Option<PurgeRun>, String>, now: Timestamp) -> String {
    let run = match run {
        Ok(Some(run)) => run,
        Ok(None) => return "last purge:  none finished yet".into(),
        Err(cause) => {
            return format!("last purge:  unknown (cannot read it: {})", line(cause));
        }
    };
    format!(
        "last purge:  finished {}, removed {} in {}, {}",
        when(run.finished_at, now),
        run.removed,
        span(run.took),
        match run.stopped_early {
            true => "stopped early at its batch limit (records it could remove are left)",
            false => "to the end",
        }
    )
}
