//! The registry: one line per backend, with its descriptor when its feature is enabled.
//! The only place the facade names a backend.

use dedup_core::backend::url::{BackendDescriptor, MEMORY};

/// A registry line: what names a backend, and its descriptor when this build has it.
pub(crate) struct Entry {
    /// `"postgres backend"`, for [`UrlError::Disabled`](crate::UrlError::Disabled).
    pub(crate) what: &'static str,
    /// The cargo feature of `dedup` that brings it.
    pub(crate) feature: &'static str,
    /// Its schemes, as its descriptor has them.
    pub(crate) schemes: &'static [&'static str],
    /// Its URL forms for people, as its descriptor has them.
    pub(crate) forms: &'static [&'static str],
    /// The backend's own descriptor; `None` when the feature is off.
    pub(crate) descriptor: Option<&'static BackendDescriptor>,
}

/// One line per backend: `feature, crate, schemes, forms`. With the feature on, the line
/// holds the backend's own `DESCRIPTOR`; off, the schemes still name it, so a URL for it
/// is refused with the feature to enable. A unit test checks the schemes and forms against
/// the descriptor.
macro_rules! backend {
    ($feature:literal, $krate:ident, $schemes:expr, $forms:expr) => {
        Entry {
            what: concat!($feature, " backend"),
            feature: $feature,
            schemes: $schemes,
            forms: $forms,
            descriptor: {
                #[cfg(feature = $feature)]
                const D: Option<&BackendDescriptor> = Some(&$krate::DESCRIPTOR);
                #[cfg(not(feature = $feature))]
                const D: Option<&BackendDescriptor> = None;
                D
            },
        }
    };
}

pub(crate) static REGISTRY: &[Entry] = &[
    Entry {
        what: "memory backend",
        feature: "",
        schemes: MEMORY.schemes,
        forms: MEMORY.forms,
        descriptor: Some(&MEMORY),
    },
    backend!(
        "sqlite",
        dedup_sqlite,
        &["sqlite"],
        &["sqlite:PATH", "sqlite::memory:"]
    ),
    backend!(
        "postgres",
        dedup_postgres,
        &["postgres", "postgresql"],
        &["postgres://USER:PASSWORD@HOST/DB"]
    ),
    backend!(
        "mysql",
        dedup_mysql,
        &["mysql", "mariadb"],
        &[
            "mysql://USER:PASSWORD@HOST/DB",
            "mariadb://USER:PASSWORD@HOST/DB"
        ]
    ),
    backend!(
        "redis",
        dedup_redis,
        &["redis", "rediss", "redis+cluster", "rediss+cluster"],
        &[
            "redis://HOST:PORT/DB",
            "redis+cluster://HOST:PORT,HOST:PORT"
        ]
    ),
];

/// The backends this build includes, `memory` first: to list them, or to pick one by
/// its descriptor's properties (an outbox, a schema to migrate) rather than by name.
pub fn backends() -> impl Iterator<Item = &'static BackendDescriptor> {
    REGISTRY.iter().filter_map(|e| e.descriptor)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test build has every backend: each line's schemes and forms are its
    /// descriptor's (so a build without the feature names the backend as it would), and
    /// no scheme is answered twice.
    #[test]
    fn each_line_matches_its_descriptor() {
        let mut seen = std::collections::BTreeSet::new();
        for entry in REGISTRY {
            let d = entry
                .descriptor
                .unwrap_or_else(|| panic!("{} is off in the test build", entry.what));
            assert_eq!(entry.schemes, d.schemes, "{}", d.name);
            assert_eq!(entry.forms, d.forms, "{}", d.name);
            assert_eq!(entry.what, format!("{} backend", d.name));
            for s in d.schemes {
                assert!(seen.insert(*s), "scheme {s} answered twice");
                assert_eq!(s.to_ascii_lowercase(), *s);
            }
        }
        assert_eq!(
            backends().map(|d| d.name).collect::<Vec<_>>(),
            ["memory", "sqlite", "postgres", "mysql", "redis"]
        );
    }
}
