//! What a single-node lock's queries ask its node (and the one write that
//! is not a hold's: force unlock). Each is one request; none holds the lock.

use super::Lock;
use crate::error::Result;
use crate::inspect::{Inspection, NodeInspection};
use crate::protocol;
use std::time::Duration;

impl Lock {
    /// Deletes the lock whoever holds it, and wakes its waiters. Returns
    /// whether it was held.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let was_held = lock.force_unlock().await?;
    /// assert!(!lock.is_locked().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`](crate::Error::NodeUnavailable) / [`Error::Redis`](crate::Error::Redis) when the node fails.
    ///
    /// # Cancel safety
    ///
    /// One request; if dropped after sending, it may or may not be applied.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.inner
            .node
            .run(self.inner.lane, &self.force_unlock_call())
            .await
    }

    /// Whether anyone holds the lock. A read lock is locked while the
    /// read-write lock is in read mode, a write lock while it is in write
    /// mode, as Redisson's are.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let guard = lock.lock().await?;
    /// assert!(lock.is_locked().await?);
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`](crate::Error::NodeUnavailable) / [`Error::Redis`](crate::Error::Redis) when the node fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn is_locked(&self) -> Result<bool> {
        self.inner
            .node
            .run(self.inner.lane, &self.is_locked_call())
            .await
    }

    /// Whether the owner of this handle (see [`Lock::owner`]) holds the
    /// lock: the handle's explicit owner, or inside a
    /// [`Lock::run_locked`] of this lock its hold's owner. A handle with
    /// neither has no owner of its own, and says `false`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let job = lock.with_owner(multilock::Owner::new("job-7")?);
    /// let guard = job.lock().await?;
    /// assert!(job.is_held_by_current_owner().await?);
    /// assert!(!lock.is_held_by_current_owner().await?); // no owner of its own
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`](crate::Error::NodeUnavailable) / [`Error::Redis`](crate::Error::Redis) when the node fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn is_held_by_current_owner(&self) -> Result<bool> {
        Ok(self.hold_count().await? > 0)
    }

    /// How many times the owner of this handle (see
    /// [`Lock::is_held_by_current_owner`]) holds the lock (0 when not). A
    /// read lock counts the read holds that are alive: one whose timeout
    /// key expired is not a hold, whatever the hash field says.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let job = lock.with_owner(multilock::Owner::new("job-7")?);
    /// let outer = job.lock().await?;
    /// let inner = job.lock().await?;             // the same owner re-enters
    /// assert_eq!(job.hold_count().await?, 2);
    /// inner.unlock().await?;
    /// outer.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`](crate::Error::NodeUnavailable) / [`Error::Redis`](crate::Error::Redis) when the node fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn hold_count(&self) -> Result<u32> {
        let field = self.field(&self.owner());
        self.inner
            .node
            .run(self.inner.lane, &self.hold_count_call(&field))
            .await
    }

    /// The lock's remaining time to live; `None` when it is not held (or has
    /// no expiry).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// use std::time::Duration;
    /// let guard = lock.lock_with_lease(Duration::from_secs(10)).await?;
    /// assert!(lock.remaining_ttl().await?.unwrap() <= Duration::from_secs(10));
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`](crate::Error::NodeUnavailable) / [`Error::Redis`](crate::Error::Redis) when the node fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        self.inner
            .node
            .run(self.inner.lane, &protocol::remaining_ttl(&self.inner.keys))
            .await
    }

    /// What the node stores for this lock, read in one read-only request:
    /// its holders (client id, owner, hold count; a read-write lock's mode
    /// and each reader's holds with their TTLs), the key's TTL, a fair
    /// lock's queue with each waiter's deadline, and the fencing counter.
    /// Whatever kind this handle is, every key of Redisson's lock family
    /// under the name is read, so holders and waiters of other kinds and
    /// other clients (Redisson's too) show as they are stored.
    ///
    /// A node that does not answer within its response timeout is reported
    /// in the inspection (its [`NodeInspection::state`] holds the error),
    /// and the verdict is then [`Verdict::Unknown`](crate::inspect::Verdict::Unknown).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let inspection = lock.inspect().await?;
    /// if let Ok(state) = &inspection.nodes[0].state {
    ///     for holder in &state.holders {
    ///         println!("{} holds {} time(s), ttl {:?}", holder.owner, holder.holds, state.ttl);
    ///     }
    ///     println!("{} waiting", state.queue.len());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// None today: a node's failure is part of the inspection.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only, it never writes.
    pub async fn inspect(&self) -> Result<Inspection> {
        Ok(Inspection::new(1, vec![self.inspect_node().await]))
    }

    /// This lock's node's answer to [`Lock::inspect`].
    pub(crate) async fn inspect_node(&self) -> NodeInspection {
        let state = self
            .inner
            .node
            .run(self.inner.lane, &protocol::inspect(&self.inner.keys))
            .await;
        NodeInspection {
            node: self.inner.node.addr().to_owned(),
            name: self.name().to_owned(),
            state,
        }
    }
}
