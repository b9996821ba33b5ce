//! What a client knows of the fencing counters of the names it fenced with
//! a multi-node lock, node by node: the last value seen, the node's
//! restarts, and which counters await repair.
//!
//! A node's counter of a name is *unrepaired* once the client sees that
//! the node restarted since it last saw or repaired it: its `run_id`
//! changed (the node's generation moved on), or the counter is missing or
//! lower than seen. An unrepaired counter proves nothing (it is left out of
//! every settlement's witnesses), and a repair task of the client's
//! ([`super::repair`]) raises it to the highest of enough witnesses, in the
//! background, at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::time::Instant;

use super::repair::NodeRepairs;
use super::rules;
use crate::node::{Lane, Node};
use crate::protocol::LockKeys;

/// A multi-node fenced lock, as fencing needs it: where each node's
/// counter is, and the quorum.
#[derive(Clone)]
pub(crate) struct Group {
    pub(crate) parts: Arc<[Part]>,
    pub(crate) required: usize,
}

/// One node's counter of a fenced lock: the node, the lock's keys, and the
/// lane its requests take there.
#[derive(Clone)]
pub(crate) struct Part {
    pub(crate) node: Node,
    pub(crate) keys: LockKeys,
    pub(crate) lane: Lane,
}

impl Part {
    pub(crate) fn node(&self) -> &Node {
        &self.node
    }

    pub(crate) fn keys(&self) -> &LockKeys {
        &self.keys
    }

    pub(crate) fn lane(&self) -> Lane {
        self.lane
    }

    pub(crate) fn name(&self) -> &str {
        &self.keys.name
    }
}

/// One client's record of fencing counters.
#[derive(Default)]
pub(crate) struct FenceBook {
    nodes: Mutex<HashMap<u64, NodeBook>>,
    /// Settlements under way in this client, by name: a repair of the name
    /// waits for them (see [`FenceBook::settling`]).
    settling: Mutex<HashMap<Arc<str>, usize>>,
}

/// A settlement under way ([`FenceBook::settling`]), until dropped.
pub(crate) struct Settling {
    book: Arc<FenceBook>,
    name: Arc<str>,
}

impl Drop for Settling {
    fn drop(&mut self) {
        let mut settling = self.book.settling.lock().unwrap();
        if let Some(count) = settling.get_mut(&self.name) {
            *count -= 1;
            if *count == 0 {
                settling.remove(&self.name);
            }
        }
    }
}

#[derive(Default)]
struct NodeBook {
    names: HashMap<Arc<str>, Seen>,
    /// The node's repair task runs.
    repairing: bool,
    /// The node's watch task runs.
    watched: bool,
}

/// One counter (a name on a node) as the client knows it.
struct Seen {
    /// The node's generation when the counter was last seen intact.
    generation: u64,
    /// The highest value seen since (or written by a repair).
    last: Option<u64>,
    /// When the reply that showed `last` was read: a reading sent before
    /// that may have run before it on the server.
    last_read_at: Option<Instant>,
    unrepaired: bool,
    group: Group,
}

/// A counter to repair: the part (its node and name), the lock it belongs
/// to, and the node's generation the repair started from.
pub(crate) struct Work {
    pub(crate) part: Part,
    pub(crate) group: Group,
    pub(crate) generation: u64,
}

impl FenceBook {
    /// Records what a reply from `part`'s node, to a request sent at
    /// `sent_at`, said of its counter (`None`: missing), for a name fenced
    /// by `group`, and returns whether the counter is intact (a witness, if
    /// present). A restart seen here starts the node's repair.
    ///
    /// Replies are read in the order they come, not the order the server
    /// ran them: a reading lower than (or missing beside) a value shown by
    /// a reply read after this request was sent may have run before that
    /// value was written. It proves no restart, and it is no witness.
    pub(crate) fn observe(
        self: &Arc<Self>,
        part: &Part,
        group: &Group,
        counter: Option<u64>,
        sent_at: Instant,
    ) -> bool {
        let node = part.node();
        let generation = node.generation();
        let mut nodes = self.nodes.lock().unwrap();
        let name = &part.keys().name;
        let seen_elsewhere = nodes.iter().any(|(id, book)| {
            *id != node.id() && book.names.get(name).is_some_and(|s| s.last.is_some())
        });
        let book = nodes.entry(node.id()).or_default();
        let seen = book.names.entry(name.clone()).or_insert_with(|| Seen {
            generation,
            last: None,
            last_read_at: None,
            unrepaired: false,
            group: group.clone(),
        });
        let restarted = seen.generation != generation;
        let overtaken = seen.last.is_some()
            && counter < seen.last
            && seen.last_read_at.is_some_and(|at| sent_at < at);
        if !restarted && overtaken {
            tracing::debug!(lock = %part.name(), node = %node.addr(), "a counter reading overtaken by a later one: not a witness");
            return false;
        }
        if restarted || rules::counter_needs_repair(seen.last, counter, seen_elsewhere) {
            if !seen.unrepaired {
                if restarted || seen.last.is_some() {
                    tracing::info!(lock = %part.name(), node = %node.addr(), "the node lost its fencing counter (it restarted); repairing it");
                } else {
                    tracing::debug!(lock = %part.name(), node = %node.addr(), "the node has no fencing counter of this lock; filling it in");
                }
            }
            seen.unrepaired = true;
        }
        if seen.unrepaired {
            self.start_repairs(book, node);
            return false;
        }
        if counter.is_some() && counter >= seen.last {
            seen.last_read_at = Some(Instant::now());
        }
        seen.last = seen.last.max(counter);
        true
    }

    /// Marks a settlement of `name` under way until the value is dropped.
    /// A repair reads its witnesses while counters are being raised to a
    /// token it cannot know, and would seed a restarted node below it (a
    /// value no earlier token exceeds, so safe, but below the token just
    /// handed out): it waits until the settlement is over, then reads the
    /// raised counters.
    pub(crate) fn settling(self: &Arc<Self>, name: &Arc<str>) -> Settling {
        *self
            .settling
            .lock()
            .unwrap()
            .entry(name.clone())
            .or_default() += 1;
        Settling {
            book: self.clone(),
            name: name.clone(),
        }
    }

    /// Whether a settlement of `name` is under way in this client.
    pub(crate) fn is_settling(&self, name: &str) -> bool {
        self.settling.lock().unwrap().contains_key(name)
    }

    /// Whether `part`'s counter is intact, as far as the client knows.
    pub(crate) fn is_intact(&self, part: &Part) -> bool {
        let node = part.node();
        let nodes = self.nodes.lock().unwrap();
        nodes
            .get(&node.id())
            .and_then(|book| book.names.get(&part.keys().name))
            .is_none_or(|seen| !seen.unrepaired && seen.generation == node.generation())
    }

    /// Whether the client has seen a counter of `name` anywhere (a name it
    /// has fenced before).
    pub(crate) fn has_seen(&self, name: &str) -> bool {
        let nodes = self.nodes.lock().unwrap();
        nodes
            .values()
            .any(|book| book.names.get(name).is_some_and(|seen| seen.last.is_some()))
    }

    /// The node restarted (its generation moved on): every counter of it
    /// awaits repair.
    pub(crate) fn node_restarted(self: &Arc<Self>, node: &Node) {
        let generation = node.generation();
        let mut nodes = self.nodes.lock().unwrap();
        let Some(book) = nodes.get_mut(&node.id()) else {
            return;
        };
        let mut any = false;
        for seen in book.names.values_mut() {
            if seen.generation != generation {
                seen.unrepaired = true;
            }
            any |= seen.unrepaired;
        }
        if any {
            self.start_repairs(book, node);
        }
    }

    /// The counters of `node` awaiting repair.
    pub(crate) fn unrepaired(&self, node: &Node) -> Vec<Work> {
        let generation = node.generation();
        let nodes = self.nodes.lock().unwrap();
        let Some(book) = nodes.get(&node.id()) else {
            return Vec::new();
        };
        book.names
            .values()
            .filter(|seen| seen.unrepaired)
            .filter_map(|seen| {
                let part = seen
                    .group
                    .parts
                    .iter()
                    .find(|l| l.node().id() == node.id())?;
                Some(Work {
                    part: part.clone(),
                    group: seen.group.clone(),
                    generation,
                })
            })
            .collect()
    }

    /// A repair of `work` wrote `value`, and the node did not restart since
    /// it started: the counter is intact again.
    pub(crate) fn repaired(&self, work: &Work, value: Option<u64>) {
        let node = work.part.node();
        let mut nodes = self.nodes.lock().unwrap();
        let Some(seen) = nodes
            .get_mut(&node.id())
            .and_then(|book| book.names.get_mut(&work.part.keys().name))
        else {
            return;
        };
        if node.generation() == work.generation {
            seen.unrepaired = false;
            seen.generation = work.generation;
            seen.last = value;
            tracing::info!(lock = %work.part.name(), node = %node.addr(), counter = ?value, "fencing counter repaired");
        }
    }

    /// A seal of a settled token landed on `part`'s node, sent while the
    /// node was in `generation`: a counter awaiting repair there is
    /// repaired (the token is above every counter of the proof that
    /// settled it, which is all a repair would write), unless the node
    /// restarted since.
    pub(crate) fn sealed(&self, part: &Part, generation: u64, value: Option<u64>) {
        let node = part.node();
        let mut nodes = self.nodes.lock().unwrap();
        let Some(seen) = nodes
            .get_mut(&node.id())
            .and_then(|book| book.names.get_mut(&part.keys().name))
        else {
            return;
        };
        if seen.unrepaired && node.generation() == generation {
            seen.unrepaired = false;
            seen.generation = generation;
            seen.last = value;
            tracing::info!(lock = %part.name(), node = %node.addr(), counter = ?value, "fencing counter repaired by a seal");
        }
    }

    /// Marks the repair task of `node` stopped, unless there is work left
    /// (then it goes on: `false`).
    pub(crate) fn repairs_done(&self, node: &Node) -> bool {
        let mut nodes = self.nodes.lock().unwrap();
        let Some(book) = nodes.get_mut(&node.id()) else {
            return true;
        };
        if book.names.values().any(|seen| seen.unrepaired) {
            return false;
        }
        book.repairing = false;
        true
    }

    fn start_repairs(self: &Arc<Self>, book: &mut NodeBook, node: &Node) {
        if book.repairing {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        book.repairing = true;
        runtime.spawn(
            NodeRepairs {
                book: Arc::downgrade(self),
                node: node.clone(),
            }
            .run(),
        );
    }

    /// Watches every node of `group` for restarts, from now on (once per
    /// node): a node that restarts while the client is idle is repaired
    /// too, before a grant needs it.
    pub(crate) fn watch(self: &Arc<Self>, group: &Group) {
        let mut nodes = self.nodes.lock().unwrap();
        for lock in group.parts.iter() {
            let node = lock.node();
            let book = nodes.entry(node.id()).or_default();
            if book.watched {
                continue;
            }
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                book.watched = true;
                runtime.spawn(super::repair::watch(Arc::downgrade(self), node.clone()));
            }
        }
    }
}

/// A weak handle, for the tasks that must end with the client.
pub(crate) type WeakBook = Weak<FenceBook>;

impl std::fmt::Debug for FenceBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceBook").finish_non_exhaustive()
    }
}
