//! What identifies a guarded request: its [`Key`] (scope + header value) and its payload
//! [`Fingerprint`].

use dedup_core::{Fingerprint, Key};
use http::request::Parts;

use crate::{FingerprintConfig, IdempotencyConfig, Principal, Scope};

/// The store key of a request carrying `key` (see [`Scope`] for the format).
pub fn request_key(
    config: &IdempotencyConfig,
    parts: &Parts,
    key: String,
) -> dedup_core::Result<Key> {
    let scope = match &config.scope {
        Scope::MethodAndRoute => format!("{} {}", parts.method, route(parts)),
        Scope::Service => "*".to_string(),
        Scope::Custom(f) => f(parts),
    };
    let consumer = match parts.extensions.get::<Principal>() {
        Some(Principal(p)) => format!("http:p{}:{p}:{scope}", p.len()),
        None => format!("http:{scope}"),
    };
    let consumer = if consumer.len() > Key::MAX_CONSUMER_LEN || consumer.contains('\0') {
        format!(
            "http:sha256:{}",
            Fingerprint::of_payload(consumer.as_bytes()).as_str()
        )
    } else {
        consumer
    };
    Key::new(consumer, key)
}

fn route(parts: &Parts) -> &str {
    #[cfg(feature = "axum")]
    if let Some(matched) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return matched.as_str();
    }
    parts.uri.path()
}

/// The fingerprint of a request: SHA-256 over a canonical form of method, path, query,
/// the configured headers and the body (see [`FingerprintConfig`]).
pub fn request_fingerprint(config: &FingerprintConfig, parts: &Parts, body: &[u8]) -> Fingerprint {
    let mut canonical = Vec::with_capacity(body.len() + 128);
    let mut field = |bytes: &[u8]| {
        // Length-prefixed, so no field's content can imitate a boundary.
        canonical.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        canonical.extend_from_slice(bytes);
    };
    field(b"dedup-http fingerprint v1");
    field(parts.method.as_str().as_bytes());
    field(parts.uri.path().as_bytes());
    field(query(config, parts.uri.query().unwrap_or_default()).as_bytes());
    for name in &config.headers {
        field(name.as_str().as_bytes());
        for value in parts.headers.get_all(name) {
            field(value.as_bytes());
        }
    }
    field(&json_without(&config.ignore_json, body).unwrap_or_else(|| body.to_vec()));
    Fingerprint::of_payload(&canonical)
}

fn query(config: &FingerprintConfig, query: &str) -> String {
    if config.ignore_query.is_empty() {
        return query.to_string();
    }
    query
        .split('&')
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or_default();
            !config.ignore_query.iter().any(|i| i == name)
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// The body as canonical JSON without the `ignore` pointers; `None` when there is nothing
/// to ignore or the body is not JSON.
fn json_without(ignore: &[String], body: &[u8]) -> Option<Vec<u8>> {
    if ignore.is_empty() {
        return None;
    }
    let mut doc: serde_json::Value = serde_json::from_slice(body).ok()?;
    for pointer in ignore {
        let Some((parent, last)) = pointer.rsplit_once('/') else {
            continue;
        };
        let last = last.replace("~1", "/").replace("~0", "~");
        match doc.pointer_mut(parent) {
            Some(serde_json::Value::Object(map)) => {
                map.remove(&last);
            }
            Some(serde_json::Value::Array(items)) => {
                if let Ok(i) = last.parse::<usize>()
                    && i < items.len()
                {
                    items.remove(i);
                }
            }
            _ => {}
        }
    }
    serde_json::to_vec(&sort_keys(doc)).ok()
}

/// The document with every object's keys in sorted order, whatever map type serde_json was
/// built with.
fn sort_keys(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sort_keys).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Method, Request};

    fn parts(method: Method, uri: &str, header: Option<&str>) -> Parts {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(v) = header {
            b = b.header("x-tenant", v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn fp(config: &FingerprintConfig, p: &Parts, body: &str) -> Fingerprint {
        request_fingerprint(config, p, body.as_bytes())
    }

    #[test]
    fn method_path_query_and_body_all_count() {
        let c = FingerprintConfig::default();
        let base = fp(&c, &parts(Method::POST, "/orders?a=1", None), "{}");
        assert_eq!(
            base,
            fp(&c, &parts(Method::POST, "/orders?a=1", Some("t")), "{}")
        );
        for (p, body) in [
            (parts(Method::PATCH, "/orders?a=1", None), "{}"),
            (parts(Method::POST, "/order?a=1", None), "{}"),
            (parts(Method::POST, "/orders?a=2", None), "{}"),
            (parts(Method::POST, "/orders?a=1", None), "{ }"),
        ] {
            assert_ne!(base, fp(&c, &p, body), "{p:?} {body}");
        }
    }

    #[test]
    fn configured_exclusions_and_headers_apply() {
        let c = FingerprintConfig {
            headers: vec![http::HeaderName::from_static("x-tenant")],
            ignore_query: vec!["trace".into()],
            ignore_json: vec!["/meta/ts".into(), "/client".into()],
        };
        let p = parts(Method::POST, "/orders?a=1&trace=9", Some("t1"));
        let a = fp(
            &c,
            &p,
            r#"{"item":"tea","client":"x","meta":{"ts":1,"k":2}}"#,
        );
        let b = fp(
            &c,
            &parts(Method::POST, "/orders?a=1&trace=7", Some("t1")),
            r#"{ "meta": {"k":2, "ts": 5}, "item": "tea" }"#,
        );
        assert_eq!(a, b);
        assert_ne!(a, fp(&c, &p, r#"{"item":"coffee","meta":{"k":2}}"#));
        let other_tenant = parts(Method::POST, "/orders?a=1&trace=9", Some("t2"));
        assert_ne!(a, fp(&c, &other_tenant, r#"{"item":"tea","meta":{"k":2}}"#));
    }

    #[test]
    fn keys_are_scoped_by_route_and_principal() {
        let config = IdempotencyConfig::default();
        let mut p = parts(Method::POST, "/orders", None);
        let k = request_key(&config, &p, "k1".into()).unwrap();
        assert_eq!((k.consumer(), k.message_id()), ("http:POST /orders", "k1"));
        p.extensions.insert(Principal("alice".into()));
        let k = request_key(&config, &p, "k1".into()).unwrap();
        assert_eq!(k.consumer(), "http:p5:alice:POST /orders");
        let long = parts(Method::POST, &format!("/{}", "x".repeat(300)), None);
        let k = request_key(&config, &long, "k1".into()).unwrap();
        assert!(k.consumer().starts_with("http:sha256:"), "{k:?}");
    }

    #[test]
    fn a_consumer_of_the_longest_allowed_length_is_kept_as_it_is() {
        let config = IdempotencyConfig::default();
        // `http:POST /` is 11 bytes; the path fills the rest.
        let path = format!("/{}", "x".repeat(Key::MAX_CONSUMER_LEN - 11));
        let k = request_key(&config, &parts(Method::POST, &path, None), "k1".into()).unwrap();
        assert_eq!(k.consumer(), format!("http:POST {path}"));
        assert_eq!(k.consumer().len(), Key::MAX_CONSUMER_LEN);
        let longer = format!("{path}x");
        let k = request_key(&config, &parts(Method::POST, &longer, None), "k1".into()).unwrap();
        assert!(k.consumer().starts_with("http:sha256:"), "{k:?}");
    }

    #[test]
    fn an_ignored_pointer_removes_an_array_item_in_range_only() {
        let c = FingerprintConfig {
            ignore_json: vec!["/items/1".into()],
            ..FingerprintConfig::default()
        };
        let p = parts(Method::POST, "/orders", None);
        let both = fp(&c, &p, r#"{"items":["tea","cake"]}"#);
        assert_eq!(both, fp(&c, &p, r#"{"items":["tea","scone"]}"#));
        assert_ne!(both, fp(&c, &p, r#"{"items":["coffee","cake"]}"#));
        // Index 1 is past the end of a one-item array: nothing is removed.
        let one = fp(&c, &p, r#"{"items":["tea"]}"#);
        assert_ne!(one, fp(&c, &p, r#"{"items":["coffee"]}"#));
        assert_eq!(one, fp(&c, &p, r#"{ "items": ["tea"] }"#));
    }
}
