//! What a single-node lock's queries ask its node (and the one write that
//! is not a hold's: force unlock). Each is one request; none holds the lock.

use super::Lock;
use crate::error::Result;
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
}
