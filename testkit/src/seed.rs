//! A run's seed: the variable that sets it, its hex form (what a failure prints), and a
//! fresh random one.

use std::hash::{BuildHasher, Hasher};

use dedup_core::Error;

/// The environment variable that sets the seed of a run (what a failure prints).
pub const SEED_ENV: &str = "DEDUP_TESTKIT_SEED";

/// `bytes` as lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The error for a seed that is not 64 hex digits.
pub(crate) fn bad_seed(hex: &str) -> Error {
    Error::invalid(
        "seed",
        format!("{hex:?} is not a seed: 64 hex digits, as a failure prints them"),
    )
}

/// A seed from its hex form, if it is 64 hex digits.
pub(crate) fn parse_seed(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// 64 random bits (from the hasher's random keys and the time).
pub(crate) fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish()
}

/// A fresh random seed.
pub(crate) fn random_seed() -> [u8; 32] {
    let mut seed = [0u8; 32];
    for chunk in seed.chunks_mut(8) {
        chunk.copy_from_slice(&random_u64().to_le_bytes());
    }
    seed
}
