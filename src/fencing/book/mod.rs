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
//!
//! The book is bounded by what is in use: a name no request touched for
//! [`FORGET_AFTER`] is forgotten (unless a repair of it is pending), and
//! it holds nodes weakly: a node every user dropped is let go, with its
//! connections, and forgotten. Forgetting is safe: the client then knows
//! the name as one that never fenced it does, which the protocol allows
//! for. It costs the eager repair of that name's counters after a restart
//! (the name's next grant repairs them instead), and with it the proof
//! of that grant's token (see `crate::fencing`'s design notes).
//!
//! The book and [`super::repair`] import each other, and are allowed to
//! (`.ci/module-graph.sh`): one concern, the counters awaiting repair. The
//! book starts the repair and watch tasks of a node; they work off its
//! unrepaired entries and write back what they repaired.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::repair::{self, NodeRepairs};
use super::rules;
use crate::node::{Lane, Node, WeakNode};
use crate::protocol::LockKeys;
use crate::running::{Alive, Running};

/// How long a name no request touched is remembered: longer than requests
/// are in flight at the default timeouts (a reply read later is read as a
/// client that never saw the name reads it, which is safe), and long
/// enough that the names a service keeps using stay repaired eagerly.
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(10);

/// A multi-node fenced lock, as fencing needs it: where each node's
/// counter is, and the quorum.
#[derive(Clone)]
pub(crate) struct Group {
    pub(crate) parts: Arc<[Part]>,
    pub(crate) required: usize,
    /// The same, as the book remembers it (without holding the nodes).
    shape: Arc<Shape>,
}

impl Group {
    pub(crate) fn new(parts: Arc<[Part]>, required: usize) -> Group {
        let shape = Arc::new(Shape {
            nodes: parts.iter().map(|part| part.node().id()).collect(),
            required,
        });
        Group {
            parts,
            required,
            shape,
        }
    }
}

/// A fenced lock's nodes (by id, in order) and quorum, held by the book
/// for its repairs.
struct Shape {
    nodes: Box<[u64]>,
    required: usize,
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
    /// The counter of lock `name` on `node` (every lock kind's counter is
    /// the same key).
    fn of(node: Node, name: &str) -> Part {
        Part {
            node,
            keys: LockKeys::new(name),
            lane: Lane::of(name),
        }
    }

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
pub(crate) struct FenceBook {
    nodes: Mutex<Nodes>,
    /// Settlements under way in this client, by name: a repair of the name
    /// waits for them (see [`FenceBook::settling`]), and the name is not
    /// forgotten meanwhile.
    settling: Mutex<HashMap<Arc<str>, usize>>,
    /// [`FORGET_AFTER`], shorter in unit tests.
    forget_after: Duration,
    /// How long a counter lives without a settlement or repair of its name
    /// (`None`: for ever): every raise renews it.
    pub(crate) counter_expiry: Option<Duration>,
}

impl FenceBook {
    pub(crate) fn new(counter_expiry: Option<Duration>) -> FenceBook {
        FenceBook {
            nodes: Mutex::default(),
            settling: Mutex::default(),
            forget_after: FORGET_AFTER,
            counter_expiry,
        }
    }
}

impl Default for FenceBook {
    fn default() -> FenceBook {
        FenceBook::new(None)
    }
}

#[derive(Default)]
struct Nodes {
    by_id: HashMap<u64, NodeBook>,
    /// When idle names and dropped nodes were last let go.
    swept: Option<Instant>,
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

/// What the client knows of one node's counters.
struct NodeBook {
    node: WeakNode,
    names: HashMap<Arc<str>, Seen>,
    /// How many of `names` await repair.
    unrepaired: usize,
    /// The node's repair task.
    repairs: Running,
    /// The node's watch task.
    watch: Running,
}

impl NodeBook {
    fn new(node: &Node) -> NodeBook {
        NodeBook {
            node: node.downgrade(),
            names: HashMap::new(),
            unrepaired: 0,
            repairs: Running::new(),
            watch: Running::new(),
        }
    }
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
    /// When a request last touched the counter.
    used: Instant,
    shape: Arc<Shape>,
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
        let now = Instant::now();
        let mut nodes = self.nodes.lock().unwrap();
        self.sweep_if_due(&mut nodes, now);
        let name = &part.keys().name;
        let seen_elsewhere = nodes.by_id.iter().any(|(id, book)| {
            *id != node.id() && book.names.get(name).is_some_and(|s| s.last.is_some())
        });
        let book = nodes
            .by_id
            .entry(node.id())
            .or_insert_with(|| NodeBook::new(node));
        let seen = book.names.entry(name.clone()).or_insert_with(|| Seen {
            generation,
            last: None,
            last_read_at: None,
            unrepaired: false,
            used: now,
            shape: group.shape.clone(),
        });
        seen.used = now;
        let restarted = seen.generation != generation;
        let overtaken = seen.last.is_some()
            && counter < seen.last
            && seen.last_read_at.is_some_and(|at| sent_at < at);
        if !restarted && overtaken {
            tracing::debug!(lock = %part.name(), node = %node.addr(), "a counter reading overtaken by a later one: not a witness");
            return false;
        }
        let needs_repair =
            restarted || rules::counter_needs_repair(seen.last, counter, seen_elsewhere);
        if needs_repair && !seen.unrepaired {
            if restarted || seen.last.is_some() {
                tracing::info!(lock = %part.name(), node = %node.addr(), "the node lost its fencing counter (it restarted); repairing it");
            } else {
                tracing::debug!(lock = %part.name(), node = %node.addr(), "the node has no fencing counter of this lock; filling it in");
            }
            seen.unrepaired = true;
            book.unrepaired += 1;
        }
        let intact = !seen.unrepaired;
        if intact {
            if counter.is_some() && counter >= seen.last {
                seen.last_read_at = Some(now);
            }
            seen.last = seen.last.max(counter);
        }
        // Any request may find the node's repair ended with its runtime.
        self.keep_repairing(book, node);
        intact
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
            .by_id
            .get(&node.id())
            .and_then(|book| book.names.get(&part.keys().name))
            .is_none_or(|seen| !seen.unrepaired && seen.generation == node.generation())
    }

    /// Whether the client has seen a counter of `name` anywhere (a name it
    /// has fenced lately).
    pub(crate) fn has_seen(&self, name: &str) -> bool {
        let nodes = self.nodes.lock().unwrap();
        nodes
            .by_id
            .values()
            .any(|book| book.names.get(name).is_some_and(|seen| seen.last.is_some()))
    }

    /// The node restarted (its generation moved on): every counter of it
    /// awaits repair.
    pub(crate) fn node_restarted(self: &Arc<Self>, node: &Node) {
        let generation = node.generation();
        let mut nodes = self.nodes.lock().unwrap();
        let Some(book) = nodes.by_id.get_mut(&node.id()) else {
            return;
        };
        for seen in book.names.values_mut() {
            if seen.generation != generation && !seen.unrepaired {
                seen.unrepaired = true;
                book.unrepaired += 1;
            }
        }
        self.keep_repairing(book, node);
    }

    /// The counters of `node` awaiting repair.
    pub(crate) fn unrepaired(&self, node: &Node) -> Vec<Work> {
        let generation = node.generation();
        let mut nodes = self.nodes.lock().unwrap();
        let Some(book) = nodes.by_id.get(&node.id()) else {
            return Vec::new();
        };
        let part_of = |id: u64, name: &str| {
            let node = nodes.by_id.get(&id)?.node.upgrade()?;
            Some(Part::of(node, name))
        };
        let mut work = Vec::new();
        let mut unusable = Vec::new();
        for (name, seen) in book.names.iter().filter(|(_, seen)| seen.unrepaired) {
            let parts: Option<Arc<[Part]>> = seen
                .shape
                .nodes
                .iter()
                .map(|&id| part_of(id, name))
                .collect();
            let Some(parts) = parts else {
                unusable.push(name.clone());
                continue;
            };
            work.push(Work {
                part: Part::of(node.clone(), name),
                group: Group {
                    parts,
                    required: seen.shape.required,
                    shape: seen.shape.clone(),
                },
                generation,
            });
        }
        // A lock one of whose nodes was dropped cannot be used again: its
        // counter here is let go, not repaired.
        if !unusable.is_empty()
            && let Some(book) = nodes.by_id.get_mut(&node.id())
        {
            for name in unusable {
                book.names.remove(&name);
                book.unrepaired -= 1;
            }
        }
        work
    }

    /// A repair of `work` wrote `value`, and the node did not restart since
    /// it started: the counter is intact again.
    pub(crate) fn repaired(&self, work: &Work, value: Option<u64>) {
        let node = work.part.node();
        let mut nodes = self.nodes.lock().unwrap();
        let Some(book) = nodes.by_id.get_mut(&node.id()) else {
            return;
        };
        let Some(seen) = book.names.get_mut(&work.part.keys().name) else {
            return;
        };
        if node.generation() == work.generation {
            if seen.unrepaired {
                seen.unrepaired = false;
                book.unrepaired -= 1;
            }
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
        let Some(book) = nodes.by_id.get_mut(&node.id()) else {
            return;
        };
        let Some(seen) = book.names.get_mut(&part.keys().name) else {
            return;
        };
        if seen.unrepaired && node.generation() == generation {
            seen.unrepaired = false;
            book.unrepaired -= 1;
            seen.generation = generation;
            seen.last = value;
            tracing::info!(lock = %part.name(), node = %node.addr(), counter = ?value, "fencing counter repaired by a seal");
        }
    }

    /// Marks the repair task of `node` (holding `alive`) stopped, unless
    /// there is work left (then it goes on: `false`).
    pub(crate) fn repairs_done(&self, node: &Node, alive: &Alive) -> bool {
        let nodes = self.nodes.lock().unwrap();
        let Some(book) = nodes.by_id.get(&node.id()) else {
            return true;
        };
        if book.unrepaired > 0 {
            return false;
        }
        book.repairs.stop(alive);
        true
    }

    /// Whether `alive` is still `node`'s repair task (which then goes on).
    pub(crate) fn still_repairing(&self, node: &Node, alive: &Alive) -> bool {
        self.beat(node, alive, |book| &book.repairs)
    }

    /// Whether `alive` is still `node`'s watch task (which then goes on).
    pub(crate) fn still_watching(&self, node: &Node, alive: &Alive) -> bool {
        self.beat(node, alive, |book| &book.watch)
    }

    fn beat(&self, node: &Node, alive: &Alive, task: fn(&NodeBook) -> &Running) -> bool {
        let nodes = self.nodes.lock().unwrap();
        nodes
            .by_id
            .get(&node.id())
            .is_some_and(|book| task(book).beat(alive))
    }

    /// Starts the node's repair task, unless it runs or there is nothing
    /// to repair.
    fn keep_repairing(self: &Arc<Self>, book: &NodeBook, node: &Node) {
        if book.unrepaired == 0 {
            return;
        }
        if let Some((alive, runtime)) = book.repairs.start(repair::repairs_stall(node)) {
            runtime.spawn(
                NodeRepairs {
                    book: Arc::downgrade(self),
                    node: node.downgrade(),
                }
                .run(alive),
            );
        }
    }

    /// Watches every node of `group` for restarts, from now on (one watch
    /// per node, started again if it ended with its runtime or stalled): a
    /// node that restarts while the client is idle is repaired too, before
    /// a grant needs it. A repair that ended with its runtime starts again
    /// here too.
    pub(crate) fn watch(self: &Arc<Self>, group: &Group) {
        let mut nodes = self.nodes.lock().unwrap();
        self.sweep_if_due(&mut nodes, Instant::now());
        for part in group.parts.iter() {
            let node = part.node();
            let book = nodes
                .by_id
                .entry(node.id())
                .or_insert_with(|| NodeBook::new(node));
            if let Some((alive, runtime)) = book.watch.start(repair::watch_stall(node)) {
                runtime.spawn(repair::watch(
                    Arc::downgrade(self),
                    node.downgrade(),
                    node.server_events(),
                    alive,
                ));
            }
            self.keep_repairing(book, node);
        }
    }

    /// Forgets idle names and dropped nodes, at most once per quarter of
    /// [`FORGET_AFTER`]: called by requests and by the watches, so an idle
    /// client lets go too.
    pub(crate) fn forget_idle(&self) {
        let mut nodes = self.nodes.lock().unwrap();
        self.sweep_if_due(&mut nodes, Instant::now());
    }

    fn sweep_if_due(&self, nodes: &mut Nodes, now: Instant) {
        if nodes
            .swept
            .is_some_and(|at| now.duration_since(at) < self.forget_after / 4)
        {
            return;
        }
        nodes.swept = Some(now);
        let settling = self.settling.lock().unwrap();
        nodes.by_id.retain(|_, book| book.node.upgrade().is_some());
        let live: std::collections::HashSet<u64> = nodes.by_id.keys().copied().collect();
        for book in nodes.by_id.values_mut() {
            let before = book.names.len();
            book.names.retain(|name, seen| {
                let lock_usable = seen.shape.nodes.iter().all(|id| live.contains(id));
                let idle = now.duration_since(seen.used) >= self.forget_after
                    && !seen.unrepaired
                    && !settling.contains_key(name);
                lock_usable && !idle
            });
            book.unrepaired = book.names.values().filter(|seen| seen.unrepaired).count();
            // A map keeps its largest size's room: give it back once most
            // of it stands empty.
            if book.names.len() < before && book.names.capacity() > 4 * book.names.len() {
                book.names.shrink_to(2 * book.names.len());
            }
        }
    }

    /// How many counters the book remembers, over every node.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        let nodes = self.nodes.lock().unwrap();
        nodes.by_id.values().map(|book| book.names.len()).sum()
    }
}

/// A weak handle, for the tasks that must end with the client.
pub(crate) type WeakBook = Weak<FenceBook>;

impl std::fmt::Debug for FenceBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceBook").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
