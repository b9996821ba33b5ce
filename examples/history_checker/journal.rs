//! What the library logged, and what each worker's acquires and releases
//! came to, kept in memory: a run that fails because a name waited too
//! long prints what happened to that name during the wait, so a failure on
//! a machine nobody can watch explains itself.
//!
//! Kept: the library's events at `info` and above (a node suspect or back,
//! a restart noticed, a repair, a token from the floor, a release that
//! failed), its `debug` events that name a lock (a round won too late or
//! lost for want of a fencing token, a release retried), and the workers'
//! own (`target: "history_checker"`): every acquire that did not grant,
//! with its error, every unlock that failed and every guard dropped. A run
//! makes a few thousand; past [`CAP`] the oldest half is let go.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// How the library marks a round lost for want of a fencing token
/// (`lost_for = "fencing"`, in `quorum::round`).
const FENCING_LOSS: &str = "lost_for=fencing ";

/// The most entries kept.
const CAP: usize = 200_000;

/// The entries, in the order they were logged.
#[derive(Default)]
pub struct Journal {
    entries: Mutex<Vec<(Instant, String)>>,
}

impl Journal {
    /// A layer that writes every event it is given into `journal` (filter
    /// it to what should be kept).
    pub fn layer(journal: &Arc<Journal>) -> JournalLayer {
        JournalLayer(journal.clone())
    }

    /// The entries logged between `from` and `to` that concern `name`: they
    /// name it, or name no lock at all (a node's health, a restart).
    pub fn about(&self, name: &str, from: Instant, to: Instant) -> Vec<(Instant, String)> {
        let lock_field = format!("lock={name} ");
        let entries = self.entries.lock().unwrap();
        entries
            .iter()
            .filter(|(at, _)| (from..=to).contains(at))
            .filter(|(_, line)| line.contains(&lock_field) || !line.contains("lock="))
            .cloned()
            .collect()
    }

    /// How many rounds of `name` that won a quorum were lost for want of a
    /// fencing token between `from` and `to` (the library's debug events
    /// with `lost_for = "fencing"`): the sign of a fencing stall.
    pub fn fencing_losses(&self, name: &str, from: Instant, to: Instant) -> usize {
        self.about(name, from, to)
            .iter()
            .filter(|(_, line)| line.contains(FENCING_LOSS))
            .count()
    }

    /// How many rounds of any lock were lost for want of a fencing token.
    pub fn all_fencing_losses(&self) -> usize {
        let entries = self.entries.lock().unwrap();
        entries
            .iter()
            .filter(|(_, line)| line.contains(FENCING_LOSS))
            .count()
    }

    fn push(&self, line: String) {
        let mut entries = self.entries.lock().unwrap();
        if entries.len() >= CAP {
            entries.drain(..CAP / 2);
        }
        entries.push((Instant::now(), line));
    }
}

/// See [`Journal::layer`].
pub struct JournalLayer(Arc<Journal>);

impl<S: Subscriber> Layer<S> for JournalLayer {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let mut line = Line(format!("{} {}: ", meta.level(), meta.target()));
        event.record(&mut line);
        // Every field ends with a space, so `lock=<name> ` matches whole.
        line.0.push(' ');
        self.0.push(line.0);
    }
}

/// An event written as `message field=value ...`.
struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?} ");
        } else {
            let _ = write!(self.0, "{}={value:?} ", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value} ");
        } else {
            let _ = write!(self.0, "{}={value} ", field.name());
        }
    }
}
