//! The lease token as a record holds it and the scripts get it: the token's 16 bytes in
//! Z85 (ZeroMQ RFC 32: each 4 bytes, big-endian, as 5 base-85 digits), 20 characters,
//! none of them a comma, which the record layout separates fields with. The UUID's text
//! form takes 36.
//!
//! Why: a record value of at most 44 bytes is kept by Redis in the same allocation as its
//! object header (the `embstr` encoding), a longer one in an allocation of its own. A
//! completed record with the server's clock (`2,d,...`, the default) and one-digit fence and
//! attempt is 59 bytes with the UUID text and 43 with Z85: 16 bytes less in the value and
//! one allocation less, about 16 bytes per record in all on Redis 7 and Valkey 9.
//!
//! The scripts compare and copy tokens as text and never decode them, so the encoding is
//! the client's alone. Records written by dedup-redis before it hold the UUID text;
//! [`parse`] reads both, so those records stay readable, and a lease this version hands
//! out is written in Z85 from its claim on.

use std::borrow::Cow;

use dedup_core::LeaseToken;

/// Z85's digits, in order of value.
const DIGITS: &[u8; 85] =
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/// Characters of an encoded token.
pub(crate) const LEN: usize = 20;

/// `token` as records hold it and scripts get it.
pub(crate) fn text(token: LeaseToken) -> String {
    let bytes = token.as_uuid().into_bytes();
    let mut out = String::with_capacity(LEN);
    for chunk in bytes.chunks_exact(4) {
        let mut n = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        let mut five = [0u8; 5];
        for digit in five.iter_mut().rev() {
            *digit = DIGITS[(n % 85) as usize];
            n /= 85;
        }
        out.extend(five.iter().map(|&d| char::from(d)));
    }
    out
}

/// The value of one Z85 digit.
fn value(digit: u8) -> Option<u32> {
    DIGITS.iter().position(|&d| d == digit).map(|v| v as u32)
}

/// A token as a record holds it: Z85 ([`text`]), or the UUID's text, as records written
/// before Z85 (and layout-1 hashes) hold it. `None` for anything else.
pub(crate) fn parse(stored: &str) -> Option<LeaseToken> {
    if stored.len() != LEN {
        return LeaseToken::parse(stored);
    }
    let mut bytes = [0u8; 16];
    for (chunk, out) in stored
        .as_bytes()
        .chunks_exact(5)
        .zip(bytes.chunks_exact_mut(4))
    {
        let mut n: u64 = 0;
        for &digit in chunk {
            n = n * 85 + u64::from(value(digit)?);
        }
        out.copy_from_slice(&u32::try_from(n).ok()?.to_be_bytes());
    }
    Some(LeaseToken::from_uuid(uuid::Uuid::from_bytes(bytes)))
}

/// A stored token as the UUID text [`dedup_core::backend::RawRecord`] reads; the text
/// itself when it is not a token (the record is then reported corrupt, with it).
pub(crate) fn as_uuid_text(stored: &str) -> Cow<'_, str> {
    match stored.len() == LEN {
        true => match parse(stored) {
            Some(token) => Cow::Owned(token.to_string()),
            None => Cow::Borrowed(stored),
        },
        false => Cow::Borrowed(stored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rfc_example_encodes_as_the_rfc_says() {
        // ZeroMQ RFC 32's test vector: 86 4F D2 6F B5 59 F7 5B -> "HelloWorld", twice.
        let bytes = [
            0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B, 0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59,
            0xF7, 0x5B,
        ];
        let token = LeaseToken::from_uuid(uuid::Uuid::from_bytes(bytes));
        assert_eq!(text(token), "HelloWorldHelloWorld");
        assert_eq!(parse("HelloWorldHelloWorld"), Some(token));
    }

    #[test]
    fn every_token_round_trips_in_twenty_characters_without_a_comma() {
        let edges = [[0u8; 16], [0xFF; 16]];
        let tokens = edges
            .iter()
            .map(|b| LeaseToken::from_uuid(uuid::Uuid::from_bytes(*b)))
            .chain((0..10_000).map(|_| LeaseToken::random()));
        for token in tokens {
            let t = text(token);
            assert_eq!(t.len(), LEN);
            assert!(!t.contains(','), "{t}");
            assert_eq!(parse(&t), Some(token), "{t}");
            assert_eq!(as_uuid_text(&t), token.to_string());
        }
        assert_eq!(
            text(LeaseToken::from_uuid(uuid::Uuid::from_bytes([0xFF; 16]))),
            "%nSc0".repeat(4)
        );
    }

    /// `lua/record.lua`'s `same_token` reads Z85 with its own copy of the digits.
    #[test]
    fn the_scripts_read_z85_with_the_same_digits() {
        let digits = std::str::from_utf8(DIGITS).unwrap();
        assert!(
            include_str!("../lua/record.lua").contains(&format!("local Z85 = '{digits}'")),
            "lua/record.lua's Z85 digits differ from src/token.rs's"
        );
    }

    #[test]
    fn the_uuid_text_of_earlier_records_still_parses() {
        let token = LeaseToken::random();
        let old = token.to_string();
        assert_eq!(parse(&old), Some(token));
        assert_eq!(as_uuid_text(&old), old);
    }

    #[test]
    fn what_is_no_token_is_refused() {
        // A comma is no Z85 digit; "%nSc1" is 2^32, past four bytes.
        for bad in ["HelloWorldHelloWorl,", "%nSc1HelloWorldHello", "short", ""] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(as_uuid_text("%nSc1HelloWorldHello"), "%nSc1HelloWorldHello");
    }
}
