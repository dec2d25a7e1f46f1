//! Text from outside on the operator's screen. Message ids, consumer names, stored failure
//! causes, outbox destinations and errors come from producers, payloads and servers: a
//! cause that quotes a payload may hold `ESC[2J` (clear the screen) or an OSC sequence
//! (set the window's title). Everything the command line prints goes through here, so no
//! raw control character reaches the terminal.
//!
//! Control characters are shown as Rust writes them in a string: `\n`, `\r`, `\t`, `\x1b`,
//! and `\u{9b}` for the C1 controls and `\u{202e}` for the bidirectional formatting
//! characters (which reorder what the operator reads). Other text, backslashes included,
//! is left as it is.

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` must not reach a terminal raw: the C0 and C1 controls, DEL, and the
/// bidirectional formatting characters.
fn hostile(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every control character escaped, newlines included: one line, for a field
/// of a listing or a `caused by:` line.
pub(crate) fn line(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// `text` with every control character escaped but newlines: for a block of lines whose
/// fields were already made safe (the last guard before standard output or error).
pub(crate) fn lines(text: &str) -> Cow<'_, str> {
    escape(text, true)
}

fn escape(text: &str, keep_newlines: bool) -> Cow<'_, str> {
    let is_kept = |c: char| !hostile(c) || (keep_newlines && c == '\n');
    if text.chars().all(is_kept) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if is_kept(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    Cow::Owned(out)
}

/// A JSON document safe on a terminal: `serde_json` escapes the C0 controls itself; this
/// escapes DEL, the C1 controls and the bidirectional formatting characters as `\uXXXX`
/// too. They can only stand inside JSON strings, where the escape means the same
/// character: the document stays valid and equal.
pub(crate) fn json(text: String) -> String {
    if !text.chars().any(hostile) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hostile(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_escaped() {
        let hostile = "a\x1b[2J\x1b]0;title\x07b\r\nc\td\u{9b}e\u{202e}f\x7f";
        assert_eq!(
            line(hostile),
            "a\\x1b[2J\\x1b]0;title\\x07b\\r\\nc\\td\\u{9b}e\\u{202e}f\\x7f"
        );
        assert_eq!(
            lines(hostile),
            "a\\x1b[2J\\x1b]0;title\\x07b\\r\nc\\td\\u{9b}e\\u{202e}f\\x7f"
        );
        assert!(matches!(line("plain, é, ✓"), Cow::Borrowed(_)));
    }

    #[test]
    fn json_stays_valid_and_equal() {
        let value = serde_json::json!({ "cause": "x\x1b[2J\u{9b}\u{202e}\x7f" });
        let shown = json(value.to_string());
        assert!(shown.chars().all(|c| !hostile(c)), "{shown}");
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back, value);
    }
}
