//! The commands: each opens the store, does one thing, and prints it for people or as JSON.

use std::io::IsTerminal;
use std::time::Duration;

use dedup_core::parse_duration;
use dedup_core::{Forgot, Key, ListFilter, PurgeOptions, PurgeRun, Released, Status, Timestamp};
use serde_json::{Value, json};

use crate::failure::Failure;
use crate::open::{Access, Opened, open};
use crate::render::{bytes, print, record_json, record_text, span, summary_json, utc, when};
use crate::screen::line;
use crate::{Cli, Command};

/// The key the operator typed.
fn key(consumer: &str, message_id: &str) -> Result<Key, Failure> {
    Key::new(consumer, message_id).map_err(|e| Failure::store("invalid key", e))
}

/// The store's "now" (relative times are shown against it).
async fn now(store: &dyn dedup_core::Admin) -> Result<dedup_core::Timestamp, Failure> {
    store
        .now()
        .await
        .map_err(|e| Failure::store("cannot read the store's clock", e))
}

/// Run the command `cli` names.
pub(crate) async fn run(cli: Cli) -> Result<(), Failure> {
    let as_json = cli.json;
    if let Command::Outbox { command } = cli.command {
        return crate::outbox::run(&cli.store, as_json, command).await;
    }
    if let Command::Counts { command } = cli.command {
        return crate::counts::run(&cli.store, as_json, command).await;
    }
    if let Command::Console {
        outbox,
        listen,
        allow_writes,
        token,
        stuck_after,
    } = cli.command
    {
        let args = crate::console::ConsoleArgs {
            outbox,
            listen,
            allow_writes,
            token,
            stuck_after,
        };
        return crate::console::run(&cli.store, args).await;
    }
    let access = match &cli.command {
        Command::Outbox { .. } | Command::Console { .. } | Command::Counts { .. } => {
            unreachable!("handled above")
        }
        Command::Migrate => Access::Migrate,
        Command::Stats { .. }
        | Command::Consumers
        | Command::Inspect { .. }
        | Command::List { .. } => Access::Read,
        Command::Purge { dry_run: true, .. } => Access::Read,
        Command::Purge { .. } | Command::Release { .. } | Command::Forget { .. } => Access::Write,
    };
    // Arguments are checked before the store is opened: a usage error never waits on a
    // connection, and is reported as one (exit code 2).
    let purge_options = match &cli.command {
        Command::Purge {
            older_than,
            batch,
            unpaced,
            ..
        } => Some(purge_options(older_than, *batch, *unpaced)?),
        _ => None,
    };
    let Opened {
        store,
        backend,
        location,
        has_schema,
    } = open(&cli.store, access).await?;
    match cli.command {
        Command::Migrate => {
            let what = if has_schema {
                "schema created or already up to date"
            } else {
                "nothing to migrate: this store keeps no schema"
            };
            print(
                as_json,
                json!({ "backend": backend, "location": location, "migrated": true }),
                || format!("{backend} store, {location}: {what}"),
            );
        }
        Command::Stats { top } => {
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
        }
        Command::Inspect {
            consumer,
            message_id,
        } => {
            let key = key(&consumer, &message_id)?;
            let now = now(&*store).await?;
            let record = store
                .get(&key)
                .await
                .map_err(|e| Failure::store(format!("cannot read the record of {key}"), e))?
                .ok_or_else(|| {
                    Failure::not_found(format!("no record for {key}")).hint(
                        "the message was never claimed by this consumer, or its record was purged \
                         (the store's consumers: `dedup consumers`)",
                    )
                })?;
            print(as_json, record_json(&record, now), || {
                record_text(&record, now)
            });
        }
        Command::Consumers => {
            let consumers = store
                .consumers()
                .await
                .map_err(|e| Failure::store("cannot count the store's consumers", e))?;
            let json = json!({
                "consumers": consumers.iter().map(|c| {
                    let mut counts = serde_json::Map::new();
                    for status in Status::ALL {
                        counts.insert(status.as_str().to_owned(), json!(c.counts.count(status)));
                    }
                    json!({ "consumer": c.consumer, "counts": counts, "total": c.counts.total() })
                }).collect::<Vec<_>>(),
            });
            print(as_json, json, || {
                let mut out = vec![format!(
                    "{:<24} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9}",
                    "consumer",
                    "in-flight",
                    "expired",
                    "processed",
                    "failed",
                    "dead-letter",
                    "total"
                )];
                for c in &consumers {
                    let n = |s| c.counts.count(s);
                    out.push(format!(
                        "{:<24} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9}",
                        line(&c.consumer),
                        n(Status::InFlight),
                        n(Status::Expired),
                        n(Status::Completed),
                        n(Status::Failed),
                        n(Status::DeadLettered),
                        c.counts.total()
                    ));
                }
                if consumers.is_empty() {
                    out.push("no records in this store".into());
                }
                out.join("\n")
            });
        }
        Command::List {
            consumer,
            consumer_option,
            state,
            limit,
            after,
        } => {
            let consumer = consumer.or(consumer_option).unwrap_or_default();
            let mut filter = ListFilter::consumer(consumer).limit(limit);
            filter.status = state.map(Into::into);
            filter.after = after;
            let now = now(&*store).await?;
            let records = store
                .list(&filter)
                .await
                .map_err(|e| Failure::store("cannot list records", e))?;
            let next = match records.len() == filter.limit {
                true => records.last().map(|r| r.key.message_id().to_owned()),
                false => None,
            };
            let json = json!({
                "records": records.iter().map(|r| record_json(r, now)).collect::<Vec<_>>(),
                "next_after": next,
            });
            print(as_json, json, || {
                let mut out: Vec<String> = records
                    .iter()
                    .map(|r| {
                        let status = dedup_core::Status::of(r, now);
                        let at = match &r.state {
                            dedup_core::RecordState::InFlight { expires_at, .. }
                                if status == dedup_core::Status::InFlight =>
                            {
                                format!("expires {}", when(*expires_at, now))
                            }
                            dedup_core::RecordState::InFlight { expires_at, .. } => {
                                format!("expired {}", when(*expires_at, now))
                            }
                            dedup_core::RecordState::Completed { processed_at, .. } => {
                                let verb = match status {
                                    dedup_core::Status::DeadLettered => "dead-lettered",
                                    dedup_core::Status::Failed => "failed",
                                    _ => "processed",
                                };
                                format!("{verb} {}", when(*processed_at, now))
                            }
                        };
                        let cause = crate::render::short_cause(r)
                            .map(|c| format!(": {c}"))
                            .unwrap_or_default();
                        format!(
                            "{:<24} {:<11} attempt {:<3} fence {:<3} {at}{cause}",
                            line(r.key.message_id()),
                            status.as_str(),
                            r.attempt,
                            r.fence
                        )
                    })
                    .collect();
                if out.is_empty() {
                    out.push(format!(
                        "no records for consumer {}",
                        line(&filter.consumer)
                    ));
                }
                if let Some(next) = &next {
                    out.push(format!("(more: --after {})", line(next)));
                }
                out.join("\n")
            });
        }
        Command::Purge {
            older_than,
            dry_run,
            ..
        } => {
            let options = purge_options.expect("checked above");
            purge(&*store, &older_than, options, dry_run, as_json).await?;
        }
        Command::Release {
            consumer,
            message_id,
            force,
        } => {
            let key = key(&consumer, &message_id)?;
            let released = store
                .release_key(&key, force)
                .await
                .map_err(|e| Failure::store(format!("cannot release {key}"), e))?;
            match released {
                Released::Released {
                    fence,
                    attempt,
                    was_live,
                } => print(
                    as_json,
                    json!({
                        "consumer": key.consumer(),
                        "message_id": key.message_id(),
                        "released": true,
                        "fence": fence,
                        "attempt": attempt,
                        "was_live": was_live,
                    }),
                    || {
                        format!(
                            "released {} (fence {fence}, attempt {attempt}{}): the next \
                             delivery takes it over with fence {}",
                            line(&key.to_string()),
                            if was_live { ", lease was live" } else { "" },
                            fence + 1
                        )
                    },
                ),
                Released::LiveLease {
                    expires_at,
                    attempt,
                } => {
                    return Err(Failure::new(format!(
                        "{key} is held by a live lease (attempt {attempt}, expires {})",
                        utc(expires_at)
                    ))
                    .hint(
                        "wait for it to expire, or pass --force if its worker is stuck \
                         (that worker then gets LeaseLost at once)",
                    ));
                }
                Released::Completed { processed_at } => {
                    return Err(Failure::new(format!(
                        "{key} is completed (processed {}): there is no lease to release",
                        utc(processed_at)
                    ))
                    .hint(format!(
                        "a completed message is not processed again; to let it run once more \
                         (a dead-lettered message, after the fix), remove its record: \
                         `dedup forget {} {}`",
                        key.consumer(),
                        key.message_id()
                    )));
                }
                Released::NotFound => {
                    return Err(Failure::not_found(format!("no record for {key}"))
                        .hint("check the consumer with `dedup consumers` and the message id with `dedup list --consumer`"));
                }
            }
        }
        Command::Forget {
            consumer,
            message_id,
            force,
        } => {
            let key = key(&consumer, &message_id)?;
            let forgot = store
                .forget(&key, force)
                .await
                .map_err(|e| Failure::store(format!("cannot forget {key}"), e))?;
            forget_answer(&key, forgot, as_json)?;
        }
        Command::Outbox { .. } | Command::Console { .. } | Command::Counts { .. } => {
            unreachable!("handled above")
        }
    }
    Ok(())
}

/// Print what `dedup forget` did, or the failure it is.
fn forget_answer(key: &Key, forgot: Forgot, as_json: bool) -> Result<(), Failure> {
    match forgot {
        Forgot::Forgot {
            status,
            fence,
            attempt,
        } => {
            print(
                as_json,
                json!({
                    "consumer": key.consumer(),
                    "message_id": key.message_id(),
                    "forgot": true,
                    "status": status.as_str(),
                    "fence": fence,
                    "attempt": attempt,
                }),
                || {
                    let state = match status {
                        // The attempt that found none left is the record's attempt number.
                        Status::DeadLettered => format!(
                            "dead-lettered after {} attempts",
                            attempt.saturating_sub(1)
                        ),
                        other => other.as_str().to_owned(),
                    };
                    format!(
                        "forgot {} ({state}, fence {fence}, attempt {attempt}): the next delivery \
                         is processed as new, with fence 1{}",
                        line(&key.to_string()),
                        if status == Status::InFlight {
                            "; the worker that held it gets LeaseLost"
                        } else {
                            ""
                        }
                    )
                },
            );
            Ok(())
        }
        Forgot::LiveLease {
            expires_at,
            attempt,
        } => Err(Failure::new(format!(
            "{key} is held by a live lease (attempt {attempt}, expires {}): not forgotten",
            utc(expires_at)
        ))
        .hint(
            "wait for it to expire, or pass --force if its worker is stuck \
             (that worker then gets LeaseLost at once)",
        )),
        Forgot::NotFound => Err(Failure::not_found(format!("no record for {key}"))
            .hint("check the consumer with `dedup consumers` and the message id with `dedup list --consumer`")),
    }
}

/// The purge the arguments ask for, checked.
fn purge_options(older_than: &str, batch: usize, unpaced: bool) -> Result<PurgeOptions, Failure> {
    let retention =
        parse_duration(older_than).map_err(|e| Failure::store("invalid --older-than", e))?;
    let mut options = PurgeOptions::older_than(retention).batch_size(batch);
    if unpaced {
        options = options.unpaced();
    }
    options
        .validate()
        .map_err(|e| Failure::store("invalid purge options", e))?;
    Ok(options)
}

/// `dedup purge`: the dry run's count, then (unless `dry_run`) the purge, with a spinner
/// on a terminal and plain lines otherwise.
async fn purge(
    store: &dyn dedup_core::Admin,
    older_than: &str,
    options: PurgeOptions,
    dry_run: bool,
    as_json: bool,
) -> Result<(), Failure> {
    let count = store
        .count_purgeable(options.retention)
        .await
        .map_err(|e| Failure::store("cannot count purgeable records", e))?;
    if dry_run {
        print(
            as_json,
            json!({
                "dry_run": true,
                "older_than": older_than,
                "completed": count.completed,
                "expired": count.expired,
                "total": count.total(),
            }),
            || {
                format!(
                    "dry run: would remove {} records older than {older_than} ({} completed, {} \
                     expired leases)",
                    count.total(),
                    count.completed,
                    count.expired
                )
            },
        );
        return Ok(());
    }
    let terminal = !as_json && std::io::stderr().is_terminal();
    let start = format!(
        "purging records older than {older_than}: {} to remove ({} completed, {} expired), {}",
        count.total(),
        count.completed,
        count.expired,
        if options.pace == dedup_core::Pace::Unpaced {
            "unpaced"
        } else {
            "paced"
        }
    );
    let spinner = if terminal {
        let bar = indicatif::ProgressBar::new_spinner().with_message(start);
        bar.enable_steady_tick(Duration::from_millis(120));
        Some(bar)
    } else {
        if !as_json {
            eprintln!("{start}");
        }
        None
    };
    let result = store.purge(&options).await;
    if let Some(bar) = &spinner {
        bar.finish_and_clear();
    }
    let report = result.map_err(|e| Failure::store("the purge failed", e))?;
    print(
        as_json,
        json!({
            "dry_run": false,
            "older_than": older_than,
            "completed": report.completed,
            "expired": report.expired,
            "total": report.total(),
            "batches": report.batches,
            "elapsed_ms": report.elapsed.as_millis() as u64,
        }),
        || {
            format!(
                "removed {} records ({} completed, {} expired leases) in {} batch{}, {}",
                report.total(),
                report.completed,
                report.expired,
                report.batches,
                if report.batches == 1 { "" } else { "es" },
                span(report.elapsed)
            )
        },
    );
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
