//! Reading the `Idempotency-Key` header value.

use dedup_core::Key;
use http::HeaderValue;

/// Why an `Idempotency-Key` header value was refused (answered with `400`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyHeaderError {
    /// The header is present more than once.
    #[error("the header is sent more than once")]
    Repeated,
    /// The value is empty (or an empty quoted string).
    #[error("the key is empty")]
    Empty,
    /// The value is longer than a message id may be.
    #[error("the key is {0} bytes long, at most {max} allowed", max = Key::MAX_MESSAGE_ID_LEN)]
    TooLong(usize),
    /// The value holds bytes outside visible ASCII, or a quoted string is malformed.
    #[error("the key must be visible ASCII (a token or a quoted Structured Field string)")]
    Malformed,
}

/// The key carried by one header value.
///
/// The draft defines the field as a Structured Field string (`"8e03978e-40d5"`, quotes
/// included); most clients in the wild send the bare value (`8e03978e-40d5`), as Stripe
/// documents it. Both are accepted and mean the same key: a value that starts with `"` is
/// parsed as an sf-string (`\"` and `\\` escapes, nothing after the closing quote), any
/// other value is taken as it is. Either way the key is 1 to 255 bytes of visible ASCII.
pub fn parse_key(value: &HeaderValue) -> Result<String, KeyHeaderError> {
    let raw = value.as_bytes();
    let key = match raw.strip_prefix(b"\"") {
        Some(rest) => unquote(rest)?,
        None => raw.to_vec(),
    };
    if key.is_empty() {
        return Err(KeyHeaderError::Empty);
    }
    if key.len() > Key::MAX_MESSAGE_ID_LEN {
        return Err(KeyHeaderError::TooLong(key.len()));
    }
    if !key.iter().all(|b| (0x20..0x7f).contains(b)) {
        return Err(KeyHeaderError::Malformed);
    }
    String::from_utf8(key).map_err(|_| KeyHeaderError::Malformed)
}

/// The content of an sf-string whose opening quote is already stripped.
fn unquote(rest: &[u8]) -> Result<Vec<u8>, KeyHeaderError> {
    let mut out = Vec::with_capacity(rest.len());
    let mut bytes = rest.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return Err(KeyHeaderError::Malformed),
            },
            b'"' if bytes.as_slice().is_empty() => return Ok(out),
            b'"' => return Err(KeyHeaderError::Malformed),
            b => out.push(b),
        }
    }
    Err(KeyHeaderError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &str) -> Result<String, KeyHeaderError> {
        parse_key(&HeaderValue::from_str(v).unwrap())
    }

    #[test]
    fn bare_and_quoted_values_name_the_same_key() {
        assert_eq!(parse("abc-123").unwrap(), "abc-123");
        assert_eq!(parse("\"abc-123\"").unwrap(), "abc-123");
        assert_eq!(parse(r#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
    }

    #[test]
    fn bad_values_are_refused() {
        assert_eq!(parse("\"\""), Err(KeyHeaderError::Empty));
        assert_eq!(parse("\"abc"), Err(KeyHeaderError::Malformed));
        assert_eq!(parse("\"a\"b\""), Err(KeyHeaderError::Malformed));
        assert_eq!(parse("\"a\\nb\""), Err(KeyHeaderError::Malformed));
        assert_eq!(parse(&"k".repeat(256)), Err(KeyHeaderError::TooLong(256)));
        assert_eq!(parse(&"k".repeat(255)).unwrap().len(), 255);
        let tab = HeaderValue::from_bytes(b"a\tb").unwrap();
        assert_eq!(parse_key(&tab), Err(KeyHeaderError::Malformed));
    }
}
