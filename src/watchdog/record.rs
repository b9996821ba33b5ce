//! The record of one owner's holds of one lock on one node, as guards read
//! it: until when the key surely lives, from when it has surely expired,
//! whether it is gone or can no longer be proven. [`Registration`] is one
//! hold's membership (leaving it is how renewal stops); [`Record`] is a
//! read-only view any guard part can keep.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::standing::{Standing, StandingReceiver};
use super::{EntryKey, NodeWatchdog};
use crate::timing;

/// Whether the watchdog renews a hold, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// A fixed lease: never renewed.
    None,
    /// Renewed while held, until this instant if given (a cap on how long
    /// a holder may keep the lock by renewal alone).
    Until(Option<Instant>),
}

/// A granted acquire, as the entry of its lock records it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GrantRecord {
    pub(crate) sent_at: Instant,
    pub(crate) replied_at: Instant,
    /// The key's TTL right after the grant.
    pub(crate) ttl: Duration,
    /// The owner's hold count right after the grant.
    pub(crate) count: u64,
    /// A read-write lock's read hold: it lives by its timeout keys.
    pub(crate) reads: bool,
}

/// One hold's membership in its entry. Dropping it (or [`stop`]ping it)
/// leaves the entry; the last hold out removes it.
///
/// [`stop`]: Registration::stop
pub(crate) struct Registration {
    pub(super) record: Record,
    pub(super) renewal: Renewal,
    pub(super) stopped: bool,
}

/// What an entry says about the key of a hold, readable by anyone holding
/// a copy; it does not keep the hold registered.
#[derive(Clone)]
pub(crate) struct Record {
    pub(super) dog: Arc<NodeWatchdog>,
    pub(super) key: EntryKey,
    /// The entry's id ([`Entry::id`](super::Entry)).
    pub(super) entry: u64,
    /// The entry's [`Standing::breaks`] when this hold joined it.
    pub(super) joined: u64,
    /// A read hold with a fixed lease: until when its own timeout key
    /// surely lives (its grant's, or its latest extension's). A read
    /// hold's key is its own, so a longer hold of the same owner (the
    /// entry's) does not keep it; `None` for other holds, which share
    /// their entry's key.
    pub(super) own: Option<Arc<Mutex<Instant>>>,
    pub(super) standing: StandingReceiver,
}

impl Registration {
    /// What the entry says about this hold.
    pub(crate) fn record(&self) -> &Record {
        &self.record
    }

    /// The watchdog of this hold's node.
    #[cfg(test)]
    pub(crate) fn watchdog(&self) -> Arc<NodeWatchdog> {
        self.record.dog.clone()
    }

    /// Leaves the entry (renewal stops once no hold without a lease is
    /// left) and returns the watchdog, whose [`NodeWatchdog::quiesce`] the
    /// release must await before it is sent.
    pub(crate) fn stop(mut self) -> Arc<NodeWatchdog> {
        self.leave();
        self.record.dog.clone()
    }

    fn leave(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        let now_empty = {
            let record = &self.record;
            let mut entries = record.dog.entries.lock().unwrap();
            // Taken out, and put back unless this was its last hold: one
            // lookup for the usual hold, which is its entry's only one.
            if let Some((key, mut entry)) = entries.by_lock.remove_entry(&record.key) {
                // Only the entry this hold joined: after a loss, the same
                // owner may hold the lock again under a fresh entry.
                if entry.id == record.entry {
                    entry.holds -= 1;
                    if let Renewal::Until(until) = self.renewal
                        && let Some(at) = entry.renew_until.iter().position(|u| *u == until)
                    {
                        entry.renew_until.swap_remove(at);
                    }
                }
                if entry.holds > 0 {
                    entries.by_lock.insert(key, entry);
                }
            }
            entries.by_lock.is_empty() && entries.timer.is_none()
        };
        if now_empty {
            self.record.dog.prune_if_empty();
        }
    }
}

impl Record {
    /// Resolves when the hold is gone, or can no longer be proven: a renewal
    /// found it gone, a fresh grant proved it over, the last renewal was
    /// refused or timed out, or the key's trusted TTL ran out without a
    /// renewal (a fixed lease ended).
    pub(crate) fn lost(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let mut updates = self.standing.clone();
        let (joined, own) = (self.joined, self.own.clone());
        async move {
            loop {
                let standing = updates.borrow_and_update();
                let Some(until) = proven_until(&standing, joined, own.as_deref()) else {
                    return;
                };
                if until <= Instant::now() {
                    return;
                }
                tokio::select! {
                    // A closed channel means the entry was dropped, which
                    // only happens once the hold is gone.
                    changed = updates.changed() => if changed.is_err() { return },
                    // Judged again: an extension may have moved it.
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
        }
    }

    /// Until when this hold is proven: `None` once it is gone, or its proof
    /// broke since it joined (see [`Standing::breaks`]); the instant may
    /// already be past (its trusted TTL ran out). Once `None`, or past,
    /// never again a later instant.
    pub(crate) fn proven_until(&self) -> Option<Instant> {
        proven_until(&self.standing.borrow(), self.joined, self.own.as_deref())
    }

    /// True once this hold is surely over: gone, or its key's TTL has surely
    /// run out. Its field, if present again, belongs to a later hold.
    pub(crate) fn is_over(&self) -> bool {
        let standing = self.standing.borrow();
        standing.gone || Instant::now() >= standing.expired_by
    }

    /// Records that a request sent at `sent_at`, answered at `replied_at`,
    /// left the key with `ttl` (an extension).
    pub(crate) fn record_ttl(&self, sent_at: Instant, replied_at: Instant, ttl: Duration) {
        let entries = self.dog.entries.lock().unwrap();
        if let Some(entry) = entries.by_lock.get(&self.key)
            && entry.id == self.entry
        {
            // An extension proves the field, not a renewal's standing: a
            // hold whose renewal failed stays unproven until one succeeds.
            entry.record_ttl(sent_at, replied_at, ttl, false);
            if let Some(own) = &self.own {
                let mut own = own.lock().unwrap();
                *own = (*own).max(timing::trusted_until(sent_at, ttl));
            }
        }
    }

    /// Until when the key surely lives; `None` once the hold is gone.
    #[cfg(test)]
    pub(crate) fn trusted_until(&self) -> Option<Instant> {
        let standing = self.standing.borrow();
        (!standing.gone).then_some(standing.trusted_until)
    }
}

/// [`Record::proven_until`] of a hold that joined its entry at `joined`
/// breaks, with its own key's trust `own` (a fixed-lease read hold's).
fn proven_until(standing: &Standing, joined: u64, own: Option<&Mutex<Instant>>) -> Option<Instant> {
    let entry = (!standing.gone && !standing.unproven && standing.breaks == joined)
        .then_some(standing.trusted_until)?;
    Some(own.map_or(entry, |own| entry.min(*own.lock().unwrap())))
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.leave();
    }
}
