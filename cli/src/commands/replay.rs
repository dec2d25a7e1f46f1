//! `dedup replay`: put a consumer's dead-lettered messages back where they came from, after
//! the fix, each run once. The steps are [`dedup_brokers::replay::replay`]'s: a key processed
//! since is settled and not run again; a failed or dead-lettered key is forgotten, its copy
//! republished with its message id and settled once the broker confirms.

use std::collections::BTreeSet;

use dedup_brokers::BrokerError;
use dedup_brokers::replay::{self, Pick, ReplayReport};
use dedup_core::backend::url::redact;
use dedup_core::{Admin, ListFilter, Status};
use serde_json::json;

use crate::StoreArgs;
use crate::failure::Failure;
use crate::open::{Access, Opened, open};
use crate::render::print;
use crate::screen::line;

use super::key;

/// Records read per `list` call when picking a failure group.
const PAGE: usize = 1000;

/// What the operator asked for.
pub(crate) struct ReplayArgs {
    /// The dead letters' URL (`replay::open`'s grammar).
    pub(crate) dead_letters: String,
    /// The consumer whose copies to replay.
    pub(crate) consumer: String,
    /// `--id`s (empty: `--group` or `--all`).
    pub(crate) ids: Vec<String>,
    /// `--group`.
    pub(crate) group: Option<String>,
    /// `--all`.
    pub(crate) all: bool,
    /// `--dry-run`.
    pub(crate) dry_run: bool,
    /// `--max-read`.
    pub(crate) max_read: usize,
}

/// Replay what `a` picks; exit code 4 when picked copies were left.
pub(super) async fn run(args: &StoreArgs, as_json: bool, a: ReplayArgs) -> Result<(), Failure> {
    let access = if a.dry_run {
        Access::Read
    } else {
        Access::Write
    };
    let Opened { store, .. } = open(args, access).await?;
    let pick = pick(&*store, &a).await?;
    let mut dead = replay::open(&a.dead_letters)
        .await
        .map_err(|e| broker_failure(&a.dead_letters, e))?;
    let place = dead.describe();
    let dry = a.dry_run;
    let report = if dry {
        let done = replay::plan(&mut *dead, &*store, &a.consumer, &pick, a.max_read).await;
        done.map_err(|e| {
            Failure::new(format!("the dry run of {}'s replay stopped", a.consumer))
                .cause(e)
                .hint("nothing was replayed; run it again")
        })?
    } else {
        let done = replay::replay(&mut *dead, &*store, &a.consumer, &pick, a.max_read).await;
        done.map_err(|e| {
            Failure::new(format!("the replay of {} stopped", a.consumer))
                .cause(e)
                .hint("run it again: what was replayed is settled, the rest is still there")
        })?
    };
    let missing = missing(&pick, &report);
    let json = json!({
        "consumer": a.consumer,
        "dead_letters": place,
        "dry_run": dry,
        "replayed": report.replayed,
        "already_processed": report.already_processed,
        "left": report.left.iter().map(|(id, why)| json!({"id": id, "why": why})).collect::<Vec<_>>(),
        "missing": missing,
        "not_picked": report.not_picked,
    });
    print(as_json, json, || {
        words(&a.consumer, &place, dry, &report, &missing)
    });
    if report.left.is_empty() && missing.is_empty() {
        return Ok(());
    }
    Err(Failure::left(format!(
        "{} picked message(s) were not replayed",
        report.left.len() + missing.len()
    ))
    .hint(
        "a key in flight is left: run the replay again once its delivery settles; a missing \
         id has no copy among these dead letters (check --dead-letters and the id)",
    ))
}

/// The ids `a` picks: `--id`s, the keys of `--group`, or all.
async fn pick(store: &dyn Admin, a: &ReplayArgs) -> Result<Pick, Failure> {
    if a.all {
        return Ok(Pick::All);
    }
    if let Some(group) = &a.group {
        let ids = group_ids(store, &a.consumer, group).await?;
        if ids.is_empty() {
            return Err(Failure::not_found(format!(
                "no failed or dead-lettered key of {} in failure group {group}",
                a.consumer
            ))
            .hint("the console and `dedup list --state dead-letter` show the groups' keys"));
        }
        return Ok(Pick::Ids(ids));
    }
    for id in &a.ids {
        key(&a.consumer, id)?;
    }
    Ok(Pick::Ids(a.ids.iter().cloned().collect()))
}

/// The failed and dead-lettered keys of `consumer` whose failure group is `group`.
async fn group_ids(
    store: &dyn Admin,
    consumer: &str,
    group: &str,
) -> Result<BTreeSet<String>, Failure> {
    let mut ids = BTreeSet::new();
    for status in [Status::Failed, Status::DeadLettered] {
        let mut filter = ListFilter::consumer(consumer).limit(PAGE);
        filter.status = Some(status);
        loop {
            let page = store
                .list(&filter)
                .await
                .map_err(|e| Failure::store("cannot list the failed keys", e))?;
            for r in &page {
                if dedup_core::admin::failure_group(r).is_some_and(|g| g.id == group) {
                    ids.insert(r.key.message_id().to_owned());
                }
            }
            match page.last() {
                Some(last) if page.len() == PAGE => {
                    filter.after = Some(last.key.message_id().to_owned());
                }
                _ => break,
            }
        }
    }
    Ok(ids)
}

/// The picked ids the replay did not come across among the dead letters.
fn missing(pick: &Pick, report: &ReplayReport) -> Vec<String> {
    let Pick::Ids(ids) = pick else {
        return Vec::new();
    };
    let seen: BTreeSet<&String> = report
        .replayed
        .iter()
        .chain(&report.already_processed)
        .chain(report.left.iter().map(|(id, _)| id))
        .collect();
    ids.iter()
        .filter(|id| !seen.contains(id))
        .cloned()
        .collect()
}

/// The report for people.
fn words(consumer: &str, place: &str, dry: bool, r: &ReplayReport, missing: &[String]) -> String {
    let verb = if dry { "would replay" } else { "replayed" };
    let mut out = vec![format!(
        "{verb} {} of {} from {}{}",
        r.replayed.len(),
        line(consumer),
        line(place),
        list(&r.replayed)
    )];
    if !r.already_processed.is_empty() {
        out.push(format!(
            "already processed, {} settled and not run again: {}{}",
            if dry { "would be" } else { "copies" },
            r.already_processed.len(),
            list(&r.already_processed)
        ));
    }
    for (id, why) in &r.left {
        out.push(format!("left {}: {}", line(id), line(why)));
    }
    if !missing.is_empty() {
        out.push(format!(
            "not among the dead letters: {}{}",
            missing.len(),
            list(missing)
        ));
    }
    out.push(format!("copies not picked (untouched): {}", r.not_picked));
    out.join("\n")
}

/// ` (a, b, c)` for a few ids, nothing for none.
fn list(ids: &[String]) -> String {
    if ids.is_empty() {
        return String::new();
    }
    let shown: Vec<String> = ids.iter().take(20).map(|i| line(i).into_owned()).collect();
    let more = if ids.len() > shown.len() { ", ..." } else { "" };
    format!(" ({}{more})", shown.join(", "))
}

/// The broker failed (or the URL is wrong): exit code 2 for a URL no broker opens, 1
/// otherwise.
fn broker_failure(url: &str, e: BrokerError) -> Failure {
    let doing = format!("cannot read the dead letters at {}", redact(url));
    match e {
        BrokerError::Config(_) => Failure::usage(doing).cause(e).hint(
            "--dead-letters takes amqp://...?queue=, redis://...?stream=, nats://...?stream=, \
             kafka://HOST:PORT?topic= or pubsub://PROJECT?subscription=",
        ),
        e => Failure::new(doing)
            .cause(e)
            .hint("check that the broker is up and the URL's credentials"),
    }
}
