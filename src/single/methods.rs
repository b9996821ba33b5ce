//! The public acquire methods of the single-node lock: wait until granted,
//! try once, try within a wait. How an acquire runs is in
//! [`super::acquire`]; running work under the lock is [`crate::scoped`]'s,
//! above the lock kinds.

use std::time::Duration;

use super::Lock;
use crate::error::Result;
use crate::guard::Guard;
use crate::timing::check_lease;

impl Lock {
    /// Acquires, waiting as long as it takes. Without a lease: the watchdog
    /// renews the lock while the guard lives. The node's failures in
    /// passing are part of the wait: a connection refused or lost, a
    /// timeout, a suspect node, a server restarting in place, a Sentinel
    /// group naming no primary yet, a Cluster shard with no primary during
    /// a failover; the node logs each change of its health once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let guard = lock.lock().await?;     // renewed by the watchdog while held
    /// // ... the critical section ...
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Only a permanent error ([`Error::is_permanent`](crate::Error::is_permanent):
    /// a refused password or ACL, the key holding another type, a plain
    /// `ERR`) ends the wait, and, for a lock with replica sync, a grant
    /// the replicas did not acknowledge in time
    /// ([`Error::ReplicaSync`](crate::Error::ReplicaSync); it was released).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves nothing held: an acquire request in flight
    /// is completed in the background and released if it was granted. A
    /// fair lock's waiter also leaves the queue: at once in the background
    /// when no request is in flight, else once that request's reply came.
    pub async fn lock(&self) -> Result<Guard> {
        self.acquire_until_granted(None).await
    }

    /// Acquires, waiting as long as it takes, with a fixed lease (no
    /// watchdog): the lock expires `lease` after it was granted unless
    /// released before.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// use std::time::Duration;
    /// let guard = lock.lock_with_lease(Duration::from_secs(10)).await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease under [`MIN_LEASE`](crate::MIN_LEASE) or over
    /// [`MAX_LEASE`](crate::MAX_LEASE); otherwise as
    /// [`Lock::lock`].
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::lock`].
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<Guard> {
        check_lease(lease)?;
        self.acquire_until_granted(Some(lease)).await
    }

    async fn acquire_until_granted(&self, lease: Option<Duration>) -> Result<Guard> {
        loop {
            if let Some(guard) = self.acquire(None, lease).await? {
                return Ok(guard);
            }
        }
    }

    /// One attempt, no waiting. `None` when someone else holds the lock.
    /// Without a lease, so the watchdog renews it. A fair lock's attempt
    /// does not join the queue (Redisson's `tryLock()`): it is granted only
    /// when the lock is free and nobody queues ahead.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// match lock.try_lock().await? {
    ///     Some(guard) => guard.unlock().await?,
    ///     None => { /* someone else holds it */ }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`](crate::Error::NodeUnavailable) /
    /// [`Error::Redis`](crate::Error::Redis) when the node fails: at once,
    /// as there is no wait to go on with.
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::lock`].
    pub async fn try_lock(&self) -> Result<Option<Guard>> {
        self.acquire(Some(Duration::ZERO), None).await
    }

    /// Tries for at most `wait`; `lease` fixes the lease, `None` lets the
    /// watchdog renew. `None` when the lock was not granted in time, also
    /// when the node was unavailable until then: as for [`Lock::lock`], the
    /// node's failures in passing are part of the wait.
    ///
    /// Waiting is driven by the unlock message on the lock's channel; each
    /// wait also ends after the holder's remaining TTL, so a lost message
    /// costs at most one TTL.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// use std::time::Duration;
    /// let wait = Duration::from_secs(2);
    /// if let Some(guard) = lock.try_lock_for(wait, Some(Duration::from_secs(10))).await? {
    ///     guard.unlock().await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease under [`MIN_LEASE`](crate::MIN_LEASE) or over
    /// [`MAX_LEASE`](crate::MAX_LEASE); otherwise as
    /// [`Lock::lock`].
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::lock`].
    pub async fn try_lock_for(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<Guard>> {
        if let Some(lease) = lease {
            check_lease(lease)?;
        }
        self.acquire(Some(wait), lease).await
    }
}
