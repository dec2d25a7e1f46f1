//! Store URLs and the registry of backends that answer them.
//!
//! [`StoreUrl`] parses and checks a URL; a rejected one is a [`UrlError`], and opening
//! fails with an [`OpenError`]. [`backends`] lists the schemes this build answers.
//! [`register`] adds a store crate's [`BackendDescriptor`]. A parsed URL's
//! [`StoreTarget`] downcasts to the backend's own type. [`redact`] masks passwords.
//! [`parse_duration`] reads the durations of URL parameters. [`TlsFiles`] names the PEM
//! files of a TLS connection.

pub use crate::error::{OpenError, RegisterError};
pub use crate::registry::{backends, register};
pub use crate::store_url::StoreUrl;
pub use dedup_core::backend::url::{BackendDescriptor, StoreTarget, UrlError, redact};
pub use dedup_core::{TlsFiles, parse_duration};
