//! The background work of fencing, per node of a client: watching the node
//! for restarts, and repairing the counters a restart cost it.
//!
//! Both tasks hold the client's book and their node weakly (bb8's reaper
//! pattern) and end with either; one whose runtime ended or stalled is
//! replaced by the next request or registration (see [`crate::running`]). A restart is noticed when a new connection reports a new
//! `run_id`: after a connection reports it was lost, the watch connects
//! again as soon as the node answers, so a restart is seen within moments
//! even while the client is idle. A repair reads the counter on every other
//! node of the lock and raises the restarted node's to the highest of them
//! ([`rules::repair_value`]), retrying until done: it does not wait for a
//! grant to stumble on the missing counter, and it does not stop at a
//! quorum.
//!
//! This file and [`super::book`] import each other, and are allowed to
//! (`.ci/module-graph.sh`): one concern, the counters awaiting repair,
//! whose ledger is the book and whose hands are these tasks.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use super::book::{WeakBook, Work};
use super::rules::{self, CounterReport};
use crate::node::{Node, ServerIdentity, WeakNode};
use crate::protocol::{self, Missing};
use crate::running::Alive;

/// First pause before retrying a repair or a reconnect; it doubles up to
/// [`MAX_BACKOFF`]: short, because until this client has noticed and
/// repaired a restarted node it cannot count it as a witness, even where
/// another client repaired it already (a counter present after a restart
/// may be a stale snapshot's). A connection attempt to a node that is down
/// is refused at once; four a second cost it nothing.
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(250);
/// How often an idle watch checks the node's connections anyway (a lost
/// connection it was not told about).
const WATCH_INTERVAL: Duration = Duration::from_secs(5);

/// The longest a watch of `node` takes to go round its loop: beyond it, it
/// is taken as stalled (see [`crate::running`]).
pub(super) fn watch_stall(node: &Node) -> Duration {
    2 * WATCH_INTERVAL + 4 * node.response_timeout()
}

/// The longest a repair of `node`'s counters takes between two beats: a
/// pause, a read and a raise, and a deferral.
pub(super) fn repairs_stall(node: &Node) -> Duration {
    2 * (MAX_BACKOFF + MAX_DEFERRAL) + 4 * node.response_timeout()
}

/// Watches `node` for restarts (told by `events`) while the client and the
/// node live, and while `alive` is the node's watch. Idle names and
/// dropped nodes are forgotten on the way.
pub(super) async fn watch(
    book: WeakBook,
    node: WeakNode,
    events: Arc<ServerIdentity>,
    alive: Alive,
) {
    let mut restarts = events.restarts();
    loop {
        tokio::select! {
            changed = restarts.changed() => if changed.is_err() { return },
            () = events.disconnected() => reconnect(&book, &node, &alive).await,
            () = tokio::time::sleep(WATCH_INTERVAL) => {
                // No I/O while the node's connections are healthy.
                let Some(node) = node.upgrade() else { return };
                let _ = node.checkout_any().await;
            }
        }
        let (Some(book), Some(node)) = (book.upgrade(), node.upgrade()) else {
            return;
        };
        if !book.still_watching(&node, &alive) {
            return;
        }
        book.node_restarted(&node);
        book.forget_idle();
    }
}

/// After a lost connection: connect again as soon as the node answers (the
/// new connection reports the server's `run_id`), backing off while it
/// does not. Ends when connected, or the client or the node is gone, or
/// `alive` is no longer the node's watch (each try beats: a node down for
/// long is still watched by this task alone).
async fn reconnect(book: &WeakBook, node: &WeakNode, alive: &Alive) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        tokio::time::sleep(backoff).await;
        let (Some(fence_book), Some(node)) = (book.upgrade(), node.upgrade()) else {
            return;
        };
        if !fence_book.still_watching(&node, alive) {
            return;
        }
        drop(fence_book);
        if node.checkout_any().await.is_ok() {
            return;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Repairs one node's counters, until none is left to repair.
pub(super) struct NodeRepairs {
    pub(super) book: WeakBook,
    pub(super) node: WeakNode,
}

impl NodeRepairs {
    /// Runs while `alive` is the node's repair task.
    pub(super) async fn run(self, alive: Alive) {
        let mut backoff = FIRST_BACKOFF;
        let mut deferring_since: Option<tokio::time::Instant> = None;
        loop {
            let (Some(book), Some(node)) = (self.book.upgrade(), self.node.upgrade()) else {
                return;
            };
            let work = book.unrepaired(&node);
            if work.is_empty() && book.repairs_done(&node, &alive) {
                return;
            }
            drop((book, node));
            // A repair defers to this client's settlements of its name for
            // at most a second: a name settled without pause still gets
            // repaired (with witnesses that may lag the token under way,
            // which is safe: see `FenceBook::settling`).
            let patient = deferring_since.is_none_or(|since| since.elapsed() < MAX_DEFERRAL);
            let mut failed = false;
            let mut deferred = false;
            for work in &work {
                let current = self
                    .book
                    .upgrade()
                    .is_some_and(|book| book.still_repairing(work.part.node(), &alive));
                if !current {
                    return;
                }
                match repair(&self.book, work, patient).await {
                    Repair::Done => {}
                    Repair::Failed => failed = true,
                    Repair::Deferred => deferred = true,
                }
            }
            if deferred {
                deferring_since.get_or_insert_with(tokio::time::Instant::now);
            } else {
                deferring_since = None;
            }
            // Nodes are held only while a repair runs.
            drop(work);
            if failed || deferred {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            } else {
                backoff = FIRST_BACKOFF;
            }
        }
    }
}

/// How long a repair defers to this client's settlements of its name.
const MAX_DEFERRAL: Duration = Duration::from_secs(1);

/// How one repair ended.
enum Repair {
    Done,
    /// Too few witnesses, or a request failed: tried again.
    Failed,
    /// A settlement of the name was under way (`patient`): tried again.
    Deferred,
}

/// One repair: read the counter on every other node of the lock, and once
/// enough witnesses (or every other node) answered, raise the restarted
/// node's counter to the highest. `patient`: defer while this client
/// settles a token of the name.
async fn repair(book: &WeakBook, work: &Work, patient: bool) -> Repair {
    let target = &work.part;
    let settling = || {
        patient
            && book
                .upgrade()
                .is_some_and(|book| book.is_settling(target.name()))
    };
    if settling() {
        return Repair::Deferred;
    }
    let others: Vec<_> = work
        .group
        .parts
        .iter()
        .filter(|lock| lock.node().id() != target.node().id())
        .collect();
    // The target's data as it is before the reads: the repair writes only
    // there (a restart or a promotion since fails the write, and the
    // repair is tried again).
    let mark = protocol::server_mark(target.keys());
    let patience = target.node().response_timeout();
    let Ok(Ok(mark)) =
        tokio::time::timeout(patience, target.node().run(target.lane(), &mark)).await
    else {
        return Repair::Failed;
    };
    let sent_at = tokio::time::Instant::now();
    let expiry = book.upgrade().and_then(|book| book.counter_expiry);
    let reads = join_all(others.iter().map(|lock| async move {
        // A raise to 0 that creates nothing: a read, with the vouch.
        let read = protocol::raise_token(lock.keys(), 0, Missing::Leave, expiry);
        let patience = lock.node().response_timeout();
        let counter = tokio::time::timeout(patience, lock.node().run(lock.lane(), &read)).await;
        counter.ok().and_then(Result::ok)
    }))
    .await;
    let Some(fence_book) = book.upgrade() else {
        return Repair::Done;
    };
    let reports: Vec<CounterReport> = others
        .iter()
        .zip(reads)
        .filter_map(|(lock, read)| {
            let read = read?;
            // A witness: vouched for by its node, and no reading reordered
            // before a value another reply showed (see `observe`).
            let in_order = fence_book.observe(lock, &work.group, read.before, sent_at);
            Some(CounterReport {
                value: read.before,
                intact: read.vouched && in_order,
            })
        })
        .collect();
    drop(fence_book);
    let nodes = work.group.parts.len();
    let Some(value) = rules::repair_value(&reports, nodes, work.group.required) else {
        tracing::debug!(lock = %target.name(), node = %target.node().addr(), "too few counters to repair from yet");
        return Repair::Failed;
    };
    if settling() {
        // A settlement began while the witnesses were read: read again.
        return Repair::Deferred;
    }
    let written = match value {
        Some(value) => {
            // Only on the data the witnesses were read for: a restart or
            // a failback since may have lost a token sealed there after
            // the reads.
            let raise = protocol::repair_token(target.keys(), value, expiry, &mark);
            let patience = target.node().response_timeout();
            match tokio::time::timeout(patience, target.node().run(target.lane(), &raise)).await {
                Ok(Ok(Some(raised))) => Some(raised.after),
                _ => return Repair::Failed,
            }
        }
        None => None,
    };
    if let Some(book) = book.upgrade() {
        book.repaired(work, written);
    }
    Repair::Done
}
