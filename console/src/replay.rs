//! The replay actions: a key's dead-lettered copy (`replay`), or a failure group's
//! (`replay-group`), put back where it came from by
//! [`dedup_brokers::replay::replay`] with [`Pick::Ids`]. They go through the confirmation
//! page, guard and metrics of every action ([`actions`](crate::actions)).

use std::collections::{BTreeMap, BTreeSet};

use dedup_brokers::replay::{Pick, ReplayReport};
use dedup_core::{Key, Record};

use crate::actions::{changed, count, group_records};
use crate::gather::failure_group_of;
use crate::html::{esc, qs};
use crate::message;
use crate::model::{FailureGroup, KeyDetail};
use crate::pages::action_button;
use crate::problem::Problem;
use crate::state::Inner;

/// The key page's "Replay" button: for a dead-lettered key whose consumer's dead letters
/// the console knows.
pub(crate) fn key_button(inner: &Inner, d: &KeyDetail) -> String {
    if d.status != "dead-letter" || !inner.dead.urls.contains_key(&d.consumer) {
        return String::new();
    }
    let params = format!(
        "consumer={}&id={}&fence={}",
        qs(&d.consumer),
        qs(&d.message_id),
        d.fence
    );
    action_button(inner, "replay", &params, "Replay this message")
}

/// The failure group's "Replay group" button, when the console knows some dead letters.
pub(crate) fn group_button(inner: &Inner, g: &FailureGroup) -> String {
    if inner.dead.urls.is_empty() {
        return String::new();
    }
    let params = format!("id={}", qs(&g.id));
    action_button(inner, "replay-group", &params, "Replay group")
}

/// Where `consumer`'s dead letters are, for the confirmation page (password removed).
fn where_dead(inner: &Inner, consumer: &str) -> String {
    match inner.dead.urls.get(consumer) {
        Some(url) => format!(
            "its copy among the dead letters at <code>{}</code>",
            esc(&dedup_core::backend::url::redact(url))
        ),
        None => "no dead letters are known for its consumer: nothing will be done".to_owned(),
    }
}

/// What `replay` will do, before it runs.
pub(crate) fn preview_key(inner: &Inner, key: &Key, fence: u64) -> String {
    format!(
        "Replay <strong>{}</strong> of <em>{}</em> (fence {fence}): {} is republished to \
         where it came from, with its message id, and settled once the broker confirms. \
         The key is forgotten first; a key processed since is not run again.",
        esc(key.message_id()),
        esc(key.consumer()),
        where_dead(inner, key.consumer())
    )
}

/// What `replay-group` will do, before it runs.
pub(crate) async fn preview_group(inner: &Inner, id: &str) -> Result<String, Problem> {
    let records = group_records(inner, id).await?;
    let (kind, line) = match records.first().and_then(failure_group_of) {
        Some((_, kind, line, _)) => (kind, line),
        None => (String::new(), id.to_owned()),
    };
    let by_consumer = by_consumer(records);
    let mut b = String::new();
    for (consumer, ids) in &by_consumer {
        let shown: Vec<String> = ids.iter().take(10).map(|i| esc(i)).collect();
        b.push_str(&format!(
            "<li><em>{}</em>: {} keys ({}{}): {}</li>",
            esc(consumer),
            ids.len(),
            shown.join(", "),
            if ids.len() > shown.len() { ", ..." } else { "" },
            where_dead(inner, consumer)
        ));
    }
    Ok(format!(
        "Replay the dead-lettered copies of the group <em>{}</em>: each is republished to \
         where it came from, with its message id, and settled once the broker confirms. \
         Each key is forgotten first; a key processed since is not run again.</p><ul>{b}</ul><p>",
        esc(&format!("{kind}: {line}"))
    ))
}

/// The message ids of `records`, by consumer.
fn by_consumer(records: Vec<Record>) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_consumer: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in records {
        by_consumer
            .entry(r.key.consumer().to_owned())
            .or_default()
            .insert(r.key.message_id().to_owned());
    }
    by_consumer
}

/// What one consumer's replay did, or why it could not run.
struct Outcome {
    consumer: String,
    picked: BTreeSet<String>,
    report: ReplayReport,
    unread: Option<String>,
}

impl Outcome {
    /// The picked ids the replay did not come across.
    fn missing(&self) -> Vec<&str> {
        let r = &self.report;
        let seen: BTreeSet<&str> = r
            .replayed
            .iter()
            .chain(&r.already_processed)
            .chain(r.left.iter().map(|(id, _)| id))
            .map(String::as_str)
            .collect();
        self.picked
            .iter()
            .map(String::as_str)
            .filter(|id| !seen.contains(id))
            .collect()
    }

    /// The outcome in words.
    fn words(&self) -> String {
        let c = &self.consumer;
        if let Some(why) = &self.unread {
            return format!("Nothing replayed for {c}: {why}.");
        }
        let r = &self.report;
        let mut out = format!("Replayed {} of {c}", r.replayed.len());
        if !r.replayed.is_empty() {
            out.push_str(&format!(" ({})", r.replayed.join(", ")));
        }
        out.push('.');
        if !r.already_processed.is_empty() {
            out.push_str(&format!(
                " Already processed, copy settled, not republished: {}.",
                r.already_processed.join(", ")
            ));
        }
        for (id, why) in &r.left {
            out.push_str(&format!(" Left among the dead letters: {id} ({why})."));
        }
        let missing = self.missing();
        if !missing.is_empty() {
            out.push_str(&format!(
                " No copy found among the dead letters read: {}.",
                missing.join(", ")
            ));
        }
        out
    }
}

/// Replays `ids` of `consumer` from its dead letters.
async fn replay_ids(
    inner: &Inner,
    consumer: &str,
    ids: BTreeSet<String>,
) -> Result<Outcome, Problem> {
    let mut outcome = Outcome {
        consumer: consumer.to_owned(),
        picked: ids.clone(),
        report: ReplayReport::default(),
        unread: None,
    };
    let mut dead = match message::open(inner, consumer).await {
        Ok(dead) => dead,
        Err((_, why)) => {
            outcome.unread = Some(why);
            return Ok(outcome);
        }
    };
    let pick = Pick::Ids(ids);
    let max_read = inner.config.scan_limit;
    let admin = inner.admin.as_ref();
    match dedup_brokers::replay::replay(dead.as_mut(), admin, consumer, &pick, max_read).await {
        Ok(report) => {
            tracing::info!(consumer, report = ?report, "dedup console: replay");
            outcome.report = report;
            Ok(outcome)
        }
        Err(e) => {
            tracing::error!(consumer, done = ?e.done, error = %dedup_core::error_chain(&e), "dedup console: replay stopped");
            outcome.report = e.done.clone();
            Err(Problem::Broker(format!(
                "{}. Done before: {}",
                dedup_core::error_chain(&e),
                outcome.words()
            )))
        }
    }
}

/// Counts `outcomes` under `action`, and gives the answer: copies replayed, and the words.
fn answer(action: &'static str, outcomes: &[Outcome]) -> (u64, String) {
    let replayed: usize = outcomes.iter().map(|o| o.report.replayed.len()).sum();
    let left: usize = outcomes
        .iter()
        .map(|o| o.report.left.len() + o.missing().len())
        .sum();
    count(action, "done", replayed as u64);
    if left > 0 {
        count(action, "left", left as u64);
    }
    let words: Vec<String> = outcomes.iter().map(Outcome::words).collect();
    (replayed as u64, words.join(" "))
}

/// `replay`: one key, its fence as the operator saw it.
pub(crate) async fn run_key(inner: &Inner, key: &Key, seen: u64) -> Result<(u64, String), Problem> {
    let record = inner
        .admin
        .get(key)
        .await
        .map_err(Problem::store("reading the key"))?;
    if let Some(r) = record
        && r.fence != seen
    {
        return Err(changed("replay", key, seen, r.fence));
    }
    let ids = BTreeSet::from([key.message_id().to_owned()]);
    let outcome = replay_ids(inner, key.consumer(), ids).await?;
    Ok(answer("replay", &[outcome]))
}

/// `replay-group`: the keys of failure group `id`, read again at the time of the click.
pub(crate) async fn run_group(inner: &Inner, id: &str) -> Result<(u64, String), Problem> {
    let mut outcomes = Vec::new();
    for (consumer, ids) in by_consumer(group_records(inner, id).await?) {
        match replay_ids(inner, &consumer, ids).await {
            Ok(o) => outcomes.push(o),
            // What the consumers before did is said too.
            Err(Problem::Broker(why)) => {
                let (_, before) = answer("replay-group", &outcomes);
                return Err(Problem::Broker(format!("{before} {why}")));
            }
            Err(other) => return Err(other),
        }
    }
    tracing::info!(group = %id, "dedup console: replay group");
    Ok(answer("replay-group", &outcomes))
}
