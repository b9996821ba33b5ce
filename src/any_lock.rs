//! One of the three lock types, chosen at run time: what a service that
//! reads "one node, or a RedLock over five" from its configuration holds.

use std::time::Duration;

use crate::distributed_lock::DistributedLock;
use crate::error::Result;
use crate::guard::Guard;
use crate::inspect::Inspection;
use crate::owner::Owner;
use crate::quorum::{MultiLock, RedLock};
use crate::single::Lock;

/// A [`Lock`], [`MultiLock`] or [`RedLock`], chosen at run time, and a
/// [`DistributedLock`] itself: every method forwards to the lock inside.
/// (`Box<dyn DistributedLock>` cannot be: the trait's methods are generic
/// and return `impl Future`.)
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use multilock::{AnyLock, Client, DistributedLock, Node};
///
/// # async fn demo(urls: Vec<String>) -> multilock::Result<()> {
/// let client = Client::new();
/// let nodes = urls.iter().map(|url| Node::new(url)).collect::<multilock::Result<Vec<_>>>()?;
/// // From the configuration: one node, or a RedLock over several.
/// let lock: AnyLock = match nodes.as_slice() {
///     [one] => client.lock(one, "orders:42")?.into(),
///     many => client.red_lock_on(many, "orders:42")?.into(),
/// };
/// if let Some(guard) = lock.try_lock_for(Duration::from_secs(2), None).await? {
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyLock {
    /// A lock on one node.
    Single(Lock),
    /// A lock that every node must grant.
    Multi(MultiLock),
    /// A lock that a majority of the nodes must grant.
    Red(RedLock),
}

impl From<Lock> for AnyLock {
    fn from(lock: Lock) -> Self {
        AnyLock::Single(lock)
    }
}

impl From<MultiLock> for AnyLock {
    fn from(lock: MultiLock) -> Self {
        AnyLock::Multi(lock)
    }
}

impl From<RedLock> for AnyLock {
    fn from(lock: RedLock) -> Self {
        AnyLock::Red(lock)
    }
}

/// `$body` with `$lock` bound to the lock inside `$any`, whichever it is.
macro_rules! each {
    ($any:expr, $lock:ident => $body:expr) => {
        match $any {
            AnyLock::Single($lock) => $body,
            AnyLock::Multi($lock) => $body,
            AnyLock::Red($lock) => $body,
        }
    };
}

impl DistributedLock for AnyLock {
    fn name(&self) -> &str {
        each!(self, lock => lock.name())
    }

    fn with_owner(&self, owner: Owner) -> Self {
        each!(self, lock => lock.with_owner(owner).into())
    }

    fn owner(&self) -> Owner {
        each!(self, lock => lock.owner())
    }

    async fn lock(&self) -> Result<Guard> {
        each!(self, lock => lock.lock().await)
    }

    async fn lock_with_lease(&self, lease: Duration) -> Result<Guard> {
        each!(self, lock => lock.lock_with_lease(lease).await)
    }

    async fn try_lock(&self) -> Result<Option<Guard>> {
        each!(self, lock => lock.try_lock().await)
    }

    async fn try_lock_for(&self, wait: Duration, lease: Option<Duration>) -> Result<Option<Guard>> {
        each!(self, lock => lock.try_lock_for(wait, lease).await)
    }

    async fn run_locked<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(Option<u64>) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        each!(self, lock => lock.run_locked(work).await)
    }

    async fn run_locked_for<F, Fut, T>(
        &self,
        wait: Duration,
        lease: Option<Duration>,
        work: F,
    ) -> Result<Option<T>>
    where
        F: FnOnce(Option<u64>) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        each!(self, lock => lock.run_locked_for(wait, lease, work).await)
    }

    async fn force_unlock(&self) -> Result<bool> {
        each!(self, lock => lock.force_unlock().await)
    }

    async fn is_locked(&self) -> Result<bool> {
        each!(self, lock => lock.is_locked().await)
    }

    async fn hold_count(&self) -> Result<u32> {
        each!(self, lock => lock.hold_count().await)
    }

    async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        each!(self, lock => lock.remaining_ttl().await)
    }

    async fn is_held_by_current_owner(&self) -> Result<bool> {
        each!(self, lock => lock.is_held_by_current_owner().await)
    }

    async fn inspect(&self) -> Result<Inspection> {
        each!(self, lock => lock.inspect().await)
    }
}
