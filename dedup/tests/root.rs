//! The crate root names the user's API, at most 40 names with every feature on.
//!
//! It reads `src/lib.rs`, the only file that puts names at the root, and lists its public
//! items. A name added there must be added to `ROOT` below too, and the count stays at or
//! under the cap. Everything else belongs in a module (`dedup::store`, `dedup::inbox`...).

/// The most names the root may hold, modules included, with every feature on.
const CAP: usize = 40;

/// The root's names, sorted: functions, types, then modules.
const ROOT: &[&str] = &[
    // What a consumer calls.
    "open",
    "open_admin",
    "open_outbox",
    "open_with_clock",
    "register",
    // What a consumer names.
    "Admin",
    "BoxError",
    "Claim",
    "DedupStore",
    "Error",
    "Handled",
    "Inbox",
    "InboxConfig",
    "InboxError",
    "Key",
    "Lease",
    "MemoryStore",
    "OpenError",
    "Purger",
    "Record",
    "Result",
    "StoreUrl",
    "Timestamp",
    "Transient",
    "UrlError",
    // The modules, the backends' included.
    "admin",
    "backend",
    "health",
    "inbox",
    "layers",
    "mysql",
    "nats_kv",
    "outbox",
    "postgres",
    "purge",
    "redis",
    "sqlite",
    "store",
    "trace",
    "url",
];

#[test]
fn the_root_holds_the_listed_names_and_no_more_than_the_cap() {
    let names = root_names(include_str!("../src/lib.rs"));
    assert!(
        !names.iter().any(|n| n == "*"),
        "the root re-exports a glob: name each item instead"
    );
    let mut found: Vec<&str> = names.iter().map(String::as_str).collect();
    found.sort_unstable();
    let mut listed = ROOT.to_vec();
    listed.sort_unstable();
    assert_eq!(found, listed, "src/lib.rs and ROOT disagree");
    assert!(
        found.len() <= CAP,
        "the root holds {} names, more than {CAP}: move some into a module",
        found.len()
    );
}

#[test]
fn no_other_file_exports_a_macro_at_the_root() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains("macro_export"),
            "{} exports a macro",
            path.display()
        );
    }
}

/// The names the public items of a crate root declare, `*` for a glob.
fn root_names(lib: &str) -> Vec<String> {
    let code: String = lib
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut rest = code.as_str();
    let mut after_word = false;
    while let Some(c) = rest.chars().next() {
        if depth == 0 && !after_word && rest.starts_with("pub ") {
            let item = &rest["pub ".len()..];
            if let Some(tree) = item.strip_prefix("use ") {
                let end = tree.find(';').expect("a use ends with `;`");
                names.extend(use_leaves(tree[..end].trim(), ""));
                rest = &tree[end + 1..];
            } else {
                // `pub mod x;`, `pub fn x() {...}`: the word after the keyword; a body's
                // braces are then counted as any others.
                let end = item
                    .find([';', '{'])
                    .expect("an item ends with `;` or a body");
                let name = item[..end].split_whitespace().nth(1).expect("a named item");
                names.push(name.split(['(', '<', ':']).next().unwrap().to_owned());
                rest = &item[end..];
            }
            continue;
        }
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        after_word = c.is_alphanumeric() || c == '_';
        rest = &rest[c.len_utf8()..];
    }
    names
}

/// The names a use tree brings into scope: `a::{b, c as d, e::{f}}` gives b, d, f.
fn use_leaves(tree: &str, parent: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        let leaf = match tree.split_once(" as ") {
            Some((_, alias)) => alias.trim(),
            None => tree.rsplit("::").next().unwrap().trim(),
        };
        let leaf = if leaf == "self" { parent } else { leaf };
        return vec![leaf.to_owned()];
    };
    let prefix = tree[..open].trim_end_matches("::");
    let group = &tree[open + 1..tree.rfind('}').expect("a closed group")];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&group[start..]);
    let parent = prefix.rsplit("::").next().unwrap_or(prefix);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .flat_map(|part| use_leaves(part, parent))
        .collect()
}

#[test]
fn use_trees_are_read_leaf_by_leaf() {
    let lib = "pub use a::{B, c::{D, E as F}, self};\npub mod g;\nmod h { pub use k::L; }\n\
               pub fn m() { pub struct N; }\npub(crate) use o::P;\npub use i as j;\n";
    assert_eq!(root_names(lib), ["B", "D", "F", "a", "g", "m", "j"]);
    assert_eq!(root_names("pub use a::*;"), ["*"]);
}
