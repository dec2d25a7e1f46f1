//! HTML escaping, time formatting and the page frame every view shares.

use std::fmt::Write;
use std::time::Duration;

use dedup_core::Timestamp;

/// `text` with `& < > " '` escaped, safe in element content and in quoted attributes.
/// Control characters other than newline and tab (an escape sequence in a stored error,
/// say) become numeric references: the page keeps the same text, and no raw control byte
/// reaches whoever reads the HTML in a terminal (`curl`).
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_ascii_control() && c != '\n' && c != '\t' => {
                let _ = write!(out, "&#{};", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// `text` percent-encoded for a query string value.
pub fn qs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A timestamp as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn time(t: Timestamp) -> String {
    let ms = t.as_millis();
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A duration for people: `850 ms`, `42 s`, `3 min 5 s`, `2 h 10 min`, `3 d 4 h`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{} ms", d.as_millis()),
        1..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#222;background:#fafafa}\
header{background:#234;color:#fff;padding:.5em 1em;display:flex;flex-wrap:wrap;gap:1em;align-items:center}\
header a{color:#fff}header .store{opacity:.8;font-size:.9em;word-break:break-all}\
main{padding:1em;max-width:70em}table{border-collapse:collapse;width:100%;margin:.5em 0 1em}\
th,td{border-bottom:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top;word-break:break-word}\
th{background:#eee}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.bad{color:#a00;font-weight:600}.warn{color:#a60}.note{color:#555;font-size:.9em}\
pre{white-space:pre-wrap;word-break:break-word;background:#f0f0f0;padding:.5em}\
form.inline{display:inline}button{padding:.3em .8em}.done{background:#e6f4e6;padding:.5em}\
.refused{background:#fbe9e9;padding:.5em}#flow{display:grid;grid-template-columns:repeat(auto-fill,minmax(24em,1fr));gap:.5em 1.5em}\
#flow figure{margin:0}#flow figcaption{font-weight:600}svg.chart{width:100%;height:auto}@media(max-width:40em){th,td{padding:.2em}main{padding:.5em}}";

/// The overview's address under `base` (the mount point), already escaped for an
/// attribute: `base` itself, without a trailing slash, since axum's `Router::nest` routes
/// `/ops/dedup` but not `/ops/dedup/`; `/` at the root.
pub fn home(base: &str) -> String {
    if base.is_empty() {
        "/".to_owned()
    } else {
        esc(base)
    }
}

/// The page frame: a header with the views, `title`, then `body` (already escaped HTML).
///
/// The views are linked under `base`; the outbox's only when the console has one
/// (`outbox`), so no link leads to a page that cannot be.
pub fn page(
    base: &str,
    store: &str,
    outbox: bool,
    title: &str,
    body: &str,
    refresh: bool,
) -> String {
    let script = if refresh {
        "<script>setTimeout(function(){if(document.getElementById('auto').checked)location.reload()},15000)</script>\
         <label class=note><input type=checkbox id=auto checked> refresh every 15 s</label>"
    } else {
        ""
    };
    let outbox = if outbox {
        format!("<a href=\"{}/outbox\">Outbox</a>", esc(base))
    } else {
        String::new()
    };
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8>\
         <meta name=viewport content=\"width=device-width,initial-scale=1\">\
         <title>{t} · dedup console</title><style>{STYLE}</style></head><body>\
         <header><strong>dedup console</strong>\
         <a href=\"{h}\">Overview</a><a href=\"{b}/failures\">Failures</a>\
         <a href=\"{b}/stuck\">Stuck</a>{outbox}\
         <span class=store>{s}</span></header><main><h1>{t}</h1>{body}{script}</main></body></html>",
        t = esc(title),
        b = esc(base),
        h = home(base),
        s = esc(store),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
        assert_eq!(
            esc("a\x1b[2J\x1b]0;t\x07\r\nb\tc"),
            "a&#27;[2J&#27;]0;t&#7;&#13;\nb\tc"
        );
        assert_eq!(qs("a b&c/é"), "a%20b%26c%2F%C3%A9");
    }

    #[test]
    fn formats_times_and_ages() {
        assert_eq!(time(Timestamp::from_millis(0)), "1970-01-01 00:00:00");
        assert_eq!(
            time(Timestamp::from_millis(1_709_210_096_000)),
            "2024-02-29 12:34:56"
        );
        assert_eq!(age(Duration::from_millis(850)), "850 ms");
        assert_eq!(age(Duration::from_secs(185)), "3 min 5 s");
        assert_eq!(age(Duration::from_secs(90_000)), "1 d 1 h");
    }
}
