//! Query parameters of a store URL: reading each one once, by name, and refusing the rest.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::UrlError;

/// The query parameters of one URL, taken out one by one; [`Params::finish`] refuses
/// whatever is left.
pub(crate) struct Params {
    backend: &'static str,
    known: &'static [&'static str],
    values: BTreeMap<String, String>,
}

impl Params {
    /// Parse `query` (`a=1&b=2`, percent-decoded) for `backend`, which accepts `known`.
    pub(crate) fn parse(
        query: Option<&str>,
        backend: &'static str,
        known: &'static [&'static str],
    ) -> Result<Self, UrlError> {
        let mut values = BTreeMap::new();
        for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            if !known.contains(&name.as_ref()) {
                return Err(UrlError::UnknownParameter {
                    name: name.into_owned(),
                    backend,
                    known,
                });
            }
            if values.insert(name.to_string(), value.to_string()).is_some() {
                return Err(invalid(&name, &value, "given more than once"));
            }
        }
        Ok(Params {
            backend,
            known,
            values,
        })
    }

    /// Take parameter `name`, when given.
    pub(crate) fn take(&mut self, name: &str) -> Option<String> {
        debug_assert!(self.known.contains(&name), "{} takes {name}", self.backend);
        self.values.remove(name)
    }

    /// Take `name` and parse it with `parse`, whose error says why the value is wrong.
    pub(crate) fn take_with<T>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, UrlError> {
        match self.take(name) {
            None => Ok(None),
            Some(value) => parse(&value)
                .map(Some)
                .map_err(|reason| invalid(name, &value, &reason)),
        }
    }

    /// The parameters not taken, in URL query form (for the driver's own parameters).
    pub(crate) fn rest(self) -> Option<String> {
        if self.values.is_empty() {
            return None;
        }
        let mut out = form_urlencoded::Serializer::new(String::new());
        for (k, v) in &self.values {
            out.append_pair(k, v);
        }
        Some(out.finish())
    }
}

pub(crate) fn invalid(name: &str, value: &str, reason: &str) -> UrlError {
    UrlError::InvalidParameter {
        name: name.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

/// A duration parameter (`lease`, `connect_timeout`, ...): [`dedup_core::parse_duration`],
/// the library's one duration grammar (a whole number and a unit: `500ms`, `5s`, `7d`).
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    dedup_core::parse_duration(text).map_err(|e| match e {
        dedup_core::Error::InvalidInput { reason, .. } => reason,
        other => other.to_string(),
    })
}

/// A positive count (`pool_size`).
pub(crate) fn count(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a whole number of at least 1".to_owned()),
    }
}

/// A yes/no switch (`block_in_place`): `true` or `false`.
pub(crate) fn boolean(text: &str) -> Result<bool, String> {
    match text {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("expected true or false".to_owned()),
    }
}

/// A feature switch (`group_commit`): `on` or `off` (`true` / `false` also do).
#[cfg(feature = "postgres")]
pub(crate) fn on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err("expected on or off".to_owned()),
    }
}

/// Where lease time comes from: `server` (the database's clock) or `local` (this
/// machine's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClockChoice {
    Server,
    Local,
}

pub(crate) fn clock(text: &str) -> Result<ClockChoice, String> {
    match text {
        "server" => Ok(ClockChoice::Server),
        "local" => Ok(ClockChoice::Local),
        _ => Err("expected server or local".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        for bad in ["", "30", "s", "5 s", "5w", "-1s", "1.5s"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn booleans() {
        assert_eq!(boolean("true"), Ok(true));
        assert_eq!(boolean("false"), Ok(false));
        for bad in ["", "yes", "1", "TRUE "] {
            assert!(boolean(bad).is_err(), "{bad}");
        }
    }
}
