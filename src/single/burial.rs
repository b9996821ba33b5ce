//! Burying a release or rollback that got no answer within the rollback
//! window, before its owner's next request of the lock on that node.
//!
//! Given up is not gone: a copy may still sit in a partitioned link's TCP
//! buffers (retransmitted once the link heals) or in a frozen server's.
//! Landing after the owner's next grant there, it would find the owner's
//! field and take that hold: a release would end it, a rollback undo it,
//! while the owner trusts it. So the request's latch is written first
//! (`protocol::bury`), which every copy reads before it acts, and the
//! owner's requests of that field on that node stay held back (the
//! caller's `PendingRollback`) until the server answered it.

use tokio::time::Instant;

use super::Lock;
use crate::protocol;
use crate::timing;

impl Lock {
    /// Buries `latch`, the latch of a request first sent at `sent_at` whose
    /// release or rollback was given up: tried on fresh connections with
    /// backoff until the node answers, or until [`timing::BURIAL`] after
    /// `sent_at` (by then TCP has given up any copy still in flight; a
    /// server frozen that long with a copy in its buffers is not covered).
    /// Run while the request's `PendingRollback` is held.
    pub(super) async fn bury(&self, latch: &str, sent_at: Instant) {
        let give_up_at = sent_at + timing::BURIAL;
        let node = self.node();
        let call = protocol::bury(latch, timing::BURIAL);
        // A failover, a slot changing hands, the node answering again: at
        // once.
        let mut pause = node.retry_pause(self.lane());
        loop {
            match node.run(self.lane(), &call).await {
                Ok(()) => {
                    tracing::info!(lock = %self.name(), node = %node.addr(), "a release or rollback given up is buried: a late copy of it changes nothing");
                    return;
                }
                Err(err) if err.is_permanent() || Instant::now() + pause.next() >= give_up_at => {
                    tracing::warn!(lock = %self.name(), node = %node.addr(), error = %err, "burying a release or rollback given up failed; a late copy of it could still take its owner's next hold there");
                    return;
                }
                Err(_) => pause.wait(pause.next()).await,
            }
        }
    }
}
