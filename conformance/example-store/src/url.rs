//! `example:NAME[?clock=local]`: the descriptor, its parser, and what a URL opens.

use std::sync::Arc;

use async_trait::async_trait;
use dedup_core::backend::url::{
    BackendDescriptor, OpenTarget, Params, StoreTarget, UrlError, UrlParts, malformed,
};
use dedup_core::{Admin, Clock, Result};

use crate::stores;

/// The store's part in store URLs. Give it to `dedup::register` before opening one.
pub static DESCRIPTOR: BackendDescriptor = BackendDescriptor {
    name: "example",
    schemes: &["example"],
    forms: &["example:NAME"],
    parse,
    has_schema: false,
    has_outbox: false,
};

/// What an `example:` URL opens: the in-process store called `name`.
#[derive(Clone, Debug)]
pub struct ExampleTarget {
    /// The store's name.
    pub name: String,
    /// The clock for lease arithmetic, used when the store is made (`None`: the system
    /// clock).
    pub clock: Option<Arc<dyn Clock>>,
}

/// Checks the whole URL: a name of letters, digits, `_`, `-` and `.`, and no parameter
/// but `clock=local`. Nothing is opened.
fn parse(url: &UrlParts<'_>) -> std::result::Result<StoreTarget, UrlError> {
    let name = url.rest;
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_-.".contains(c);
    if name.is_empty() || !name.chars().all(allowed) {
        return Err(malformed(format!(
            "example:NAME takes a name of letters, digits, `_`, `-` and `.`, not {name:?}"
        )));
    }
    let mut params = Params::parse(url.query, "example", &["clock"])?;
    let clock = params.local_clock()?;
    Ok(StoreTarget::new(ExampleTarget {
        name: name.to_owned(),
        clock,
    }))
}

#[async_trait]
impl OpenTarget for ExampleTarget {
    fn descriptor(&self) -> &'static BackendDescriptor {
        &DESCRIPTOR
    }

    fn location(&self) -> String {
        format!("the in-process store {}", self.name)
    }

    fn set_clock(&mut self, clock: Arc<dyn Clock>) {
        self.clock = Some(clock);
    }

    fn clone_target(&self) -> Box<dyn OpenTarget> {
        Box::new(self.clone())
    }

    async fn open_admin(self: Box<Self>) -> Result<Arc<dyn Admin>> {
        Ok(Arc::new(stores::named(&self.name, self.clock)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: &str) -> std::result::Result<StoreTarget, UrlError> {
        parse(&UrlParts::split(url).expect("a scheme"))
    }

    #[test]
    fn a_name_and_the_clock_parameter_are_taken() {
        let target = parsed("example:billing-1?clock=local").unwrap();
        let target = target.downcast_ref::<ExampleTarget>().unwrap();
        assert_eq!(target.name, "billing-1");
        assert!(target.clock.is_none(), "this machine's clock");
    }

    #[test]
    fn a_bad_name_or_parameter_is_refused() {
        for url in ["example:", "example:a/b", "example://x"] {
            assert!(
                matches!(parsed(url), Err(UrlError::Malformed { .. })),
                "{url}"
            );
        }
        assert!(matches!(
            parsed("example:a?tabel=x"),
            Err(UrlError::UnknownParameter { .. })
        ));
        assert!(matches!(
            parsed("example:a?clock=server"),
            Err(UrlError::InvalidParameter { .. })
        ));
    }
}
