//! What a client knows of its holds on each node, and the renewal of those
//! taken without a lease (the timer and the batches: [`renewal`]).
//!
//! One owner's holds of one lock on one node (the outer hold and its
//! re-entries) share one [`Entry`]: what the key is known to hold for them.
//! Every grant reports the key's TTL after it, so an entry knows until when
//! the key surely lives and from when it has surely expired; every guard part
//! of that lock reads its validity there. So a re-entry that extended the
//! key extends every guard of it, and a fresh grant (hold count 1) proves
//! that the holds of an older entry are over (the key expired or was deleted
//! under them): that entry is marked gone and its guards never release a
//! hold that is not theirs.
//!
//! Per client and node, one timer ticks every `watchdog_timeout / 3` and
//! renews every entry with a hold taken without a lease, in batched script
//! calls (one per [`RENEW_BATCH_SIZE`] entries). A renewal that finds the
//! hold gone marks its entry gone. A renewal the node refused, or did not
//! answer in time, leaves its entries *unproven*: the client can no longer
//! prove those holds (the node may have lost them, or may be cut off and
//! about to let them expire), and their guards count them as lost for good:
//! a later renewal that finds the field renews the key for holds joining
//! the entry afterwards, never for the guards that could not prove their
//! hold meanwhile (nor for those whose trusted TTL ran out before a renewal
//! landed: [`Standing::breaks`]). A renewal that is merely slow but
//! answered in time proves them. A read hold is renewed only while one of
//! its timeout keys lives: its field outlives them. A renewal's reply
//! changes only the entry it was sent for (by [`Entry::id`]), never one the
//! same owner made since for the same key. Renewals go out even to a
//! suspect node: one per tick is what tells. A timer that ended for any
//! reason (its runtime shut down) is started again by the next
//! registration, and a node's watchdog leaves the client once it holds
//! nothing (a lock keeps the one of its node, to register with again:
//! [`KeptWatchdog`]).
//!
//! No renewal outlives an unlock: the release first leaves its entry, then
//! waits for a renewal call already under way ([`NodeWatchdog::quiesce`]),
//! and only then sends the release.

use std::collections::{HashMap, hash_map};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::metrics;
use crate::node::{Node, WeakNode};
use crate::timing;

mod record;
mod renewal;
mod standing;

pub(crate) use record::{GrantRecord, Record, Registration, Renewal};
use renewal::Timer;
use standing::{Standing, StandingSender};

/// Holds renewed per script call: one call renews ~500 holds in about 3 ms
/// of server time, during which the node runs nothing else.
pub(crate) const RENEW_BATCH_SIZE: usize = 500;

/// A client's node watchdogs. A list: a client talks to a handful of
/// nodes, and finding one by its id in a list is cheaper than hashing.
type ByNode = Mutex<Vec<Arc<NodeWatchdog>>>;

/// The watchdog a lock made for its node (the first time the client had
/// none there), kept by the lock (one client, one node) while the
/// client's map lets it go between holds: a
/// lock taken and released in a loop then makes no watchdog per grant (an
/// allocation, its table's, and their frees: with them, registering and
/// leaving were a tenth of a 5-node RedLock's own code per lock+unlock,
/// BENCHMARKS.md).
#[derive(Clone, Default)]
pub(crate) struct KeptWatchdog(OnceLock<Arc<NodeWatchdog>>);

/// The most holds (or rollback records) a watchdog with none left keeps
/// room for.
const KEPT_TABLE: usize = 64;

/// Every node's watchdog of one client.
pub(crate) struct Watchdogs {
    timeout: Duration,
    by_node: Arc<ByNode>,
    /// Rollbacks decided and not yet answered, on every node: when none
    /// are, a request need not look for one of its own ([`PendingRollback`]).
    unanswered: Arc<AtomicUsize>,
}

/// One node's holds and the timer that renews them.
pub(crate) struct NodeWatchdog {
    /// Held weakly: a hold's guard holds the node, so a node every user
    /// dropped has nothing left to renew, and its connections must close.
    node: WeakNode,
    node_id: u64,
    addr: String,
    timeout: Duration,
    /// The client's map, so a watchdog with nothing left removes itself.
    by_node: Weak<ByNode>,
    entries: Mutex<Entries>,
    /// Held for the length of one renewal batch; see the module docs.
    renewing: tokio::sync::Mutex<()>,
    /// Notified whenever a [`PendingRollback`] ends.
    answered: tokio::sync::Notify,
}

#[derive(Default)]
struct Entries {
    by_lock: HashMap<EntryKey, Entry>,
    /// The number the next entry made gets (see [`Entry::id`]).
    next_entry: u64,
    /// The running timer's number, if one runs.
    timer: Option<u64>,
    /// Held by the running timer's task, and gone with it: also when the
    /// task was dropped with its runtime before it ever ran, which leaves
    /// `timer` set (see [`Entries::timer_runs`]).
    timer_task: Weak<()>,
    timers_started: u64,
    /// Rollbacks that may have undone a fresh hold by its count (see
    /// [`Watchdogs::begin_guessing_rollback`]), with when each was sent.
    guessing: Vec<(EntryKey, Instant)>,
    /// One per [`PendingRollback`] alive.
    unanswered: Vec<EntryKey>,
}

impl Entries {
    /// Whether a timer runs: one was started, and its task is still there.
    fn timer_runs(&self) -> bool {
        self.timer.is_some() && self.timer_task.strong_count() > 0
    }

    fn renews_any(&self, now: Instant) -> bool {
        self.by_lock.values().any(|entry| entry.renews_at(now))
    }
}

/// Lock key and hash field: one owner's holds of one lock.
#[derive(Clone, PartialEq, Eq)]
struct EntryKey {
    lock: Arc<str>,
    field: Arc<str>,
}

/// Hashed by the lock key and the end of the field only: the field starts
/// with the client's uuid, the same in every entry, which would be most of
/// the bytes every grant and every release hashes; its end holds the
/// owner. (The lock key alone is not enough: a read lock has many holders
/// at once, whose entries would all share one bucket.)
impl Hash for EntryKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.lock.hash(state);
        let field = self.field.as_bytes();
        field[field.len().saturating_sub(16)..].hash(state);
    }
}

struct Entry {
    /// Which entry of its key this is: a reply to a request about an entry
    /// (a renewal) changes only that entry, never one made for the same
    /// key since (the same owner's next hold, after the first was lost).
    id: u64,
    /// A read-write lock's read holds: they live by their timeout keys,
    /// which their renewal needs alive.
    reads: bool,
    holds: usize,
    /// One per hold taken without a lease: until when it may be renewed
    /// (`None`: for as long as it is held). The entry is renewed while one
    /// of them allows it.
    renew_until: Vec<Option<Instant>>,
    /// Renewal stopped at a cap, and that was said once.
    capped: bool,
    /// When the reply of the latest grant that joined arrived. A fresh grant
    /// sent after it proves this entry's holds over; one sent before it
    /// raced a re-entry and joins.
    last_joined: Instant,
    standing: StandingSender,
}

impl Entry {
    /// Records that a request sent at `sent_at` and answered at
    /// `replied_at` left the key with `ttl`, and, when `proves` (a grant or
    /// a renewal of this entry's field), that the hold is proven again. A
    /// proof that lapsed before this (the key's trusted TTL ran out first)
    /// breaks the holds already in the entry: they could not be proven for
    /// a while, and their guards stay lost (see [`Standing::breaks`]).
    fn record_ttl(&self, sent_at: Instant, replied_at: Instant, ttl: Duration, proves: bool) {
        let trusted_until = timing::trusted_until(sent_at, ttl);
        let expired_by = timing::surely_expired_at(replied_at, ttl);
        let now = Instant::now();
        self.standing.send_modify(|s| {
            if now >= s.trusted_until {
                s.breaks += 1;
            }
            s.trusted_until = s.trusted_until.max(trusted_until);
            s.expired_by = s.expired_by.max(expired_by);
            if proves {
                s.unproven = false;
            }
        });
    }

    /// The hold could not be proven (a renewal refused by an error other
    /// than a refusal in passing, or timed out):
    /// every hold in the entry now is broken for good.
    fn mark_unproven(&self) {
        self.standing.send_if_modified(|s| {
            if s.unproven {
                return false;
            }
            s.unproven = true;
            s.breaks += 1;
            true
        });
    }

    /// Whether a hold of this entry is still to be renewed at `now`.
    fn renews_at(&self, now: Instant) -> bool {
        self.renew_until
            .iter()
            .any(|until| until.is_none_or(|until| now < until))
    }
}

impl Watchdogs {
    pub(crate) fn new(timeout: Duration) -> Self {
        Watchdogs {
            timeout,
            by_node: Arc::new(Mutex::new(Vec::new())),
            unanswered: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Records a hold of `key`/`field` on `node` granted as `grant`, renewed
    /// by the watchdog as `renewal` says. Call right after the grant, with
    /// no await in between.
    ///
    /// `None`: not recorded, because a rollback that may have undone this
    /// very grant was sent after it ([`Watchdogs::begin_guessing_rollback`]);
    /// the caller must roll it back and not trust it. `kept`: what the
    /// registering lock keeps of `node`'s watchdog.
    pub(crate) fn register_kept(
        &self,
        node: &Node,
        key: &Arc<str>,
        field: &Arc<str>,
        grant: GrantRecord,
        renewal: Renewal,
        kept: &KeptWatchdog,
    ) -> Option<Registration> {
        // Registered while the map is locked (then the entries: the order
        // `prune_if_empty` takes them in), so a watchdog being pruned at this
        // moment cannot take this hold with it out of the map.
        let mut by_node = self.by_node.lock().unwrap();
        let dog = self.dog_in(&mut by_node, node, Some(kept));
        let key = EntryKey {
            lock: key.clone(),
            field: field.clone(),
        };
        dog.register(key, grant, renewal)
    }

    /// [`Watchdogs::register_kept`] for a caller that keeps no watchdog.
    #[cfg(test)]
    pub(crate) fn register(
        &self,
        node: &Node,
        key: &Arc<str>,
        field: &Arc<str>,
        grant: GrantRecord,
        renewal: Renewal,
    ) -> Option<Registration> {
        let kept = KeptWatchdog::default();
        self.register_kept(node, key, field, grant, renewal, &kept)
    }

    /// `node`'s watchdog in `by_node`: the one there, else the one `kept`
    /// (put back: empty since it left the map, see `prune_if_empty`), else a
    /// new one, which `kept` then keeps.
    fn dog_in(
        &self,
        by_node: &mut Vec<Arc<NodeWatchdog>>,
        node: &Node,
        kept: Option<&KeptWatchdog>,
    ) -> Arc<NodeWatchdog> {
        if let Some(dog) = by_node.iter().find(|dog| dog.node_id == node.id()) {
            return dog.clone();
        }
        if let Some(dog) = kept.and_then(|kept| kept.0.get()) {
            // A lock's node and client never change.
            debug_assert_eq!(
                dog.node_id,
                node.id(),
                "a lock kept another node's watchdog"
            );
            by_node.push(dog.clone());
            return dog.clone();
        }
        // A watchdog of a dropped node goes: it has nothing to renew.
        by_node.retain(|dog| dog.node.upgrade().is_some());
        let dog = Arc::new(NodeWatchdog {
            node: node.downgrade(),
            node_id: node.id(),
            addr: node.addr().to_owned(),
            timeout: self.timeout,
            by_node: Arc::downgrade(&self.by_node),
            entries: Mutex::new(Entries::default()),
            renewing: tokio::sync::Mutex::new(()),
            answered: tokio::sync::Notify::new(),
        });
        by_node.push(dog.clone());
        if let Some(kept) = kept {
            let _ = kept.0.set(dog.clone());
        }
        dog
    }

    /// Records that a rollback of an acquire of `key`/`field` on `node` is
    /// about to be sent, and returns the holds of that field the client has
    /// on record there (the rollback's `known_holds`).
    ///
    /// The rollback undoes a fresh hold when the server counts more holds
    /// than that; a grant of the same field that was still in flight when
    /// the holds were counted could be the one it undoes. Both happen under
    /// the lock `register` takes, so such a grant either is counted or finds
    /// this record and is refused by `register` (it is then rolled back and
    /// tried again, never trusted). Requests sent after the count wait for
    /// the rollback's answer ([`Watchdogs::rollback_pending`]).
    pub(crate) fn begin_guessing_rollback(
        &self,
        node: &Node,
        key: &Arc<str>,
        field: &Arc<str>,
    ) -> u64 {
        let key = EntryKey {
            lock: key.clone(),
            field: field.clone(),
        };
        // The map, then the entries, as `register` and `prune_if_empty`
        // take them: the record cannot land in a watchdog being pruned.
        let mut by_node = self.by_node.lock().unwrap();
        let dog = self.dog_in(&mut by_node, node, None);
        let now = Instant::now();
        let mut entries = dog.entries.lock().unwrap();
        drop(by_node);
        entries
            .guessing
            .retain(|(_, at)| now.saturating_duration_since(*at) < timing::ROLLBACK_WINDOW);
        entries.guessing.push((key.clone(), now));
        entries
            .by_lock
            .get(&key)
            .filter(|entry| !entry.standing.borrow().gone)
            .map_or(0, |entry| entry.holds as u64)
    }

    /// Marks a rollback of an acquire of `key`/`field` on `node` as decided
    /// and not yet answered, until the returned value is dropped. Meanwhile
    /// [`Watchdogs::rollbacks_answered`] holds back the field's requests.
    ///
    /// Why: the rollback counts the holds on record when it is sent, and
    /// takes any hold above that count for the one it rolls back. A request
    /// of the same field sent after that count, and applied before the
    /// rollback (on another connection, or just before it on the same), is
    /// such a hold: the rollback would undo a grant its owner trusts.
    ///
    /// A release finishing in the background (a dropped guard's, the rest
    /// of a quorum unlock) is marked the same way, for the same reason: its
    /// owner's next request must not be overtaken by it.
    pub(crate) fn rollback_pending(
        &self,
        node: &Node,
        key: &Arc<str>,
        field: &Arc<str>,
    ) -> PendingRollback {
        let key = EntryKey {
            lock: key.clone(),
            field: field.clone(),
        };
        let mut by_node = self.by_node.lock().unwrap();
        let dog = self.dog_in(&mut by_node, node, None);
        let mut entries = dog.entries.lock().unwrap();
        drop(by_node);
        entries.unanswered.push(key.clone());
        drop(entries);
        self.unanswered.fetch_add(1, Ordering::AcqRel);
        PendingRollback {
            dog,
            key,
            unanswered: self.unanswered.clone(),
        }
    }

    /// Waits until no rollback of `key`/`field` on `node` is pending (see
    /// [`Watchdogs::rollback_pending`]). At once when none is pending on
    /// any node, as nearly always.
    ///
    /// Cancel safe: it only waits.
    pub(crate) async fn rollbacks_answered(&self, node: &Node, key: &str, field: &str) {
        if self.none_unanswered() {
            return;
        }
        let Some(dog) = self
            .by_node
            .lock()
            .unwrap()
            .iter()
            .find(|dog| dog.node_id == node.id())
            .cloned()
        else {
            return;
        };
        loop {
            let answered = dog.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            let pending = dog
                .entries
                .lock()
                .unwrap()
                .unanswered
                .iter()
                .any(|pending| &*pending.lock == key && &*pending.field == field);
            if !pending {
                return;
            }
            answered.await;
        }
    }

    /// Whether no rollback of this client is waiting for its answer, on
    /// any node: then [`Watchdogs::rollbacks_answered`] has nothing to wait
    /// for, and a caller can skip its timer.
    pub(crate) fn none_unanswered(&self) -> bool {
        self.unanswered.load(Ordering::Acquire) == 0
    }

    /// Nodes with a watchdog (holds or a running timer), for tests.
    #[cfg(test)]
    fn nodes(&self) -> usize {
        self.by_node.lock().unwrap().len()
    }
}

impl NodeWatchdog {
    fn register(
        self: &Arc<Self>,
        key: EntryKey,
        grant: GrantRecord,
        renewal: Renewal,
    ) -> Option<Registration> {
        let trusted_until = timing::trusted_until(grant.sent_at, grant.ttl);
        let expired_by = timing::surely_expired_at(grant.replied_at, grant.ttl);
        let mut entries = self.entries.lock().unwrap();
        if !entries.guessing.is_empty()
            && entries
                .guessing
                .iter()
                .any(|(guessed, at)| *at >= grant.sent_at && *guessed == key)
        {
            tracing::debug!(lock = %key.lock, "a rollback sent after this grant may have undone it: not trusted");
            return None;
        }
        let id = entries.next_entry;
        entries.next_entry += 1;
        let fresh = || Entry {
            id,
            reads: grant.reads,
            holds: 0,
            renew_until: Vec::new(),
            capped: false,
            last_joined: grant.replied_at,
            standing: StandingSender::new(Standing {
                gone: false,
                trusted_until,
                expired_by,
                unproven: false,
                breaks: 0,
            }),
        };
        // One lookup: this runs for every grant.
        let entry = match entries.by_lock.entry(key.clone()) {
            hash_map::Entry::Vacant(slot) => slot.insert(fresh()),
            hash_map::Entry::Occupied(slot)
                if grant.count == 1 && slot.get().last_joined < grant.sent_at =>
            {
                // The field was absent when this grant ran: whatever this
                // entry held is over, and its guards must not release the
                // new hold.
                tracing::debug!(lock = %key.lock, "a fresh grant proves an older hold over");
                metrics::lost_hold(&self.addr);
                let entry = slot.into_mut();
                let stale = std::mem::replace(entry, fresh());
                stale.standing.send_modify(|s| s.gone = true);
                entry
            }
            hash_map::Entry::Occupied(slot) => {
                let entry = slot.into_mut();
                entry.last_joined = entry.last_joined.max(grant.replied_at);
                // The grant found the field: it proves the hold.
                entry.record_ttl(grant.sent_at, grant.replied_at, grant.ttl, true);
                entry
            }
        };
        entry.holds += 1;
        if let Renewal::Until(until) = renewal {
            entry.renew_until.push(until);
            entry.capped = false;
        }
        let standing = entry.standing.subscribe();
        let (entry_id, joined) = (entry.id, standing.borrow().breaks);
        if renewal != Renewal::None && !entries.timer_runs() {
            entries.timers_started += 1;
            entries.timer = Some(entries.timers_started);
            let task = Arc::new(());
            entries.timer_task = Arc::downgrade(&task);
            tokio::spawn(
                Timer {
                    dog: Arc::downgrade(self),
                    number: entries.timers_started,
                    _task: task,
                }
                .run(),
            );
        }
        Some(Registration {
            record: Record {
                dog: self.clone(),
                key,
                entry: entry_id,
                joined,
                own: (grant.reads && renewal == Renewal::None)
                    .then(|| Arc::new(Mutex::new(trusted_until))),
                standing,
            },
            renewal,
            stopped: false,
        })
    }

    /// Waits until no renewal call is under way on this node.
    pub(crate) async fn quiesce(&self) {
        drop(self.renewing.lock().await);
    }

    /// Holds this node's renewal lock, as a renewal batch under way does.
    #[cfg(test)]
    pub(crate) async fn renewal_under_way(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.renewing.lock().await
    }

    /// Removes this watchdog from its client's map when it holds nothing and
    /// no timer runs, so a client does not keep every node it ever held on
    /// alive. Lock order: the map, then the entries (as in `register`).
    fn prune_if_empty(self: &Arc<Self>) {
        let Some(by_node) = self.by_node.upgrade() else {
            return;
        };
        let mut by_node = by_node.lock().unwrap();
        let mut entries = self.entries.lock().unwrap();
        // A record of a guessing rollback matters for grants in flight when
        // it was sent; past the rollback window there are none.
        if !entries.guessing.is_empty() {
            let now = Instant::now();
            entries
                .guessing
                .retain(|(_, at)| now.saturating_duration_since(*at) < timing::ROLLBACK_WINDOW);
        }
        if entries.by_lock.is_empty()
            && !entries.timer_runs()
            && entries.guessing.is_empty()
            && entries.unanswered.is_empty()
            && let Some(at) = by_node.iter().position(|dog| Arc::ptr_eq(dog, self))
        {
            by_node.swap_remove(at);
            // A lock may keep this watchdog (`KeptWatchdog`): not the room
            // of a crowd of holds or rollbacks gone by.
            if entries.by_lock.capacity() > KEPT_TABLE {
                entries.by_lock = HashMap::new();
            }
            entries.guessing.shrink_to(KEPT_TABLE);
            entries.unanswered.shrink_to(KEPT_TABLE);
        }
    }
}

/// A rollback decided and not yet answered ([`Watchdogs::rollback_pending`]):
/// dropped once the server answered it, or it gave up.
pub(crate) struct PendingRollback {
    dog: Arc<NodeWatchdog>,
    key: EntryKey,
    unanswered: Arc<AtomicUsize>,
}

impl Drop for PendingRollback {
    fn drop(&mut self) {
        let mut entries = self.dog.entries.lock().unwrap();
        if let Some(at) = entries.unanswered.iter().position(|key| *key == self.key) {
            entries.unanswered.swap_remove(at);
        }
        drop(entries);
        self.unanswered.fetch_sub(1, Ordering::AcqRel);
        // The watchdog may have been made for this alone.
        self.dog.prune_if_empty();
        self.dog.answered.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
