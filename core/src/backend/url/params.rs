//! [`Params`]: the query parameters of a store URL, read once each by name, the rest
//! refused; and the value grammars every backend shares (durations, counts, switches,
//! the clock).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::UrlError;
use crate::{Clock, SystemClock};

/// The query parameters of one URL, taken out one by one. Parsing refuses a parameter the
/// backend does not take ([`UrlError::UnknownParameter`]) and one given twice.
pub struct Params {
    backend: &'static str,
    known: &'static [&'static str],
    values: BTreeMap<String, String>,
}

impl Params {
    /// Parse `query` (`a=1&b=2`, percent-decoded) for `backend`, which accepts `known`.
    pub fn parse(
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
    pub fn take(&mut self, name: &str) -> Option<String> {
        debug_assert!(self.known.contains(&name), "{} takes {name}", self.backend);
        self.values.remove(name)
    }

    /// Take `name` and parse it with `parse`, whose error says why the value is wrong.
    pub fn take_with<T>(
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

    /// `clock=local` (or no `clock`) for a store without a server: `None`, this machine's
    /// clock; `clock=server` is refused, since there is no server clock to use.
    pub fn local_clock(&mut self) -> Result<Option<Arc<dyn Clock>>, UrlError> {
        match self.take_with("clock", clock)? {
            None | Some(ClockChoice::Local) => Ok(None),
            Some(ClockChoice::Server) => Err(invalid(
                "clock",
                "server",
                &format!(
                    "{} has no server clock; leases use this machine's clock",
                    self.backend
                ),
            )),
        }
    }

    /// `clock=server` (the default: `None`, the server's clock) or `clock=local` (this
    /// machine's clock), for a store on a server.
    pub fn server_or_local_clock(&mut self) -> Result<Option<Arc<dyn Clock>>, UrlError> {
        Ok(match self.take_with("clock", clock)? {
            None | Some(ClockChoice::Server) => None,
            Some(ClockChoice::Local) => Some(Arc::new(SystemClock)),
        })
    }

    /// The parameters not taken, in URL query form (for the driver's own parameters).
    pub fn rest(self) -> Option<String> {
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

/// [`UrlError::InvalidParameter`]: `name=value` cannot be used, because `reason`.
pub fn invalid(name: &str, value: &str, reason: &str) -> UrlError {
    UrlError::InvalidParameter {
        name: name.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

/// A duration parameter (`lease`, `connect_timeout`, ...): [`crate::parse_duration`],
/// the library's one duration grammar (a whole number and a unit: `500ms`, `5s`, `7d`).
pub fn duration(text: &str) -> Result<Duration, String> {
    crate::parse_duration(text).map_err(|e| match e {
        crate::Error::InvalidInput { reason, .. } => reason,
        other => other.to_string(),
    })
}

/// A positive count (`pool_size`).
pub fn count(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a whole number of at least 1".to_owned()),
    }
}

/// A yes/no switch (`block_in_place`, `migrate`): `true` or `false`.
pub fn boolean(text: &str) -> Result<bool, String> {
    match text {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("expected true or false".to_owned()),
    }
}

/// A feature switch (`group_commit`): `on` or `off` (`true` / `false` also do).
pub fn on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err("expected on or off".to_owned()),
    }
}

/// Where lease time comes from: `server` (the database's clock) or `local` (this
/// machine's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClockChoice {
    Server,
    Local,
}

fn clock(text: &str) -> Result<ClockChoice, String> {
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

    #[test]
    fn unknown_and_repeated_parameters_are_refused() {
        let e = Params::parse(Some("tabel=x"), "sqlite", &["table"]).err();
        assert!(
            matches!(e, Some(UrlError::UnknownParameter { ref name, .. }) if name == "tabel"),
            "{e:?}"
        );
        let e = Params::parse(Some("table=a&table=b"), "sqlite", &["table"]).err();
        assert!(
            matches!(e, Some(UrlError::InvalidParameter { .. })),
            "{e:?}"
        );
        let mut p =
            Params::parse(Some("table=a&charset=utf8"), "x", &["table", "charset"]).unwrap();
        assert_eq!(p.take("table").as_deref(), Some("a"));
        assert_eq!(p.rest().as_deref(), Some("charset=utf8"));
    }

    #[test]
    fn clocks() {
        let mut p = Params::parse(Some("clock=server"), "memory", &["clock"]).unwrap();
        assert!(matches!(
            p.local_clock(),
            Err(UrlError::InvalidParameter { .. })
        ));
        let mut p = Params::parse(Some("clock=local"), "postgres", &["clock"]).unwrap();
        assert!(p.server_or_local_clock().unwrap().is_some());
        let mut p = Params::parse(None, "postgres", &["clock"]).unwrap();
        assert!(p.server_or_local_clock().unwrap().is_none());
    }
}
