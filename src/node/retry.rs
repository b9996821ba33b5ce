//! The pauses between retries of a request the node must answer in the
//! end (a release or rollback retried in the background, a burial, a fair
//! waiter leaving its queue): backing off while the node does not answer,
//! and cut short as soon as it might. A failover or a slot changing hands
//! sends the next try to the new primary at once; a node that answers a
//! probe again gets the next try at once, not after the rest of a pause of
//! up to 2 s. Until that try lands, its owner's next request on the node
//! waits for it (a pending rollback), so every moment it sleeps past the
//! node's return is a moment that lock cannot be granted there.

use std::time::Duration;

use tokio::sync::watch;

use super::target::next_switch;

/// First pause after a failed try.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// Longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// Pauses between tries of one request; see the module docs.
pub(crate) struct RetryPause {
    pause: Duration,
    /// A Sentinel node's switches of primary, a Cluster node's slots
    /// changing hands; `None` for a standalone server.
    switches: Option<watch::Receiver<u64>>,
    /// Bumped whenever the node (a Cluster node: the shard of the
    /// request's slot) stops being suspect.
    recoveries: watch::Receiver<u64>,
}

impl RetryPause {
    pub(super) fn new(
        switches: Option<watch::Receiver<u64>>,
        recoveries: watch::Receiver<u64>,
    ) -> RetryPause {
        RetryPause {
            pause: FIRST_PAUSE,
            switches,
            recoveries,
        }
    }

    /// The pause the next [`RetryPause::wait`] sleeps at most: a retry
    /// loop with a deadline gives up when it would end past it.
    pub(crate) fn next(&self) -> Duration {
        self.pause
    }

    /// Sleeps the next pause, at most `left`, or until the node moves or
    /// answers again; the pause after it is twice as long (up to 2 s).
    ///
    /// Cancel safe: it only waits.
    pub(crate) async fn wait(&mut self, left: Duration) {
        let recovered = async {
            if self.recoveries.changed().await.is_err() {
                // The node is gone: only the pause ends the wait.
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = tokio::time::sleep(self.pause.min(left)) => {}
            () = next_switch(&mut self.switches) => {}
            () = recovered => {}
        }
        self.pause = (self.pause * 2).min(MAX_PAUSE);
    }
}
