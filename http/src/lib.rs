#![doc = include_str!("../README.md")]

mod config;
mod identity;
mod key_header;
mod layer;
mod problem;
mod stored;

pub use config::{FingerprintConfig, IdempotencyConfig, Principal, ReleasePolicy, Scope, ScopeFn};
pub use identity::{request_fingerprint, request_key};
pub use key_header::{KeyHeaderError, parse_key};
pub use layer::{Idempotency, IdempotencyLayer, InnerBody, OuterBody};
pub use problem::Problem;
pub use stored::{DecodeError, StoredResponse};
