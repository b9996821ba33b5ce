//! What the three lock types have in common, as a trait, so code can be
//! written once for a single-node lock, a MultiLock or a RedLock.

use std::time::Duration;

use crate::error::Result;
use crate::guard::Guard;
use crate::inspect::Inspection;
use crate::owner::Owner;
use crate::quorum::{QuorumLock, QuorumPolicy};
use crate::single::Lock;

/// The methods [`Lock`], [`MultiLock`](crate::MultiLock) and
/// [`RedLock`](crate::RedLock) share, so code can take any of them. Each
/// forwards to the inherent method of the same name.
///
/// The three keep one contract, with one difference: how a *node failure*
/// is reported. Waits (`lock`, `try_lock_for`) go on through node
/// failures on all three, and only permanent errors end them. Where a
/// failure is reported (`try_lock`, and a quorum lock's last round), a
/// single-node [`Lock`] gives its node's error
/// ([`Error::NodeUnavailable`](crate::Error::NodeUnavailable) /
/// [`Error::Redis`](crate::Error::Redis)); a quorum lock tolerates failures
/// of the nodes beyond its quorum and reports the rest as
/// [`Error::NoQuorum`](crate::Error::NoQuorum), naming every node. For the
/// quorum locks, "held" means held on a quorum of their nodes (all for a
/// MultiLock, N/2+1 for a RedLock).
///
/// The trait is not dyn compatible (its methods return `impl Future`);
/// to choose the lock type at run time, use [`AnyLock`](crate::AnyLock).
///
/// Cancel safety is the same for all: dropping an acquire future at any
/// point leaves nothing held (a grant in flight is released in the
/// background), and dropping a [`Guard`] releases it.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use multilock::DistributedLock;
///
/// /// Runs `job` under any kind of lock.
/// async fn exclusively<L: DistributedLock>(lock: &L, job: impl Future<Output = ()>) -> multilock::Result<bool> {
///     let Some(guard) = lock.try_lock_for(Duration::from_secs(1), None).await? else {
///         return Ok(false);
///     };
///     job.await;
///     guard.unlock().await?;
///     Ok(true)
/// }
/// ```
pub trait DistributedLock: Clone + Send + Sync + 'static {
    /// The lock's name (the first lock's, for a MultiLock of several names).
    fn name(&self) -> &str;

    /// This handle bound to an explicit owner: its acquires re-enter that
    /// owner's holds (see [`Owner`]).
    #[must_use = "this returns a new handle and leaves the original as it was"]
    fn with_owner(&self, owner: Owner) -> Self;

    /// The owner an acquire through this handle holds for, made here and
    /// now (see [`Lock::owner`]).
    fn owner(&self) -> Owner;

    /// Acquires, waiting as long as it takes; the guard's holds are renewed
    /// by the client's watchdog while it lives.
    ///
    /// Node failures are part of the wait, on every lock type (Redisson's
    /// semantics): only permanent errors end it
    /// ([`Error::is_permanent`](crate::Error::is_permanent)). See
    /// [`Lock::lock`] and [`QuorumLock::lock`](crate::QuorumLock::lock).
    fn lock(&self) -> impl Future<Output = Result<Guard>> + Send;

    /// As [`DistributedLock::lock`], with a fixed lease and no renewal.
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease
    /// under [`MIN_LEASE`](crate::MIN_LEASE) or over [`MAX_LEASE`](crate::MAX_LEASE).
    fn lock_with_lease(&self, lease: Duration) -> impl Future<Output = Result<Guard>> + Send;

    /// One attempt (one round on every node), no waiting; `None` when
    /// someone else holds the lock. Node failures: the node's error for a
    /// `Lock`; `NoQuorum` for a quorum lock when they made its quorum
    /// unreachable.
    fn try_lock(&self) -> impl Future<Output = Result<Option<Guard>>> + Send;

    /// Tries for at most `wait` (`lease`: a fixed lease, or `None` for the
    /// watchdog); `None` when not granted in time. Node failures are waited
    /// out within `wait`: a `Lock` then returns `None`; a quorum lock whose
    /// last round fell short by node failures returns `NoQuorum`.
    fn try_lock_for(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Guard>>> + Send;

    /// Acquires, runs `work` with the fencing token, releases; `work` is
    /// dropped and the call fails with
    /// [`Error::LockLost`](crate::Error::LockLost) if the lock can no longer
    /// be proven held before it finishes. See [`Lock::run_locked`].
    fn run_locked<F, Fut, T>(&self, work: F) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(Option<u64>) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send;

    /// [`DistributedLock::run_locked`] with a bounded wait: `Ok(None)`, and
    /// `work` not run, when the lock was not granted within `wait`. See
    /// [`Lock::run_locked_for`].
    fn run_locked_for<F, Fut, T>(
        &self,
        wait: Duration,
        lease: Option<Duration>,
        work: F,
    ) -> impl Future<Output = Result<Option<T>>> + Send
    where
        F: FnOnce(Option<u64>) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send;

    /// Deletes the lock whoever holds it and wakes its waiters; whether it
    /// was held (on a quorum of nodes, for a quorum lock).
    fn force_unlock(&self) -> impl Future<Output = Result<bool>> + Send;

    /// Whether anyone holds the lock (on a quorum of nodes, for a quorum
    /// lock).
    fn is_locked(&self) -> impl Future<Output = Result<bool>> + Send;

    /// How many times the handle's owner holds the lock (the count a quorum
    /// of nodes has at least, for a quorum lock); 0 when not.
    fn hold_count(&self) -> impl Future<Output = Result<u32>> + Send;

    /// The lock's remaining time to live (the TTL a quorum of nodes has at
    /// least, for a quorum lock); `None` when it is not held.
    fn remaining_ttl(&self) -> impl Future<Output = Result<Option<Duration>>> + Send;

    /// Whether the handle's owner holds the lock (on a quorum of nodes, for
    /// a quorum lock).
    fn is_held_by_current_owner(&self) -> impl Future<Output = Result<bool>> + Send;

    /// What each node stores for the lock, read-only, and the verdict over
    /// them (see [`Lock::inspect`]).
    fn inspect(&self) -> impl Future<Output = Result<Inspection>> + Send;
}

macro_rules! forward {
    () => {
        fn name(&self) -> &str {
            Self::name(self)
        }
        fn with_owner(&self, owner: Owner) -> Self {
            Self::with_owner(self, owner)
        }
        fn owner(&self) -> Owner {
            Self::owner(self)
        }
        fn lock(&self) -> impl Future<Output = Result<Guard>> + Send {
            Self::lock(self)
        }
        fn lock_with_lease(&self, lease: Duration) -> impl Future<Output = Result<Guard>> + Send {
            Self::lock_with_lease(self, lease)
        }
        fn try_lock(&self) -> impl Future<Output = Result<Option<Guard>>> + Send {
            Self::try_lock(self)
        }
        fn try_lock_for(
            &self,
            wait: Duration,
            lease: Option<Duration>,
        ) -> impl Future<Output = Result<Option<Guard>>> + Send {
            Self::try_lock_for(self, wait, lease)
        }
        fn run_locked<F, Fut, T>(&self, work: F) -> impl Future<Output = Result<T>> + Send
        where
            F: FnOnce(Option<u64>) -> Fut + Send,
            Fut: Future<Output = T> + Send,
            T: Send,
        {
            Self::run_locked(self, work)
        }
        fn run_locked_for<F, Fut, T>(
            &self,
            wait: Duration,
            lease: Option<Duration>,
            work: F,
        ) -> impl Future<Output = Result<Option<T>>> + Send
        where
            F: FnOnce(Option<u64>) -> Fut + Send,
            Fut: Future<Output = T> + Send,
            T: Send,
        {
            Self::run_locked_for(self, wait, lease, work)
        }
        fn force_unlock(&self) -> impl Future<Output = Result<bool>> + Send {
            Self::force_unlock(self)
        }
        fn is_locked(&self) -> impl Future<Output = Result<bool>> + Send {
            Self::is_locked(self)
        }
        fn hold_count(&self) -> impl Future<Output = Result<u32>> + Send {
            Self::hold_count(self)
        }
        fn remaining_ttl(&self) -> impl Future<Output = Result<Option<Duration>>> + Send {
            Self::remaining_ttl(self)
        }
        fn is_held_by_current_owner(&self) -> impl Future<Output = Result<bool>> + Send {
            Self::is_held_by_current_owner(self)
        }
        fn inspect(&self) -> impl Future<Output = Result<Inspection>> + Send {
            Self::inspect(self)
        }
    };
}

impl DistributedLock for Lock {
    forward!();
}

impl<P: QuorumPolicy> DistributedLock for QuorumLock<P> {
    forward!();
}
