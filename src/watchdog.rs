//! Lease renewal for locks held without an explicit lease.
//!
//! Per client and node, one timer ticks every `watchdog_timeout / 3` and
//! renews every lock held there in batched script calls (one call per
//! [`RENEW_BATCH_SIZE`] locks). A lock found gone stops being renewed and its
//! guards learn it through `lost()`; a node error is logged and retried on the
//! next tick, and does not touch other nodes' timers. When no renewal could be
//! confirmed until the last confirmed TTL (minus drift) ran out, `lost()`
//! fires too: the holder cannot know the key still exists.
//!
//! No renewal outlives an unlock: the release first removes its entry, then
//! waits for a renewal call already under way ([`NodeWatchdog::quiesce`]),
//! and only then sends the release.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::watch;
use tracing::Instrument;

use crate::node::Node;
use crate::protocol;

/// Locks renewed per script call: one call renews ~500 locks in about 3 ms
/// of server time, during which the node runs nothing else.
pub(crate) const RENEW_BATCH_SIZE: usize = 500;

/// Every node's watchdog of one client.
pub(crate) struct Watchdogs {
    timeout: Duration,
    by_node: Mutex<HashMap<u64, Arc<NodeWatchdog>>>,
}

/// One node's timer and the locks it renews.
pub(crate) struct NodeWatchdog {
    node: Node,
    timeout: Duration,
    entries: Mutex<Entries>,
    /// Held for the length of one renewal batch; see the module docs.
    renewing: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Entries {
    by_lock: HashMap<EntryKey, Entry>,
    timer_running: bool,
}

/// Lock key and hash field: one renewal per (lock, owner), shared by
/// re-entrant holds.
type EntryKey = (String, Arc<str>);

struct Entry {
    holds: usize,
    /// Every renewal's outcome, for the guards of this hold.
    standing: watch::Sender<Standing>,
}

/// What a guard knows about its lock on one node.
#[derive(Clone, Copy)]
struct Standing {
    /// A renewal found the lock gone.
    gone: bool,
    /// The lock may have expired on the node from here on: when the last
    /// request that set its TTL was sent, plus the TTL, minus clock drift.
    expires: Instant,
}

/// A lock part's registration with its node's watchdog. Stopping it (or
/// dropping it) ends the renewal once the last re-entrant hold stops.
pub(crate) struct Renewal {
    dog: Arc<NodeWatchdog>,
    key: EntryKey,
    standing: watch::Receiver<Standing>,
    stopped: bool,
}

impl Watchdogs {
    pub(crate) fn new(timeout: Duration) -> Self {
        Watchdogs {
            timeout,
            by_node: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Starts renewing `key`/`field` on `node`. Call right after the grant.
    pub(crate) fn register(
        &self,
        node: &Node,
        key: &str,
        field: &Arc<str>,
        sent_at: Instant,
    ) -> Renewal {
        let dog = self
            .by_node
            .lock()
            .unwrap()
            .entry(node.id())
            .or_insert_with(|| {
                Arc::new(NodeWatchdog {
                    node: node.clone(),
                    timeout: self.timeout,
                    entries: Mutex::new(Entries::default()),
                    renewing: tokio::sync::Mutex::new(()),
                })
            })
            .clone();
        dog.register((key.to_owned(), field.clone()), sent_at)
    }
}

impl NodeWatchdog {
    /// `sent_at`: when the acquire that set the TTL was sent.
    fn register(self: &Arc<Self>, key: EntryKey, sent_at: Instant) -> Renewal {
        let expires = self.expiry(sent_at);
        let mut entries = self.entries.lock().unwrap();
        let entry = entries.by_lock.entry(key.clone()).or_insert_with(|| Entry {
            holds: 0,
            standing: watch::channel(Standing {
                gone: false,
                expires,
            })
            .0,
        });
        entry
            .standing
            .send_modify(|s| s.expires = s.expires.max(expires));
        entry.holds += 1;
        let standing = entry.standing.subscribe();
        if !entries.timer_running {
            entries.timer_running = true;
            tokio::spawn(
                Timer {
                    dog: Arc::downgrade(self),
                }
                .run(),
            );
        }
        Renewal {
            dog: self.clone(),
            key,
            standing,
            stopped: false,
        }
    }

    /// When a TTL set by a request sent at `sent_at` may have run out.
    fn expiry(&self, sent_at: Instant) -> Instant {
        crate::timing::trusted_until(sent_at, self.timeout)
    }

    /// Waits until no renewal call is under way on this node.
    pub(crate) async fn quiesce(&self) {
        drop(self.renewing.lock().await);
    }

    /// One round: renew every registered lock, in batches. Each batch takes
    /// the `renewing` lock and drops the locks deregistered meanwhile: a lock
    /// deregistered before that is not renewed, and one deregistered after it
    /// waits for this batch only ([`NodeWatchdog::quiesce`]).
    async fn renew_all(&self) {
        let snapshot: Vec<EntryKey> = self
            .entries
            .lock()
            .unwrap()
            .by_lock
            .keys()
            .cloned()
            .collect();
        for chunk in snapshot.chunks(RENEW_BATCH_SIZE) {
            let _batch = self.renewing.lock().await;
            let chunk: Vec<&EntryKey> = {
                let entries = self.entries.lock().unwrap();
                chunk
                    .iter()
                    .filter(|k| entries.by_lock.contains_key(*k))
                    .collect()
            };
            if chunk.is_empty() {
                continue;
            }
            let sent_at = Instant::now();
            let renew = protocol::renew_batch(
                chunk.iter().map(|(key, field)| (key.as_str(), &**field)),
                self.timeout,
            );
            let span = tracing::debug_span!("renew", node = %self.node.addr(), locks = chunk.len());
            let result = self.node.run(&renew).instrument(span.clone()).await;
            let _enter = span.enter();
            match result {
                Ok(renewed) => {
                    tracing::debug!(elapsed_us = sent_at.elapsed().as_micros() as u64, "renewed");
                    let mut entries = self.entries.lock().unwrap();
                    let expires = self.expiry(sent_at);
                    for (key, ok) in chunk.iter().zip(renewed) {
                        if !ok {
                            if let Some(entry) = entries.by_lock.remove(key) {
                                tracing::warn!(lock = %key.0, "lock found gone during renewal");
                                entry.standing.send_modify(|s| s.gone = true);
                            }
                        } else if let Some(entry) = entries.by_lock.get(key) {
                            entry
                                .standing
                                .send_modify(|s| s.expires = s.expires.max(expires));
                        }
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "renewal failed; retrying next tick");
                }
            }
        }
    }
}

impl Renewal {
    /// Resolves when the renewal found the lock gone, or when no renewal
    /// succeeded for so long that the lock may have expired on the node
    /// (the node is unreachable: a partition, a crash).
    pub(crate) async fn lost(&self) {
        let mut updates = self.standing.clone();
        loop {
            let standing = *updates.borrow_and_update();
            if standing.gone {
                return;
            }
            tokio::select! {
                // A closed channel means the entry was dropped, which only
                // happens once the lock is gone.
                changed = updates.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep_until(standing.expires) => return,
            }
        }
    }

    /// True once a renewal found the lock gone: this hold is over for good,
    /// and the field, if present again, belongs to a later hold.
    pub(crate) fn is_gone(&self) -> bool {
        self.standing.borrow().gone
    }

    /// Until when the lock surely lives on its node (its last renewal plus
    /// the lease, less drift); `None` once a renewal found it gone.
    pub(crate) fn trusted_until(&self) -> Option<Instant> {
        let standing = *self.standing.borrow();
        (!standing.gone).then_some(standing.expires)
    }

    /// Stops renewing (the last hold out removes the entry) and returns the
    /// watchdog, whose [`NodeWatchdog::quiesce`] the release must await
    /// before it is sent.
    pub(crate) fn stop(mut self) -> Arc<NodeWatchdog> {
        self.deregister();
        self.dog.clone()
    }

    fn deregister(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        let mut entries = self.dog.entries.lock().unwrap();
        // Only the entry this hold joined: after a loss, the same owner may
        // have taken the lock again under a fresh entry.
        if let Some(entry) = entries.by_lock.get_mut(&self.key)
            && self.standing.same_channel(&entry.standing.subscribe())
        {
            entry.holds -= 1;
            if entry.holds == 0 {
                entries.by_lock.remove(&self.key);
            }
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.deregister();
    }
}

/// The per-node timer. Holds only a weak reference (bb8's reaper pattern) and
/// ends when its node has nothing left to renew, or the client is gone.
struct Timer {
    dog: Weak<NodeWatchdog>,
}

impl Timer {
    async fn run(self) {
        let period = match self.dog.upgrade() {
            Some(dog) => dog.timeout / 3,
            None => return,
        };
        let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(dog) = self.dog.upgrade() else {
                return;
            };
            {
                let mut entries = dog.entries.lock().unwrap();
                if entries.by_lock.is_empty() {
                    entries.timer_running = false;
                    return;
                }
            }
            dog.renew_all().await;
        }
    }
}
