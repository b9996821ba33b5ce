//! What the three lock types have in common, as a trait, so code can be
//! written once for a single-node lock, a MultiLock or a RedLock.

use std::time::Duration;

use crate::error::Result;
use crate::guard::Guard;
use crate::lock::Lock;
use crate::multi::{QuorumLock, QuorumPolicy};

/// The methods [`Lock`], [`MultiLock`](crate::MultiLock) and
/// [`RedLock`](crate::RedLock) share; each forwards to the inherent method of
/// the same name, whose documentation (errors, cancel safety) applies.
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
    /// See [`Lock::lock`].
    fn lock(&self) -> impl Future<Output = Result<Guard>> + Send;
    /// See [`Lock::lock_with_lease`].
    fn lock_with_lease(&self, lease: Duration) -> impl Future<Output = Result<Guard>> + Send;
    /// See [`Lock::try_lock`].
    fn try_lock(&self) -> impl Future<Output = Result<Option<Guard>>> + Send;
    /// See [`Lock::try_lock_for`].
    fn try_lock_for(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Guard>>> + Send;
    /// See [`Lock::force_unlock`].
    fn force_unlock(&self) -> impl Future<Output = Result<bool>> + Send;
    /// See [`Lock::is_locked`].
    fn is_locked(&self) -> impl Future<Output = Result<bool>> + Send;
    /// See [`Lock::hold_count`].
    fn hold_count(&self) -> impl Future<Output = Result<u32>> + Send;
    /// See [`Lock::remaining_ttl`].
    fn remaining_ttl(&self) -> impl Future<Output = Result<Option<Duration>>> + Send;
    /// See [`Lock::is_held_by_current_owner`].
    fn is_held_by_current_owner(&self) -> impl Future<Output = Result<bool>> + Send;
}

macro_rules! forward {
    () => {
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
    };
}

impl DistributedLock for Lock {
    forward!();
}

impl<P: QuorumPolicy> DistributedLock for QuorumLock<P> {
    forward!();
}
