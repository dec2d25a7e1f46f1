//! Reading the store and the outbox into the views' [`model`](crate::model): bounded
//! scans (at most [`ConsoleConfig::scan_limit`] records) in pages of the store's own
//! keyset paging.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dedup_core::outbox::{OutboxEntry, OutboxQuery, OutboxState, OutboxStore};
use dedup_core::{
    Admin, CountSource, Key, ListFilter, Record, RecordState, Result, Status, Timestamp,
};

use crate::ConsoleConfig;
use crate::model::*;

/// Records read per `list` call.
const BATCH: usize = 500;

/// Records from which a store whose counts read every record is large enough for the
/// overview to advise keeping counts.
pub const LARGE_STORE: u64 = 100_000;

pub use dedup_core::admin::{first_line, group_id};

/// `d` in whole milliseconds.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A key as a list line.
pub fn key_line(r: &Record, now: Timestamp, at: Timestamp) -> KeyLine {
    KeyLine {
        consumer: r.key.consumer().to_owned(),
        message_id: r.key.message_id().to_owned(),
        status: Status::of(r, now).as_str(),
        attempt: r.attempt,
        fence: r.fence,
        at: at.as_millis(),
    }
}

/// Every record of `status` over all consumers, at most `limit`, and whether more remain.
pub async fn scan(
    admin: &dyn Admin,
    statuses: &[Status],
    limit: usize,
) -> Result<(Vec<Record>, bool)> {
    let mut out = Vec::new();
    for c in admin.consumers().await? {
        for &status in statuses {
            if c.counts.count(status) == 0 {
                continue;
            }
            let mut after: Option<String> = None;
            loop {
                if out.len() >= limit {
                    return Ok((out, true));
                }
                let mut f = ListFilter::consumer(c.consumer.clone())
                    .status(status)
                    .limit(BATCH.min(limit - out.len()));
                if let Some(a) = &after {
                    f = f.after(a.clone());
                }
                let page = admin.list(&f).await?;
                let full = page.len() == f.limit;
                after = page.last().map(|r| r.key.message_id().to_owned());
                out.extend(page);
                if !full {
                    break;
                }
            }
        }
    }
    Ok((out, false))
}

/// The overview.
pub async fn overview(
    admin: &dyn Admin,
    outbox: Option<&Arc<dyn OutboxStore>>,
    store: &str,
) -> Result<Overview> {
    // The store's counts, the consumers' lines, the counts' source and the last purge
    // run, read at once.
    let (stats, consumers, source, last_purge) = futures::try_join!(
        admin.stats(0),
        admin.consumers(),
        admin.count_source(),
        admin.last_purge()
    )?;
    let counts_hint = match source {
        CountSource::Scan { keepable: true } if stats.total() >= LARGE_STORE => Some(format!(
            "These counts read all {} records; `dedup counts enable` makes the store keep \
             them (a small cost on every consumer's write).",
            stats.total()
        )),
        _ => None,
    };
    let last_purge = last_purge.map(|run| PurgeLine {
        finished_at: run.finished_at.as_millis(),
        removed: run.removed,
        took_ms: millis(run.took),
        stopped_early: run.stopped_early,
    });
    let consumers = consumers
        .into_iter()
        .map(|c| ConsumerLine {
            processed: c.counts.completed,
            in_flight: c.counts.in_flight,
            expired: c.counts.expired,
            failed: c.counts.failed,
            dead_lettered: c.counts.dead_lettered,
            consumer: c.consumer,
        })
        .collect();
    let oldest_lease = stats.oldest_live.map(|k| LeaseLine {
        consumer: k.key.consumer().to_owned(),
        message_id: k.key.message_id().to_owned(),
        attempt: k.attempt,
        fence: k.fence,
        expires_at: k.at.as_millis(),
    });
    let outbox = match outbox {
        Some(o) => {
            let (s, by_destination) = futures::try_join!(o.stats(), o.stats_by_destination())?;
            let destinations = by_destination
                .into_iter()
                .map(|d| DestinationLine {
                    pending: d.stats.pending,
                    held: d.stats.held,
                    sent: d.stats.sent,
                    dead: d.stats.dead,
                    lag_ms: millis(d.stats.oldest_unsent_age()),
                    destination: d.destination,
                })
                .collect();
            Some(OutboxLine {
                pending: s.pending,
                held: s.held,
                sent: s.sent,
                dead: s.dead,
                lag_ms: millis(s.oldest_unsent_age()),
                destinations,
            })
        }
        None => None,
    };
    Ok(Overview {
        store: store.to_owned(),
        now: stats.now.as_millis(),
        consumers,
        oldest_lease,
        outbox,
        last_purge,
        counts_source: source.as_str(),
        counts_hint,
    })
}

/// The failure group a record belongs to: its id, kind and first line (`None`: the record
/// holds no failure).
pub fn failure_group_of(r: &Record) -> Option<(String, String, String, Timestamp)> {
    let g = dedup_core::admin::failure_group(r)?;
    Some((g.id, g.kind, g.first_line, g.at))
}

/// Failed and dead-lettered records, grouped. `keys_per_group` keys kept in each.
pub async fn failures(
    admin: &dyn Admin,
    config: &ConsoleConfig,
    keys_per_group: usize,
) -> Result<(Failures, Vec<(String, Vec<Record>)>)> {
    let now = admin.now().await?;
    let (records, truncated) = scan(
        admin,
        &[Status::Failed, Status::DeadLettered],
        config.scan_limit,
    )
    .await?;
    let scanned = records.len();
    let mut groups: BTreeMap<String, (FailureGroup, Vec<Record>)> = BTreeMap::new();
    for r in records {
        let Some((id, kind, line, at)) = failure_group_of(&r) else {
            continue;
        };
        let (g, members) = groups.entry(id.clone()).or_insert_with(|| {
            (
                FailureGroup {
                    id,
                    kind,
                    first_line: line,
                    count: 0,
                    first_seen: at.as_millis(),
                    last_seen: at.as_millis(),
                    keys: Vec::new(),
                },
                Vec::new(),
            )
        });
        g.count += 1;
        g.first_seen = g.first_seen.min(at.as_millis());
        g.last_seen = g.last_seen.max(at.as_millis());
        if g.keys.len() < keys_per_group {
            g.keys.push(key_line(&r, now, at));
        }
        members.push(r);
    }
    let mut list: Vec<(FailureGroup, Vec<Record>)> = groups.into_values().collect();
    list.sort_by(|a, b| {
        b.0.count
            .cmp(&a.0.count)
            .then_with(|| a.0.first_line.cmp(&b.0.first_line))
    });
    let members = list
        .iter()
        .map(|(g, m)| (g.id.clone(), m.clone()))
        .collect();
    Ok((
        Failures {
            scanned,
            truncated,
            groups: list.into_iter().map(|(g, _)| g).collect(),
        },
        members,
    ))
}

/// One key in full (`None`: no record).
pub async fn key_detail(admin: &dyn Admin, key: &Key) -> Result<Option<KeyDetail>> {
    let now = admin.now().await?;
    let Some(r) = admin.get(key).await? else {
        return Ok(None);
    };
    let (expires_at, processed_at, outcome_len) = match &r.state {
        RecordState::InFlight { expires_at, .. } => (Some(expires_at.as_millis()), None, None),
        RecordState::Completed {
            processed_at,
            outcome,
            ..
        } => (
            None,
            Some(processed_at.as_millis()),
            outcome.as_ref().map(Vec::len),
        ),
    };
    Ok(Some(KeyDetail {
        consumer: r.key.consumer().to_owned(),
        message_id: r.key.message_id().to_owned(),
        status: Status::of(&r, now).as_str(),
        attempt: r.attempt,
        fence: r.fence,
        first_claimed_at: r.first_claimed_at.map(Timestamp::as_millis),
        expires_at,
        processed_at,
        outcome_len,
        failure: r.failure().map(|f| FailureDetail {
            kind: f.kind,
            chain: f.chain,
            at: f.at.as_millis(),
            attempt: f.attempt,
            worker: f.worker,
        }),
    }))
}

/// Why `r` is stuck at `now` with threshold `older_than` (`None`: it is not): its lease
/// expired at least `older_than` ago and nobody took it over (`expired`), or it was first
/// claimed at least `older_than` ago (`held-too-long`; only where the store keeps the first
/// claim time, not on Redis). A zero threshold shows every in-flight record.
pub fn stuck_reason(r: &Record, now: Timestamp, older_than: Duration) -> Option<&'static str> {
    let RecordState::InFlight { expires_at, .. } = &r.state else {
        return None;
    };
    let expired = *expires_at <= now;
    if older_than.is_zero() {
        return Some(if expired { "expired" } else { "in-flight" });
    }
    if expired && now.since(*expires_at) >= older_than {
        return Some("expired");
    }
    match r.first_claimed_at {
        Some(first) if now.since(first) >= older_than => Some("held-too-long"),
        _ => None,
    }
}

/// In-flight records stuck past `older_than`: at most `page` of them.
pub async fn stuck(
    admin: &dyn Admin,
    config: &ConsoleConfig,
    older_than: Duration,
    page: usize,
) -> Result<Stuck> {
    let now = admin.now().await?;
    let (records, truncated) = scan(
        admin,
        &[Status::InFlight, Status::Expired],
        config.scan_limit,
    )
    .await?;
    let scanned = records.len();
    let mut leases = Vec::new();
    for r in &records {
        if leases.len() >= page {
            break;
        }
        if let Some(why) = stuck_reason(r, now, older_than) {
            let expires_at = match &r.state {
                RecordState::InFlight { expires_at, .. } => *expires_at,
                RecordState::Completed { processed_at, .. } => *processed_at,
            };
            leases.push(StuckLine {
                key: key_line(r, now, expires_at),
                first_claimed_at: r.first_claimed_at.map(Timestamp::as_millis),
                why,
                last_worker: r.last_failure.as_ref().and_then(|f| f.worker.clone()),
            });
        }
    }
    Ok(Stuck {
        older_than_ms: older_than.as_millis() as u64,
        scanned,
        truncated,
        leases,
    })
}

/// Dead outbox rows, at most `limit`, and whether more remain.
pub async fn dead_rows(outbox: &dyn OutboxStore, limit: usize) -> Result<(Vec<OutboxEntry>, bool)> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        if out.len() >= limit {
            return Ok((out, true));
        }
        let want = BATCH.min(limit - out.len());
        let page = outbox
            .list(&OutboxQuery {
                state: Some(OutboxState::Dead),
                destination: None,
                after_id: after,
                limit: want,
            })
            .await?;
        let full = page.len() == want;
        after = page.last().map(|e| e.row.id);
        out.extend(page);
        if !full {
            return Ok((out, false));
        }
    }
}

/// The group id of a dead row.
pub fn dead_group_of(e: &OutboxEntry) -> (String, String) {
    let line = first_line(e.last_error.as_deref().unwrap_or("(no error kept)"));
    (group_id(&["outbox", &line]), line)
}

/// Dead rows grouped by the first line of their last error, `page` rows kept per group.
pub async fn dead_groups(
    outbox: &dyn OutboxStore,
    config: &ConsoleConfig,
    page: usize,
) -> Result<DeadRows> {
    let (rows, truncated) = dead_rows(outbox, config.scan_limit).await?;
    let scanned = rows.len();
    let mut groups: BTreeMap<String, DeadGroup> = BTreeMap::new();
    for e in rows {
        let (id, line) = dead_group_of(&e);
        let g = groups.entry(id.clone()).or_insert_with(|| DeadGroup {
            id,
            first_line: line,
            count: 0,
            rows: Vec::new(),
        });
        g.count += 1;
        if g.rows.len() < page {
            g.rows.push(DeadRow {
                id: e.row.id,
                destination: e.row.destination,
                message_id: e.row.message_id,
                payload_len: e.row.payload.len(),
                headers: e.row.headers,
                attempts: e.row.attempts,
                written_at: e.row.written_at.as_millis(),
                last_error: e.last_error,
            });
        }
    }
    let mut groups: Vec<DeadGroup> = groups.into_values().collect();
    groups.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.first_line.cmp(&b.first_line))
    });
    Ok(DeadRows {
        scanned,
        truncated,
        groups,
    })
}
