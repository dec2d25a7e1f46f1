//! [`redact`]: a store URL with its passwords masked, for messages and logs.

/// `url` with every password replaced by `***`: the `user:password@` part of each host
/// (each node of a `redis+cluster://` list) and a `password=` query parameter.
///
/// ```
/// assert_eq!(
///     dedup_core::backend::url::redact("postgres://app:s3cret@db:5432/orders?sslmode=verify-full"),
///     "postgres://app:***@db:5432/orders?sslmode=verify-full"
/// );
/// assert_eq!(dedup_core::backend::url::redact("redis+cluster://:pw@a:1,:pw@b:2"), "redis+cluster://:***@a:1,:***@b:2");
/// ```
pub fn redact(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = match base.split_once("://") {
        Some((scheme, rest)) => {
            // The authority ends at the first '/' (path); cluster URLs list several nodes.
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let nodes: Vec<String> = authority.split(',').map(redact_node).collect();
            format!("{scheme}://{}{path}", nodes.join(","))
        }
        None => base.to_owned(),
    };
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => pair.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

/// `user:password@host` as `user:***@host`.
fn redact_node(node: &str) -> String {
    match node.rsplit_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => node.to_owned(),
        },
        None => node.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn masks_every_password_and_nothing_else() {
        let cases = [
            ("memory:", "memory:"),
            ("sqlite:/tmp/a:b@c.db", "sqlite:/tmp/a:b@c.db"),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("postgres://u:p@ss@h/db", "postgres://u:***@h/db"),
            (
                "postgres://h/db?user=u&password=x",
                "postgres://h/db?user=u&password=***",
            ),
            (
                "rediss://:pw@h:6380/0?prefix=a:",
                "rediss://:***@h:6380/0?prefix=a:",
            ),
            (
                "redis+cluster://u:p@a:1,b:2",
                "redis+cluster://u:***@a:1,b:2",
            ),
        ];
        for (url, want) in cases {
            assert_eq!(redact(url), want, "{url}");
        }
    }
}
