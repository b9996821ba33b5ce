//! What a node's connections learn about the server behind it: its
//! `run_id`, its restarts, its lost connections. Apart from the pool that
//! feeds it, so the topologies (a Cluster node's identity is its shards'
//! parent) use it without importing the pool, which imports the target.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The server behind a node, as its connections see it: its `run_id`,
/// which changes when it restarts (the restarts seen so far are its
/// *generation*), and whether a connection to it was just lost.
pub(crate) struct ServerIdentity {
    addr: String,
    run_id: std::sync::Mutex<Option<std::sync::Arc<str>>>,
    /// Times `run_id` was set: bumped after it, so whoever read the count
    /// before reading the id learns of every later change by the count.
    run_id_changes: AtomicU64,
    /// Restarts seen (a `run_id` that changed), for whoever watches.
    generation: tokio::sync::watch::Sender<u64>,
    /// Woken when a connection reports its own disconnection.
    disconnected: tokio::sync::Notify,
    /// A Cluster node's identity, for one of its shards: told of the
    /// shard's restarts and lost connections.
    parent: Option<Arc<ServerIdentity>>,
}

impl ServerIdentity {
    pub(crate) fn new(addr: String) -> ServerIdentity {
        ServerIdentity {
            addr,
            run_id: Default::default(),
            run_id_changes: AtomicU64::new(0),
            generation: tokio::sync::watch::channel(0).0,
            disconnected: tokio::sync::Notify::new(),
            parent: None,
        }
    }

    /// The identity of one shard of the Cluster node `parent` is.
    #[cfg(feature = "cluster")]
    pub(crate) fn within(addr: String, parent: Arc<ServerIdentity>) -> ServerIdentity {
        ServerIdentity {
            parent: Some(parent),
            ..ServerIdentity::new(addr)
        }
    }

    /// One more restart, as if the `run_id` had changed (a Cluster node's
    /// slot changed hands).
    pub(crate) fn bump_generation(&self) {
        self.generation.send_modify(|g| *g += 1);
        if let Some(parent) = &self.parent {
            parent.bump_generation();
        }
    }

    /// Sets the id without counting a restart: a Cluster node's, which is
    /// its slot 0 primary's.
    #[cfg(feature = "cluster")]
    pub(crate) fn name_run_id(&self, run_id: &str) {
        let mut known = self.run_id.lock().unwrap();
        // Named again at every topology refresh: counted only when it
        // changed, so a quorum lock's independence check stays skipped.
        if known.as_deref() != Some(run_id) {
            *known = Some(run_id.into());
            self.run_id_changes.fetch_add(1, Ordering::Release);
        }
    }

    pub(super) fn notify_disconnected(&self) {
        self.disconnected.notify_waiters();
        if let Some(parent) = &self.parent {
            parent.notify_disconnected();
        }
    }

    pub(super) fn observe(&self, run_id: &str) {
        let mut known = self.run_id.lock().unwrap();
        match known.as_deref() {
            Some(old) if old == run_id => return,
            Some(_) => {
                tracing::info!(node = %self.addr, run_id, "the server restarted (new run_id)");
                *known = Some(run_id.into());
                self.bump_generation();
            }
            None => *known = Some(run_id.into()),
        }
        self.run_id_changes.fetch_add(1, Ordering::Release);
    }

    /// Restarts seen so far.
    pub(crate) fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Follows [`ServerIdentity::generation`].
    pub(crate) fn restarts(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Resolves at the next connection that reports it was lost.
    pub(crate) fn disconnected(&self) -> tokio::sync::futures::Notified<'_> {
        self.disconnected.notified()
    }

    /// The server's `run_id`, once a connection was made.
    pub(crate) fn run_id(&self) -> Option<std::sync::Arc<str>> {
        self.run_id.lock().unwrap().clone()
    }

    /// How many times [`ServerIdentity::run_id`] was set so far: read it
    /// first, and an unchanged count later means an unchanged id.
    pub(crate) fn run_id_changes(&self) -> u64 {
        self.run_id_changes.load(Ordering::Acquire)
    }
}
