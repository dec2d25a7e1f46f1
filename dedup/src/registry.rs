//! The registry: one line per built-in backend, with its descriptor when its feature is
//! enabled, then the stores registered at run time ([`register`]). The only place the
//! facade names a backend.

use std::sync::{PoisonError, RwLock};

use dedup_core::backend::url::{BackendDescriptor, MEMORY};

use crate::error::RegisterError;

/// A registry line: what names a backend, and its descriptor when this build has it.
#[derive(Clone, Copy)]
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
    backend!(
        "nats-kv",
        dedup_nats_kv,
        &["nats-kv"],
        &["nats-kv://HOST:PORT,HOST:PORT/?bucket=NAME"]
    ),
];

/// The stores registered at run time, in the order they were registered.
static REGISTERED: RwLock<Vec<&'static BackendDescriptor>> = RwLock::new(Vec::new());

/// Every line: the built-in backends, then the registered stores.
pub(crate) fn lines() -> Vec<Entry> {
    let registered = REGISTERED.read().unwrap_or_else(PoisonError::into_inner);
    let extra = registered.iter().map(|d| Entry {
        what: d.name,
        feature: "",
        schemes: d.schemes,
        forms: d.forms,
        descriptor: Some(*d),
    });
    REGISTRY.iter().copied().chain(extra).collect()
}

/// The backends this build includes, `memory` first, then the stores [`register`]ed: to
/// list them, or to pick one by its descriptor's properties (an outbox, a schema to
/// migrate) rather than by name.
pub fn backends() -> impl Iterator<Item = &'static BackendDescriptor> {
    lines().into_iter().filter_map(|e| e.descriptor)
}

/// Adds a store written outside this crate: [`open`](crate::open), [`open_admin`](
/// crate::open_admin), [`open_outbox`](crate::open_outbox), [`StoreUrl::parse`](
/// crate::StoreUrl::parse) and [`backends`] then answer its schemes.
///
/// Register once, at start-up, before opening a URL of the store. A URL parsed before
/// is refused with [`UrlError::UnknownScheme`](crate::UrlError::UnknownScheme). It is
/// thread-safe, and a registration lasts as long as the process.
///
/// # Errors
///
/// Nothing is registered when any check fails:
/// - [`RegisterError::SchemeTaken`]: a built-in backend or an earlier registration
///   answers one of its schemes (a built-in one even when its feature is off). A second
///   `register` of the same descriptor gets this error too.
/// - [`RegisterError::InvalidScheme`]: no scheme, or one that is not lower-case ASCII
///   letters, digits, `+`, `-` and `.`, starting with a letter.
///
/// # Examples
///
/// A store whose URLs are `tiny:`, opening a [`MemoryStore`](crate::MemoryStore):
///
/// ```
/// use std::sync::Arc;
/// use dedup::backend::url::{BackendDescriptor, OpenTarget, Params, StoreTarget, UrlError, UrlParts};
/// use dedup::store::Clock;
/// use dedup::url::RegisterError;
/// use dedup::{Admin, DedupStore, MemoryStore};
///
/// #[derive(Clone, Debug)]
/// struct TinyTarget;
///
/// #[async_trait::async_trait]
/// impl OpenTarget for TinyTarget {
///     fn descriptor(&self) -> &'static BackendDescriptor { &TINY }
///     fn location(&self) -> String { "this process".to_owned() }
///     fn set_clock(&mut self, _clock: Arc<dyn Clock>) {}
///     fn clone_target(&self) -> Box<dyn OpenTarget> { Box::new(self.clone()) }
///     async fn open_admin(self: Box<Self>) -> dedup::Result<Arc<dyn Admin>> {
///         Ok(Arc::new(MemoryStore::new()))
///     }
/// }
///
/// fn parse(url: &UrlParts<'_>) -> Result<StoreTarget, UrlError> {
///     Params::parse(url.query, "tiny", &[])?;
///     Ok(StoreTarget::new(TinyTarget))
/// }
///
/// static TINY: BackendDescriptor = BackendDescriptor {
///     name: "tiny",
///     schemes: &["tiny"],
///     forms: &["tiny:"],
///     parse,
///     has_schema: false,
///     has_outbox: false,
/// };
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// dedup::register(&TINY)?;
/// let store = dedup::open("tiny:").await?;
/// let key = dedup::Key::new("billing", "order-42")?;
/// assert!(store.claim(&key, &Default::default()).await?.is_acquired());
///
/// // A scheme is registered once.
/// assert!(matches!(dedup::register(&TINY), Err(RegisterError::SchemeTaken { .. })));
/// # Ok(())
/// # }
/// ```
pub fn register(descriptor: &'static BackendDescriptor) -> Result<(), RegisterError> {
    let backend = descriptor.name;
    if descriptor.schemes.is_empty() {
        return Err(RegisterError::InvalidScheme {
            backend,
            scheme: "",
        });
    }
    if let Some(scheme) = descriptor.schemes.iter().find(|s| !is_scheme(s)) {
        return Err(RegisterError::InvalidScheme { backend, scheme });
    }
    let mut registered = REGISTERED.write().unwrap_or_else(PoisonError::into_inner);
    let taken = REGISTRY
        .iter()
        .map(|e| (e.schemes, e.what.trim_end_matches(" backend")))
        .chain(registered.iter().map(|d| (d.schemes, d.name)));
    let mut seen: Vec<(&'static str, &'static str)> = Vec::new();
    for (schemes, by) in taken {
        seen.extend(schemes.iter().map(|s| (*s, by)));
    }
    for scheme in descriptor.schemes {
        if let Some((_, by)) = seen.iter().find(|(s, _)| s.eq_ignore_ascii_case(scheme)) {
            return Err(RegisterError::SchemeTaken { scheme, by });
        }
        seen.push((scheme, backend));
    }
    registered.push(descriptor);
    Ok(())
}

/// A URL scheme as this registry takes it: a lower-case ASCII letter, then letters,
/// digits, `+`, `-` or `.`.
fn is_scheme(scheme: &str) -> bool {
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
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
            REGISTRY
                .iter()
                .filter_map(|e| e.descriptor)
                .map(|d| d.name)
                .collect::<Vec<_>>(),
            ["memory", "sqlite", "postgres", "mysql", "redis", "nats-kv"]
        );
    }

    /// Scheme grammar: what `register` refuses before taking the lock.
    #[test]
    fn schemes_are_lower_case_url_schemes() {
        for good in ["tiny", "redis+cluster", "a1.b-c"] {
            assert!(is_scheme(good), "{good}");
        }
        for bad in ["", "Tiny", "1tiny", "ti ny", "tiny:", "+x"] {
            assert!(!is_scheme(bad), "{bad}");
        }
    }
}
