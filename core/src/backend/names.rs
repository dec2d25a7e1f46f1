//! Validation of the names a store builds queries or keys from (table, schema, key prefix).
//!
//! SQL identifiers cannot be bound as parameters, so backends splice them into statements;
//! these checks make that safe by accepting only a conservative alphabet.

use crate::{Error, Result};

/// Longest SQL identifier accepted (PostgreSQL's limit is 63 bytes).
pub const MAX_IDENTIFIER_LEN: usize = 63;

/// Longest Redis key prefix accepted.
pub const MAX_KEY_PREFIX_LEN: usize = 100;

/// Accept `name` as a SQL table or schema name: ASCII letter or `_` first, then ASCII
/// letters, digits or `_`, at most [`MAX_IDENTIFIER_LEN`] bytes. Anything else (quotes,
/// dots, spaces, semicolons, non-ASCII) is [`Error::InvalidInput`].
pub fn sql_identifier(what: &'static str, name: &str) -> Result<()> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok {
        return Err(Error::invalid(
            what,
            format!("{name:?} must start with an ASCII letter or '_'"),
        ));
    }
    if name.len() > MAX_IDENTIFIER_LEN {
        return Err(Error::invalid(
            what,
            format!("{name:?} is longer than {MAX_IDENTIFIER_LEN} bytes"),
        ));
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(Error::invalid(
            what,
            format!("{name:?} may hold only ASCII letters, digits and '_'"),
        ));
    }
    Ok(())
}

/// The outbox table's default name for the inbox table `table`: `<table>_outbox`, or, when
/// that is longer than [`MAX_IDENTIFIER_LEN`], `table` cut short plus a hash of the whole
/// name (so two long inbox tables never share an outbox table). Always a valid
/// [`sql_identifier`] when `table` is one.
pub fn outbox_table(table: &str) -> String {
    const SUFFIX: &str = "_outbox";
    let name = format!("{table}{SUFFIX}");
    if name.len() <= MAX_IDENTIFIER_LEN {
        return name;
    }
    // FNV-1a, 64 bits: stable across Rust releases and nodes.
    let hash = table.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let hash = format!("{hash:016x}");
    let keep = MAX_IDENTIFIER_LEN - hash.len() - SUFFIX.len() - 1;
    // Validated names are ASCII, so byte slicing is safe; cut at a char boundary anyway.
    let mut end = keep.min(table.len());
    while !table.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}_{hash}{SUFFIX}", &table[..end])
}

/// Accept `prefix` as a Redis key prefix: non-empty, at most [`MAX_KEY_PREFIX_LEN`] bytes,
/// printable ASCII without spaces, braces (`{`/`}` would change Redis Cluster hash slots)
/// or glob characters (`*?[]`, which would break pattern scans).
pub fn key_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() || prefix.len() > MAX_KEY_PREFIX_LEN {
        return Err(Error::invalid(
            "key prefix",
            format!("must be 1 to {MAX_KEY_PREFIX_LEN} bytes"),
        ));
    }
    if let Some(bad) = prefix
        .chars()
        .find(|c| !c.is_ascii_graphic() || "{}*?[]\\".contains(*c))
    {
        return Err(Error::invalid(
            "key prefix",
            format!("{prefix:?} contains the forbidden character {bad:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        for ok in ["dedup_inbox", "_x", "T1"] {
            sql_identifier("table", ok).unwrap();
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a.b",
            "a b",
            "x;drop table y",
            "é",
            &"a".repeat(64),
        ] {
            assert!(
                sql_identifier("table", bad).unwrap_err().is_invalid_input(),
                "{bad}"
            );
        }
    }

    #[test]
    fn outbox_tables_are_derived_and_fit() {
        assert_eq!(outbox_table("dedup_inbox"), "dedup_inbox_outbox");
        let a = "a".repeat(63);
        let b = format!("{}b", "a".repeat(62));
        let (oa, ob) = (outbox_table(&a), outbox_table(&b));
        assert_ne!(oa, ob);
        for name in [&oa, &ob] {
            assert!(name.len() <= MAX_IDENTIFIER_LEN, "{name}");
            assert!(name.ends_with("_outbox"), "{name}");
            sql_identifier("table", name).unwrap();
        }
    }

    #[test]
    fn prefixes() {
        key_prefix("dedup:").unwrap();
        key_prefix("app-1:dedup").unwrap();
        for bad in ["", "a b", "a{b}", "x*", "\n", &"p".repeat(101)] {
            assert!(key_prefix(bad).unwrap_err().is_invalid_input(), "{bad:?}");
        }
    }
}
