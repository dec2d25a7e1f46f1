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
    let Some((scheme, rest)) = url.split_once("://") else {
        return redact_query(url);
    };
    // The credentials end at the last '@' (a password may hold '/', '?', '#' or ',' that
    // its writer forgot to percent-encode); the hosts at the next '/', '?' or '#'.
    let hosts_from = rest.rfind('@').unwrap_or(0);
    let end = rest[hosts_from..]
        .find(['/', '?', '#'])
        .map_or(rest.len(), |i| hosts_from + i);
    let (authority, tail) = rest.split_at(end);
    format!(
        "{scheme}://{}{}",
        redact_authority(authority),
        redact_query(tail)
    )
}

/// `path?query` with the value of a `password=` parameter masked.
fn redact_query(text: &str) -> String {
    let Some((base, query)) = text.split_once('?') else {
        return text.to_owned();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{base}?{}", pairs.join("&"))
}

/// The hosts part, `user:password@host` (or a `redis+cluster://` list of them) with each
/// password masked. A node's credentials start at the list's start or after the first
/// ',' that follows the previous node's credentials, and end at their node's last '@';
/// credentials holding a ',' (a password with a comma, or a node without credentials
/// before them) are masked whole.
fn redact_authority(authority: &str) -> String {
    let mut out = String::with_capacity(authority.len());
    let mut node = 0;
    for (at, _) in authority.match_indices('@') {
        let next_comma = authority[at..].find(',').map(|i| at + i);
        let next_at = authority[at + 1..].find('@').map(|i| at + 1 + i);
        if at < node || next_at.is_some_and(|n| next_comma.is_none_or(|c| n < c)) {
            // Before this node, or a '@' inside the password: the credentials end later.
            continue;
        }
        let credentials = &authority[node..at];
        match credentials.split_once(':') {
            _ if credentials.contains(',') => out.push_str("***"),
            Some((user, _)) => {
                out.push_str(user);
                out.push_str(":***");
            }
            None => out.push_str(credentials),
        }
        let next = next_comma.map_or(authority.len(), |c| c + 1);
        out.push_str(&authority[at..next]);
        node = next;
    }
    out.push_str(&authority[node..]);
    out
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
            (
                "redis+cluster://u:p@a:1,:q@b:2/?prefix=x:",
                "redis+cluster://u:***@a:1,:***@b:2/?prefix=x:",
            ),
            // Characters a password should have percent-encoded, but did not.
            ("postgres://u:pa/ss@h/db", "postgres://u:***@h/db"),
            ("postgres://u:pa?ss@h/db?x=1", "postgres://u:***@h/db?x=1"),
            ("mysql://u:pa#ss@h:3306/db", "mysql://u:***@h:3306/db"),
            ("redis://:pa,ss@h:1", "redis://***@h:1"),
            ("redis+cluster://a:1,:pw@b:2", "redis+cluster://***@b:2"),
            (
                "sqlite:db.sqlite?password=x",
                "sqlite:db.sqlite?password=***",
            ),
        ];
        for (url, want) in cases {
            assert_eq!(redact(url), want, "{url}");
        }
    }
}
