//! The HTML of each view. Every text from the store (keys, errors, headers, destinations)
//! goes through [`esc`]; every value in a link through [`qs`] then [`esc`].

use std::fmt::Write;
use std::time::Duration;

use dedup_core::{Record, Timestamp};

use crate::gather::{failure_group_of, key_line};
use crate::html::{age, esc, qs, time};
use crate::model::*;
use crate::state::Inner;

fn t(ms: i64) -> String {
    time(Timestamp::from_millis(ms))
}

fn key_link(inner: &Inner, consumer: &str, id: &str) -> String {
    format!(
        "<a href=\"{}/key?consumer={}&amp;id={}\">{}</a>",
        esc(&inner.config.base_path),
        esc(&qs(consumer)),
        esc(&qs(id)),
        esc(id)
    )
}

/// A button to the confirmation page of `action` with `params` (already query-encoded).
pub(crate) fn action_button(inner: &Inner, action: &str, params: &str, label: &str) -> String {
    if !inner.config.allow_writes {
        return String::new();
    }
    format!(
        "<a class=action href=\"{}/confirm/{action}?{}\"><button type=button>{}</button></a>",
        esc(&inner.config.base_path),
        esc(params),
        esc(label)
    )
}

fn n(v: impl std::fmt::Display) -> String {
    format!("<td class=n>{v}</td>")
}

/// The overview.
pub fn overview(inner: &Inner, o: &Overview) -> String {
    let mut b = String::new();
    let now = Timestamp::from_millis(o.now);
    let source = match o.counts_source {
        "kept" => "counts kept by the store",
        _ => "counts read from every record",
    };
    let _ = write!(
        b,
        "<p class=note>as of {} UTC; <span id=counts-source>{source}</span></p>",
        t(o.now)
    );
    if let Some(hint) = &o.counts_hint {
        let _ = write!(b, "<p class=note id=counts-hint>{}</p>", esc(hint));
    }
    b.push_str(
        "<h2>Consumers</h2><table id=consumers><tr><th>consumer</th><th>processed</th>\
         <th>in flight</th><th>expired</th><th>failed</th><th>dead-lettered</th></tr>",
    );
    for c in &o.consumers {
        let _ = write!(
            b,
            "<tr data-consumer=\"{}\"><td>{}</td>{}{}{}<td class=\"n{}\">{}</td><td class=\"n{}\">{}</td></tr>",
            esc(&c.consumer),
            esc(&c.consumer),
            n(c.processed),
            n(c.in_flight),
            n(c.expired),
            if c.failed > 0 { " bad" } else { "" },
            c.failed,
            if c.dead_lettered > 0 { " bad" } else { "" },
            c.dead_lettered
        );
    }
    if o.consumers.is_empty() {
        b.push_str("<tr><td colspan=6>no records</td></tr>");
    }
    b.push_str("</table>");
    match &o.oldest_lease {
        Some(l) => {
            let _ = write!(
                b,
                "<p>Oldest live lease: {} of <em>{}</em>, attempt {}, expires {} UTC (in {})</p>",
                key_link(inner, &l.consumer, &l.message_id),
                esc(&l.consumer),
                l.attempt,
                t(l.expires_at),
                age(Timestamp::from_millis(l.expires_at).since(now))
            );
        }
        None => b.push_str("<p>No live lease.</p>"),
    }
    match &o.last_purge {
        Some(p) => {
            let _ = write!(
                b,
                "<p id=last-purge>Last purge: finished {} UTC ({} ago), removed {} in {}{}</p>",
                t(p.finished_at),
                age(now.since(Timestamp::from_millis(p.finished_at))),
                p.removed,
                age(Duration::from_millis(p.took_ms)),
                match p.stopped_early {
                    true => {
                        ", <span class=bad>stopped early at its batch limit: records it \
                         could remove are left</span>."
                    }
                    false => ", to the end.",
                }
            );
        }
        None => {
            b.push_str("<p id=last-purge class=note>No purge of this store has finished yet.</p>")
        }
    }
    b.push_str(&action_button(inner, "purge", "", "Purge now"));
    if let Some(x) = &o.outbox {
        let _ = write!(
            b,
            "<h2>Outbox</h2><table id=outbox><tr><th>pending</th><th>held</th><th>sent</th>\
             <th>dead</th><th>lag (oldest unsent)</th></tr><tr>{}{}{}<td class=\"n{}\">{}</td>{}</tr></table>",
            n(x.pending),
            n(x.held),
            n(x.sent),
            if x.dead > 0 { " bad" } else { "" },
            x.dead,
            n(age(Duration::from_millis(x.lag_ms)))
        );
        if !x.destinations.is_empty() {
            b.push_str(
                "<table id=outbox-destinations><tr><th>destination</th><th>pending</th>\
                 <th>held</th><th>sent</th><th>dead</th><th>lag (oldest unsent)</th></tr>",
            );
            for d in &x.destinations {
                let _ = write!(
                    b,
                    "<tr data-destination=\"{}\"><td>{}</td>{}{}{}<td class=\"n{}\">{}</td>{}</tr>",
                    esc(&d.destination),
                    esc(&d.destination),
                    n(d.pending),
                    n(d.held),
                    n(d.sent),
                    if d.dead > 0 { " bad" } else { "" },
                    d.dead,
                    n(age(Duration::from_millis(d.lag_ms)))
                );
            }
            b.push_str("</table>");
        }
    }
    b
}

fn scan_note(scanned: usize, truncated: bool) -> String {
    if truncated {
        format!(
            "<p class=warn>Read the first {scanned} records only (the scan limit): the groups \
             are of those.</p>"
        )
    } else {
        format!("<p class=note>{scanned} records read.</p>")
    }
}

/// Failures grouped.
pub fn failures(inner: &Inner, f: &Failures) -> String {
    let mut b = scan_note(f.scanned, f.truncated);
    if f.groups.is_empty() {
        b.push_str("<p>No failed or dead-lettered key.</p>");
    }
    for g in &f.groups {
        let _ = write!(
            b,
            "<section class=group data-group=\"{id}\"><h2><span class=bad>{kind}</span> · {line}</h2>\
             <p><strong class=count>{count}</strong> keys, first {first} UTC, last {last} UTC · \
             <a href=\"{base}/failures/group?id={id}\">all keys</a> {btn}</p><ul>",
            id = esc(&g.id),
            kind = esc(&g.kind),
            line = esc(&g.first_line),
            count = g.count,
            first = t(g.first_seen),
            last = t(g.last_seen),
            base = esc(&inner.config.base_path),
            btn = action_button(
                inner,
                "forget-group",
                &format!("id={}", qs(&g.id)),
                "Forget group"
            ) + &crate::replay::group_button(inner, g),
        );
        for k in &g.keys {
            let _ = write!(
                b,
                "<li>{} <span class=note>{} · {} · attempt {}</span></li>",
                key_link(inner, &k.consumer, &k.message_id),
                esc(&k.consumer),
                k.status,
                k.attempt
            );
        }
        b.push_str("</ul></section>");
    }
    b
}

/// One failure group's keys, a page at a time.
pub fn failure_group(
    inner: &Inner,
    g: &FailureGroup,
    keys: &[Record],
    page: usize,
    now: Timestamp,
) -> String {
    let size = inner.config.page_size;
    let mut b = format!(
        "<h2><span class=bad>{}</span> · {}</h2><p>{} keys {}{}</p>",
        esc(&g.kind),
        esc(&g.first_line),
        g.count,
        action_button(
            inner,
            "forget-group",
            &format!("id={}", qs(&g.id)),
            "Forget group"
        ),
        crate::replay::group_button(inner, g)
    );
    b.push_str(
        "<table><tr><th>consumer</th><th>message id</th><th>status</th><th>attempt</th>\
         <th>failed at</th></tr>",
    );
    for r in keys.iter().skip(page * size).take(size) {
        let at = failure_group_of(r).map(|x| x.3).unwrap_or(now);
        let k = key_line(r, now, at);
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td>{}</td>{}<td>{} UTC</td></tr>",
            esc(&k.consumer),
            key_link(inner, &k.consumer, &k.message_id),
            k.status,
            n(k.attempt),
            t(k.at)
        );
    }
    b.push_str("</table>");
    let base = esc(&inner.config.base_path);
    if page > 0 {
        let _ = write!(
            b,
            "<a href=\"{base}/failures/group?id={}&amp;page={}\">previous</a> ",
            esc(&g.id),
            page - 1
        );
    }
    if keys.len() > (page + 1) * size {
        let _ = write!(
            b,
            "<a href=\"{base}/failures/group?id={}&amp;page={}\">next</a>",
            esc(&g.id),
            page + 1
        );
    }
    b
}

/// One key in full.
pub fn key(inner: &Inner, d: &KeyDetail) -> String {
    let params = format!(
        "consumer={}&id={}&fence={}",
        qs(&d.consumer),
        qs(&d.message_id),
        d.fence
    );
    let mut b = format!(
        "<table id=record><tr><th>consumer</th><td>{}</td></tr><tr><th>message id</th><td id=message-id>{}</td></tr>\
         <tr><th>status</th><td>{}</td></tr><tr><th>attempt</th><td>{}</td></tr><tr><th>fence</th><td>{}</td></tr>",
        esc(&d.consumer),
        esc(&d.message_id),
        d.status,
        d.attempt,
        d.fence
    );
    let opt = |label: &str, v: Option<i64>| {
        v.map(|v| format!("<tr><th>{label}</th><td>{} UTC</td></tr>", t(v)))
            .unwrap_or_default()
    };
    b.push_str(&opt("first claimed", d.first_claimed_at));
    b.push_str(&opt("lease expires", d.expires_at));
    b.push_str(&opt("processed", d.processed_at));
    if let Some(l) = d.outcome_len {
        let _ = write!(b, "<tr><th>outcome</th><td>{l} bytes</td></tr>");
    }
    b.push_str("</table>");
    match &d.failure {
        Some(f) => {
            let _ = write!(
                b,
                "<h2>Stored failure</h2><p><span class=bad>{}</span>, attempt {}, at {} UTC{}</p><ol class=chain>",
                esc(&f.kind),
                f.attempt,
                t(f.at),
                f.worker
                    .as_deref()
                    .map(|w| format!(", worker {}", esc(w)))
                    .unwrap_or_default()
            );
            for link in &f.chain {
                let _ = write!(b, "<li><pre>{}</pre></li>", esc(link));
            }
            b.push_str("</ol>");
        }
        None => b.push_str("<p>No failure stored.</p>"),
    }
    b.push_str(&action_button(inner, "forget", &params, "Forget this key"));
    b.push_str(&crate::replay::key_button(inner, d));
    if d.expires_at.is_some() {
        b.push_str(&action_button(
            inner,
            "release",
            &params,
            "Release its lease",
        ));
    }
    b
}

/// Stuck leases.
pub fn stuck(inner: &Inner, s: &Stuck) -> String {
    let mut b = format!(
        "<p>Keys first claimed more than {} ago and still in flight, or whose lease expired \
         that long ago with nobody taking them over (Redis keeps no first claim time: there \
         only the latter). <a href=\"?older_than=0s\">Every key in flight</a></p>",
        age(Duration::from_millis(s.older_than_ms))
    );
    b.push_str(&scan_note(s.scanned, s.truncated));
    b.push_str(
        "<table id=stuck><tr><th>consumer</th><th>message id</th><th>why</th><th>attempt</th>\
         <th>fence</th><th>lease expires</th><th></th></tr>",
    );
    for l in &s.leases {
        let k = &l.key;
        let params = format!(
            "consumer={}&id={}&fence={}",
            qs(&k.consumer),
            qs(&k.message_id),
            k.fence
        );
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td>{}</td>{}{}<td>{} UTC</td><td>{}</td></tr>",
            esc(&k.consumer),
            key_link(inner, &k.consumer, &k.message_id),
            l.why,
            n(k.attempt),
            n(k.fence),
            t(k.at),
            action_button(inner, "release", &params, "Release")
        );
    }
    if s.leases.is_empty() {
        b.push_str("<tr><td colspan=7>no stuck lease</td></tr>");
    }
    b.push_str("</table>");
    b
}

/// Dead outbox rows grouped.
pub fn outbox(inner: &Inner, d: &DeadRows) -> String {
    let mut b = scan_note(d.scanned, d.truncated);
    if d.groups.is_empty() {
        b.push_str("<p>No dead row.</p>");
    } else {
        b.push_str(&action_button(
            inner,
            "outbox-retry",
            "all=1",
            "Retry all dead rows",
        ));
    }
    for g in &d.groups {
        let _ = write!(
            b,
            "<section class=group data-group=\"{}\"><h2>{}</h2><p><strong class=count>{}</strong> rows {}</p>\
             <table><tr><th>id</th><th>destination</th><th>message id</th><th>payload</th>\
             <th>headers</th><th>attempts</th><th></th></tr>",
            esc(&g.id),
            esc(&g.first_line),
            g.count,
            action_button(
                inner,
                "outbox-retry",
                &format!("group={}", qs(&g.id)),
                "Retry group"
            )
        );
        for r in &g.rows {
            let headers: Vec<String> = r
                .headers
                .iter()
                .map(|(k, v)| format!("{}: {}", esc(k), esc(v)))
                .collect();
            let _ = write!(
                b,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} B</td><td>{}</td>{}<td>{}</td></tr>",
                r.id,
                esc(&r.destination),
                esc(&r.message_id),
                r.payload_len,
                headers.join("<br>"),
                n(r.attempts),
                action_button(inner, "outbox-retry", &format!("id={}", r.id), "Retry")
            );
        }
        b.push_str("</table></section>");
    }
    b
}
