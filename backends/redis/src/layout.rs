//! Key layout: which Redis key holds which dedup record, and its cluster hash slot.
//!
//! `{prefix}{consumer}:{message_id}`, each part with `%`, `{`, `}` and `:` percent-encoded
//! (`%25`, `%7B`, `%7D`, `%3A`). The encoding is injective (two different keys never share
//! a Redis key), keeps ordinary ids readable, and leaves no brace in the key: the prefix
//! forbids braces too, so no hash tag exists and Redis Cluster hashes the whole key. Records
//! therefore spread over all slots and masters, with no hot slot per consumer.

use dedup_core::Key;

/// Hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// The Redis key of `key`'s record under `prefix`.
pub(crate) fn redis_key(prefix: &str, key: &Key) -> String {
    let mut out =
        String::with_capacity(prefix.len() + key.consumer().len() + key.message_id().len() + 8);
    out.push_str(prefix);
    encode_into(&mut out, key.consumer());
    out.push(':');
    encode_into(&mut out, key.message_id());
    out
}

pub(crate) fn encode_into(out: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
}

/// The Redis Cluster hash slot of a Redis key: CRC16 (XMODEM) of the key, or of its hash tag
/// (the text between the first `{` and the next `}`, when not empty), mod 16384. As a number,
/// to index the slot map (redis-rs's `Slot` does not give its number out).
pub(crate) fn slot(redis_key: &[u8]) -> u16 {
    let hashed = hash_tag(redis_key).unwrap_or(redis_key);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
    }
    crc % SLOTS
}

fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(consumer: &str, id: &str) -> Key {
        Key::new(consumer, id).unwrap()
    }

    #[test]
    fn plain_ids_stay_readable() {
        assert_eq!(
            redis_key("dedup:", &k("billing", "order-42")),
            "dedup:billing:order-42"
        );
    }

    #[test]
    fn separators_and_braces_are_escaped() {
        assert_eq!(redis_key("p:", &k("a:b", "{c}%")), "p:a%3Ab:%7Bc%7D%25");
        // Without escaping these two would collide on "p:a:b:c".
        assert_ne!(
            redis_key("p:", &k("a:b", "c")),
            redis_key("p:", &k("a", "b:c"))
        );
        // An id that looks escaped stays distinct from the raw character.
        assert_ne!(
            redis_key("p:", &k("a", "%3A")),
            redis_key("p:", &k("a", ":"))
        );
    }

    #[test]
    fn no_hash_tag_so_the_whole_key_is_hashed() {
        let a = redis_key("p:", &k("c", "{same}x"));
        let b = redis_key("p:", &k("c", "{same}y"));
        assert!(!a.contains('{') && !b.contains('{'));
        // A raw `{same}` would be a hash tag pinning both keys to one slot; escaped, each
        // key is hashed whole (these two land in different slots).
        assert_eq!(slot(b"p:c:{same}x"), slot(b"p:c:{same}y"));
        assert_ne!(slot(a.as_bytes()), slot(b.as_bytes()));
    }

    #[test]
    fn slots_agree_with_redis_rs() {
        use redis::cluster_routing::Slot;
        let keys: [&[u8]; 8] = [
            b"",
            b"123456789",
            b"dedup:billing:order-42",
            b"p:c:{same}x",
            b"{}x",
            b"a{}{b}",
            b"{open",
            b"\xff\x00{\x80}",
        ];
        for key in keys {
            assert_eq!(
                Slot::new(slot(key)),
                Some(Slot::for_key(key)),
                "{:?}",
                String::from_utf8_lossy(key)
            );
        }
        // The reference value of the cluster spec: CRC16("123456789") = 0x31C3.
        assert_eq!(slot(b"123456789"), 0x31C3 % SLOTS);
    }
}
