//! Proof of holding: the [`Guard`] every lock type returns, made of one
//! [`HeldPart`] per node that granted.

use std::fmt;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::error::{Error, FailureCause, NodeFailure, QuorumError, Result};
use crate::owner::Owner;
use crate::single::HeldPart;
use crate::timing;

/// Proof that a lock is held: returned by every acquire of [`Lock`](crate::Lock),
/// [`MultiLock`](crate::MultiLock) and [`RedLock`](crate::RedLock).
///
/// [`Guard::unlock`] releases and reports errors; dropping the guard releases
/// in the background (best effort, on the current tokio runtime). A guard is
/// `Send + 'static`: it can move into another task, and unlocking through it
/// works from any task, since it carries its owner.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
/// let guard = lock.lock().await?;
/// tokio::select! {
///     _ = guard.lost() => { /* stop: someone else may hold it now */ }
///     _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
/// }
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping a Guard releases the lock at once"]
pub struct Guard {
    owner: Owner,
    parts: Vec<HeldPart>,
    shape: Shape,
    /// With a fixed lease: until when the lock surely holds, fixed at the
    /// grant. `None` under the watchdog (it follows the renewals).
    fixed_valid_until: Option<Instant>,
    token: Option<u64>,
}

/// What kind of lock a guard holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A single-node [`Lock`](crate::Lock): errors are its node's own.
    Single,
    /// A multi-node lock of `nodes` parts, held while `required` of them are.
    Quorum { nodes: usize, required: usize },
}

impl Shape {
    fn required(self) -> usize {
        match self {
            Shape::Single => 1,
            Shape::Quorum { required, .. } => required,
        }
    }
}

impl Guard {
    /// The guard of a single-node hold.
    pub(crate) fn single(owner: Owner, part: HeldPart) -> Guard {
        Guard {
            fixed_valid_until: part
                .lease
                .map(|lease| timing::trusted_until(part.sent_at, lease)),
            token: part.token,
            owner,
            parts: vec![part],
            shape: Shape::Single,
        }
    }

    /// The guard of a multi-node hold: `parts` are the nodes that granted,
    /// `shape` says how many must stay held.
    pub(crate) fn quorum(
        owner: Owner,
        parts: Vec<HeldPart>,
        shape: Shape,
        fixed_valid_until: Option<Instant>,
        token: Option<u64>,
    ) -> Guard {
        Guard {
            owner,
            parts,
            shape,
            fixed_valid_until,
            token,
        }
    }

    /// Releases the lock.
    ///
    /// Renewal stops before anything is sent, so no renewal outlives the
    /// unlock. A multi-node lock releases every node concurrently and
    /// succeeds when a quorum of them released. A part already known to be
    /// over (the watchdog found it gone, or its fixed lease has surely run
    /// out) sends nothing and counts as [`Error::NotHeld`]: releasing its
    /// field could lower a later hold of the same owner. (The one case this
    /// misjudges: a re-entrant acquire with a longer lease extended the key;
    /// the outer guard then reports `NotHeld` and the key lives until that
    /// longer lease ends.)
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let guard = lock.lock().await?;
    /// match guard.unlock().await {
    ///     Ok(()) => {}
    ///     Err(multilock::Error::NotHeld { .. }) => { /* it had expired or was taken away */ }
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lock expired or was taken from this owner;
    /// [`Error::NodeUnavailable`] when the node could not be reached (a
    /// retried release is idempotent: it returns the first result); for a
    /// multi-node lock, [`Error::NoQuorum`] naming each node that failed.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future does not leave the lock held: the
    /// release goes on in the background.
    pub async fn unlock(mut self) -> Result<()> {
        let mut parts = std::mem::take(&mut self.parts);
        // A single-node lock reports its node's error as it is.
        if self.shape == Shape::Single
            && let Some(part) = parts.pop()
        {
            return part.release().await.map(drop);
        }
        let name = parts
            .first()
            .map(|p| p.lock.name().to_owned())
            .unwrap_or_default();
        let releases = parts.into_iter().map(|part| {
            let node = part.node_addr().to_owned();
            part.release().map(move |result| (node, result))
        });
        let results = futures::future::join_all(releases).await;
        let mut failures = Vec::new();
        let mut released = 0;
        for (node, result) in results {
            match result {
                Ok(_) => released += 1,
                Err(err) => failures.push(NodeFailure {
                    node,
                    cause: FailureCause::Failed(err),
                }),
            }
        }
        if released >= self.shape.required() {
            Ok(())
        } else {
            Err(Error::NoQuorum(QuorumError {
                lock: name,
                succeeded: released,
                required: self.shape.required(),
                failures,
            }))
        }
    }

    /// Resolves when the lock is known to be gone, or may be: for a single
    /// node, when the watchdog finds it missing, when no renewal could be
    /// confirmed for a whole watchdog timeout (the node is unreachable: the
    /// key may have expired there), or when its fixed lease ran out; for a
    /// multi-node lock, as soon as the nodes still held fall below the quorum.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let guard = lock.lock().await?;
    /// tokio::select! {
    ///     _ = guard.lost() => { /* stop writing: the lock may be someone else's */ }
    ///     _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
    /// }
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        // Parts that may be lost before fewer than `quorum` remain held.
        let spare = self.parts.len().saturating_sub(self.shape.required());
        let mut lost: FuturesUnordered<_> = self.parts.iter().map(HeldPart::lost).collect();
        for _ in 0..=spare {
            if lost.next().await.is_none() {
                return;
            }
        }
    }

    /// The fencing token, when the lock was made with fencing on
    /// ([`Lock::with_fencing`](crate::Lock::with_fencing)). Tokens strictly increase across successive
    /// holders (and a re-entrant acquire gets a newer one, as in Redisson);
    /// pass it with every write the lock protects.
    pub fn fencing_token(&self) -> Option<u64> {
        self.token
    }

    /// The owner this hold belongs to.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The addresses of the nodes that still surely hold the lock: granted,
    /// not found gone by the watchdog, and within their lease.
    pub fn nodes(&self) -> Vec<&str> {
        let now = Instant::now();
        self.parts
            .iter()
            .filter(|p| p.trusted_until().is_some_and(|t| t > now))
            .map(HeldPart::node_addr)
            .collect()
    }

    /// The lock's name (the first one, for a MultiLock of several names).
    pub fn name(&self) -> &str {
        self.parts
            .first()
            .map(|p| p.lock.name())
            .unwrap_or_default()
    }

    /// The instant after which the lock may be held by someone else. With a
    /// fixed lease: when the (first) acquire request was sent, plus the
    /// lease, minus an allowance for clock drift. Under the watchdog it
    /// moves forward with every renewal: the latest instant until which a
    /// quorum of nodes surely still hold (each node's last renewal plus the
    /// watchdog timeout, less drift). `None` once the watchdog found the lock
    /// gone on too many nodes.
    pub fn valid_until(&self) -> Option<std::time::Instant> {
        if let Some(fixed) = self.fixed_valid_until {
            return Some(fixed.into_std());
        }
        let mut trusted: Vec<Instant> = self
            .parts
            .iter()
            .filter_map(HeldPart::trusted_until)
            .collect();
        trusted.sort_unstable_by(|a, b| b.cmp(a));
        trusted
            .get(self.shape.required().checked_sub(1)?)
            .map(|t| t.into_std())
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("name", &self.name())
            .field("owner", &self.owner)
            .field("nodes", &self.nodes())
            .field("shape", &self.shape)
            .field("fencing_token", &self.token)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Client, Lock, MultiLock, Node, RedLock};

    fn send_sync_static<T: Send + Sync + 'static>() {}
    fn send<T: Send>(_: &T) {}
    fn consumes_guard_into_send_static<F, Fut>(_: F)
    where
        F: FnOnce(Guard) -> Fut,
        Fut: Future + Send + 'static,
    {
    }

    /// Guards move into spawned tasks; handles are shared between them; the
    /// futures of every acquire can be spawned (compile-time checks, run as a
    /// test so a regression fails the suite, not a dead function).
    #[test]
    fn guards_handles_and_futures_move_between_tasks() {
        send_sync_static::<Guard>();
        send_sync_static::<Lock>();
        send_sync_static::<MultiLock>();
        send_sync_static::<RedLock>();
        send_sync_static::<Client>();
        send_sync_static::<Node>();
        consumes_guard_into_send_static(Guard::unlock);

        let client = Client::new();
        let node = Node::new("redis://127.0.0.1:1").unwrap();
        let lock = client.lock(&node, "x").unwrap();
        let red = client.red_lock_on(&[node], "x").unwrap();
        let wait = Duration::ZERO;
        send(&lock.lock());
        send(&lock.lock_with_lease(wait));
        send(&lock.try_lock());
        send(&lock.try_lock_for(wait, None));
        send(&lock.force_unlock());
        send(&red.lock());
        send(&red.try_lock_for(wait, None));
        send(&red.force_unlock());
    }
}
