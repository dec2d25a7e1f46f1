//! For tests: [`Capture`], a `tracing` subscriber that keeps the events and spans it sees.
//!
//! Enabled by the `test-util` feature. The crates of this workspace turn it on for their
//! tests only.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::DefaultGuard;
use tracing::{Event, Level, Metadata, Subscriber};

/// A `tracing` subscriber that keeps every event and span, with their fields.
///
/// Clones share what they saw: install one clone, read the other. Every level is enabled.
///
/// # Examples
///
/// ```
/// use dedup_core::test_util::Capture;
///
/// let capture = Capture::default();
/// let guard = capture.install();
/// tracing::warn!(consumer = "billing", "slow");
/// drop(guard);
/// assert_eq!(capture.seen()[0]["consumer"], "billing");
/// ```
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Seen>>);

/// What a [`Capture`] saw.
#[derive(Default)]
struct Seen {
    events: Vec<Logged>,
    /// Span `n` has id `n + 1`.
    spans: Vec<CapturedSpan>,
}

/// One event as captured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// Its level.
    pub level: Level,
    /// Its fields' values, the message under `message`. A value recorded with `Debug` (a
    /// `?` or `%` field, the message) is its `Debug` text.
    pub fields: BTreeMap<String, String>,
    /// The fields recorded as strings: a formatter quotes and escapes these.
    pub strings: BTreeSet<String>,
}

impl Logged {
    /// The value of field `name`, if the event has it.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    /// Whether field `name` was recorded as a string.
    pub fn is_string(&self, name: &str) -> bool {
        self.strings.contains(name)
    }
}

/// One span as captured: its name, and its fields as last recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedSpan {
    /// Its name.
    pub name: String,
    /// Its fields' values, as [`Logged::fields`].
    pub fields: BTreeMap<String, String>,
}

impl Capture {
    /// Make this capture the subscriber of the current thread until the guard drops.
    pub fn install(&self) -> DefaultGuard {
        tracing::subscriber::set_default(self.clone())
    }

    /// The events seen so far, in order.
    pub fn events(&self) -> Vec<Logged> {
        self.seen_now().events.clone()
    }

    /// The fields of the events of `level` seen so far.
    pub fn at(&self, level: Level) -> Vec<BTreeMap<String, String>> {
        let seen = self.seen_now();
        let at_level = seen.events.iter().filter(|e| e.level == level);
        at_level.map(|e| e.fields.clone()).collect()
    }

    /// The fields of the warnings seen so far.
    pub fn seen(&self) -> Vec<BTreeMap<String, String>> {
        self.at(Level::WARN)
    }

    /// The spans opened so far, in order.
    pub fn spans(&self) -> Vec<CapturedSpan> {
        self.seen_now().spans.clone()
    }

    /// The fields of every span named `name` whose `field` is `value`.
    pub fn find(&self, name: &str, field: &str, value: &str) -> Vec<BTreeMap<String, String>> {
        let seen = self.seen_now();
        let found = seen
            .spans
            .iter()
            .filter(|s| s.name == name && s.fields.get(field).map(String::as_str) == Some(value));
        found.map(|s| s.fields.clone()).collect()
    }

    fn seen_now(&self) -> MutexGuard<'_, Seen> {
        // A test that panicked while holding the lock leaves what it saw readable.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Records fields into a map, noting those recorded as strings.
struct Fields<'a> {
    values: &'a mut BTreeMap<String, String>,
    strings: Option<&'a mut BTreeSet<String>>,
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.values
            .insert(field.name().to_owned(), value.to_owned());
        if let Some(strings) = self.strings.as_deref_mut() {
            strings.insert(field.name().to_owned());
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.values
            .insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields {
            values: &mut fields,
            strings: None,
        });
        let name = attrs.metadata().name().to_owned();
        let mut seen = self.seen_now();
        seen.spans.push(CapturedSpan { name, fields });
        Id::from_u64(seen.spans.len() as u64)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut seen = self.seen_now();
        let index = span.into_u64() as usize - 1;
        if let Some(span) = seen.spans.get_mut(index) {
            values.record(&mut Fields {
                values: &mut span.fields,
                strings: None,
            });
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let (mut fields, mut strings) = (BTreeMap::new(), BTreeSet::new());
        event.record(&mut Fields {
            values: &mut fields,
            strings: Some(&mut strings),
        });
        let level = *event.metadata().level();
        self.seen_now().events.push(Logged {
            level,
            fields,
            strings,
        });
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}
