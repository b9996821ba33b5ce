//! What the library logged, and what each worker's acquires and releases
//! came to, kept in memory: a run that fails because a name waited too
//! long prints what happened to that name during the wait, so a failure on
//! a machine nobody can watch explains itself.
//!
//! Kept: the library's events at `info` and above (a node suspect or back,
//! a restart noticed, a repair, a token from the floor, a release that
//! failed), its `debug` events that name a lock (a round won too late or
//! lost for want of a fencing token, a release or a rollback retried), and
//! the workers' own (`target: "history_checker"`): every acquire that did
//! not grant, with its error, every unlock that failed and every guard
//! dropped. A run makes a few thousand; past [`CAP`] the oldest half is let
//! go, and the report says so.
//!
//! The fields a judgement rests on are read as fields, not found in the
//! printed line: the lock an event names (`lock`) and whether it marks a
//! round lost for want of a fencing token (`lost_for = "fencing"`, in the
//! library's `quorum::round`).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// The most entries kept.
const CAP: usize = 200_000;

/// One event, as kept.
#[derive(Clone)]
pub struct Entry {
    pub at: Instant,
    /// `LEVEL target: message field=value ...`.
    pub line: String,
    /// The lock the event names, if any.
    lock: Option<String>,
    /// Whether it marks a round lost for want of a fencing token.
    fencing_loss: bool,
    /// Whether the library logged it (not a worker of this checker).
    from_library: bool,
}

/// The entries, in the order they were logged.
#[derive(Default)]
pub struct Journal {
    entries: Mutex<Vec<Entry>>,
    /// Entries let go past [`CAP`].
    dropped: Mutex<usize>,
}

impl Journal {
    /// A layer that writes every event it is given into `journal` (filter
    /// it to what should be kept).
    pub fn layer(journal: &Arc<Journal>) -> JournalLayer {
        JournalLayer(journal.clone())
    }

    /// The entries logged between `from` and `to` that concern `name`: they
    /// name it, or name no lock at all (a node's health, a restart).
    pub fn about(&self, name: &str, from: Instant, to: Instant) -> Vec<Entry> {
        let entries = self.entries.lock().unwrap();
        entries
            .iter()
            .filter(|e| (from..=to).contains(&e.at))
            .filter(|e| e.lock.as_deref().is_none_or(|lock| lock == name))
            .cloned()
            .collect()
    }

    /// How many rounds of `name` that won a quorum were lost for want of a
    /// fencing token between `from` and `to`: the sign of a fencing stall.
    pub fn fencing_losses(&self, name: &str, from: Instant, to: Instant) -> usize {
        let entries = self.entries.lock().unwrap();
        entries
            .iter()
            .filter(|e| e.fencing_loss && e.lock.as_deref() == Some(name))
            .filter(|e| (from..=to).contains(&e.at))
            .count()
    }

    /// How many rounds of any lock were lost for want of a fencing token.
    pub fn all_fencing_losses(&self) -> usize {
        let entries = self.entries.lock().unwrap();
        entries.iter().filter(|e| e.fencing_loss).count()
    }

    /// How many of the library's events were kept: none in a run with
    /// chaos means the journal's wiring broke, and the judgements that
    /// read it would pass for want of evidence.
    pub fn library_events(&self) -> usize {
        let entries = self.entries.lock().unwrap();
        entries.iter().filter(|e| e.from_library).count()
    }

    /// How many entries were let go past [`CAP`].
    pub fn dropped(&self) -> usize {
        *self.dropped.lock().unwrap()
    }

    fn push(&self, entry: Entry) {
        let mut entries = self.entries.lock().unwrap();
        if entries.len() >= CAP {
            entries.drain(..CAP / 2);
            *self.dropped.lock().unwrap() += CAP / 2;
        }
        entries.push(entry);
    }
}

/// See [`Journal::layer`].
pub struct JournalLayer(Arc<Journal>);

impl<S: Subscriber> Layer<S> for JournalLayer {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields {
            line: format!("{} {}: ", meta.level(), meta.target()),
            lock: None,
            lost_for: None,
        };
        event.record(&mut fields);
        self.0.push(Entry {
            at: Instant::now(),
            line: fields.line,
            fencing_loss: fields.lost_for.as_deref() == Some("fencing"),
            lock: fields.lock,
            from_library: meta.target().starts_with("multilock::"),
        });
    }
}

/// An event's fields: written as `message field=value ...`, and the two
/// the judgements read.
struct Fields {
    line: String,
    lock: Option<String>,
    lost_for: Option<String>,
}

impl Fields {
    fn keep(&mut self, field: &Field, value: String) {
        match field.name() {
            "message" => {
                let _ = write!(self.line, "{value} ");
                return;
            }
            // A `?value` of a string comes quoted.
            "lock" => self.lock = Some(value.trim_matches('"').to_owned()),
            "lost_for" => self.lost_for = Some(value.trim_matches('"').to_owned()),
            _ => {}
        }
        let _ = write!(self.line, "{}={value} ", field.name());
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.keep(field, format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.keep(field, value.to_owned());
    }
}
