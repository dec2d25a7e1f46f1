//! The in-process stores, by name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use dedup_core::{Clock, MemoryStore};

/// Every store opened so far, by name.
static STORES: Mutex<Option<HashMap<String, MemoryStore>>> = Mutex::new(None);

/// The store called `name`: a handle sharing its records, made on `clock` (or the system
/// clock) the first time. A later `clock` is not used: the store keeps its first one.
pub(crate) fn named(name: &str, clock: Option<Arc<dyn Clock>>) -> MemoryStore {
    let mut stores = STORES.lock().unwrap_or_else(PoisonError::into_inner);
    stores
        .get_or_insert_with(HashMap::new)
        .entry(name.to_owned())
        .or_insert_with(|| match clock {
            Some(clock) => MemoryStore::with_clock(clock),
            None => MemoryStore::new(),
        })
        .clone()
}
