//! Proof of holding: the [`Guard`] every lock type returns, made of one
//! [`HeldPart`] per node that granted.

use std::fmt;
use std::time::Duration;

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
    token: Option<u64>,
}

/// What kind of lock a guard holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A single-node [`Lock`](crate::Lock): errors are its node's own.
    Single,
    /// A multi-node lock of `nodes` parts, held while `required` of them
    /// are; each node's request gets `node_timeout`.
    Quorum {
        nodes: usize,
        required: usize,
        node_timeout: Duration,
    },
}

impl Shape {
    fn required(self) -> usize {
        match self {
            Shape::Single => 1,
            Shape::Quorum { required, .. } => required,
        }
    }

    fn nodes(self) -> usize {
        match self {
            Shape::Single => 1,
            Shape::Quorum { nodes, .. } => nodes,
        }
    }
}

impl Guard {
    /// The guard of a single-node hold.
    pub(crate) fn single(owner: Owner, part: HeldPart) -> Guard {
        Guard {
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
        token: Option<u64>,
    ) -> Guard {
        Guard {
            owner,
            parts,
            shape,
            token,
        }
    }

    /// Releases the lock.
    ///
    /// Renewal stops before anything is sent, so no renewal outlives the
    /// unlock. A multi-node lock releases every node concurrently and
    /// succeeds when a quorum of them released. A part already known to be
    /// over (a renewal found it gone, a later fresh grant of the same owner
    /// proved it over, or the key's TTL has surely run out) sends nothing
    /// and counts as [`Error::NotHeld`]: releasing its field could lower a
    /// later hold of the same owner. The key's TTL is what the key really
    /// holds: a re-entry that extended it extends this guard too.
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
                nodes: self.shape.nodes(),
                failures,
            }))
        }
    }

    /// Extends a guard taken with a fixed lease to at least `lease` from
    /// now, as an acquire would grant it: on every node that still surely
    /// holds, at once (a multi-node lock waits at most its per-node timeout
    /// for each), and only if a quorum of them extended within the new
    /// validity (`lease` less the time it took and the clock drift). A TTL
    /// is never shortened, and a hold that is over is never revived.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// use std::time::Duration;
    /// let guard = lock.lock_with_lease(Duration::from_secs(10)).await?;
    /// // ... the work takes longer than planned ...
    /// guard.extend(Duration::from_secs(10)).await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a guard renewed by the watchdog (it
    /// needs no extension) or a lease out of bounds (see
    /// [`Lock::lock_with_lease`](crate::Lock::lock_with_lease));
    /// [`Error::NotHeld`] when the lock is no longer held (a single node), or
    /// the node's error; for a multi-node lock, [`Error::NoQuorum`] naming
    /// each node that did not extend, when fewer than a quorum did in time.
    /// The parts that did extend keep their longer TTL.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave some nodes extended and others not: the
    /// guard then reports the validity it had, which the keys outlast.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        if self.parts.iter().any(|p| !p.has_lease()) {
            return Err(Error::invalid(
                "extend() is for guards with a fixed lease; the watchdog renews this one",
            ));
        }
        let (node_timeout, required) = match self.shape {
            Shape::Single => {
                timing::check_lease(lease)?;
                let Some(part) = self.parts.first() else {
                    return Err(Error::invalid("the guard holds nothing"));
                };
                return part.extend(lease).await.map(drop);
            }
            Shape::Quorum {
                node_timeout,
                required,
                ..
            } => (node_timeout.min(lease / 10), required),
        };
        timing::check_quorum_lease(lease)?;
        let started = Instant::now();
        let results = futures::future::join_all(self.parts.iter().map(|part| async move {
            let extended = tokio::time::timeout(node_timeout, part.extend(lease)).await;
            let outcome = extended.unwrap_or_else(|_| {
                Err(Error::NodeUnavailable {
                    node: part.node_addr().to_owned(),
                    reason: crate::Unavailable::Timeout,
                    source: None,
                })
            });
            (part.node_addr().to_owned(), outcome)
        }))
        .await;
        let elapsed = started.elapsed();
        let mut extended = 0;
        let mut failures = Vec::new();
        for (node, outcome) in results {
            match outcome {
                Ok(_) => extended += 1,
                Err(err) => failures.push(NodeFailure {
                    node,
                    cause: FailureCause::Failed(err),
                }),
            }
        }
        if extended >= required && timing::validity(lease, elapsed).is_some() {
            return Ok(());
        }
        Err(Error::NoQuorum(QuorumError {
            lock: self.name().to_owned(),
            succeeded: extended,
            required,
            nodes: self.shape.nodes(),
            failures,
        }))
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

    /// The instant after which the lock may be held by someone else: the
    /// latest instant until which a quorum of its nodes surely still hold
    /// it. On each node that is what the key holds (the TTL its last grant
    /// or renewal set, counted from when that request was sent, less an
    /// allowance for clock drift), so it moves forward with every renewal
    /// and with a re-entry that extended the key. `None` once too many
    /// nodes are known to have lost the lock.
    ///
    /// Measured on the monotonic clock only: a jump of the wall clock
    /// changes nothing here (a jump of a *server's* clock does: see the
    /// crate's known limits).
    pub fn valid_until(&self) -> Option<std::time::Instant> {
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
