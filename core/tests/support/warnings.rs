//! A small capturing subscriber for this thread only: the events logged, with their levels
//! and fields.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// One event seen: its level and fields (the message under `message`).
type Logged = (Level, BTreeMap<String, String>);

/// The events seen.
#[derive(Clone, Default)]
pub struct Warnings(Arc<Mutex<Vec<Logged>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl Subscriber for Warnings {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), fields));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Warnings {
    /// The warnings seen so far.
    pub fn seen(&self) -> Vec<BTreeMap<String, String>> {
        self.at(Level::WARN)
    }

    /// The events of `level` seen so far.
    pub fn at(&self, level: Level) -> Vec<BTreeMap<String, String>> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|(l, _)| *l == level)
            .map(|(_, fields)| fields.clone())
            .collect()
    }
}
