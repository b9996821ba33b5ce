//! Scoped locking: acquire, run the caller's work, release. Like
//! node-redlock's and rslock's `using`, but the work is stopped (dropped)
//! as soon as the lock can no longer be proven held, and the caller is told.
//! The work is the hold's scope: acquires of the same locks made inside it
//! re-enter the hold (see [`Owner`](crate::Owner)).
//!
//! Above the lock kinds and the guard: the locks' `run_locked` methods are
//! written here, on their public acquires, so nothing below imports this.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::owner::{self, LockId};
use crate::quorum::{QuorumLock, QuorumPolicy};
use crate::single::Lock;

impl Lock {
    /// Acquires (as [`Lock::lock`]: waiting as long as it takes, renewed by
    /// the watchdog), runs `work` with the fencing token (`None` unless the
    /// lock is fenced), releases, and returns what `work` returned.
    ///
    /// `work` is the hold's scope and runs as its owner: an acquire made
    /// inside it through a handle without an owner of its own re-enters
    /// the hold (code the critical section calls may lock again); a future
    /// beside it, in the same task, does not, and waits. Acquires inside
    /// `work` take each lock in turns: two joined inside it are siblings,
    /// not nested in each other, so the second waits until the first's
    /// guard is gone (see [`Owner`](crate::Owner)).
    ///
    /// If the lock can no longer be proven held before `work` finishes (the
    /// guard's [`lost()`](crate::Guard::lost) fires), `work` is dropped and
    /// the call returns [`Error::LockLost`](crate::Error::LockLost). Dropped
    /// means what dropping any future means: it stops at the await point it
    /// was waiting at and never resumes, and what it already did stays done.
    /// A request it had sent may still be applied, and a task it spawned
    /// goes on. So pass the fencing token with every write the lock
    /// protects, and let the resource refuse a token lower than one it has
    /// seen.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let total = lock
    ///     .run_locked(|token| async move {
    ///         // ... read, compute, write with `token` ...
    ///         42
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Lock::lock`]; [`Error::LockLost`](crate::Error::LockLost) as
    /// above; and the release's error, if the release fails after `work`
    /// finished ([`Error::NotHeld`](crate::Error::NotHeld) when the lock ran
    /// out just as it ended: then `work` cannot be known to have run under
    /// the lock).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `work` and releases the lock in the
    /// background.
    pub async fn run_locked<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(Option<u64>) -> Fut,
        Fut: Future<Output = T>,
    {
        run_locked(self.lock(), self.name(), [self.scope_id()], work).await
    }

    /// [`Lock::run_locked`] with a bounded wait, the call a service makes:
    /// acquires with [`Lock::try_lock_for`]`(wait, lease)`, runs `work` with
    /// the fencing token, releases, and returns `Some` of what `work`
    /// returned; `Ok(None)` when the lock was not granted within `wait`,
    /// and then `work` did not run.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let wait = Duration::from_secs(2);
    /// match lock.run_locked_for(wait, None, |token| async move { 42 }).await? {
    ///     Some(total) => println!("computed {total} under the lock"),
    ///     None => println!("busy: try again later"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Lock::try_lock_for`], and as [`Lock::run_locked`] once granted.
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::run_locked`]: dropping the future drops `work` and
    /// releases the lock, or settles the acquire, in the background.
    pub async fn run_locked_for<F, Fut, T>(
        &self,
        wait: Duration,
        lease: Option<Duration>,
        work: F,
    ) -> Result<Option<T>>
    where
        F: FnOnce(Option<u64>) -> Fut,
        Fut: Future<Output = T>,
    {
        let acquire = self.try_lock_for(wait, lease);
        run_locked_for(acquire, self.name(), [self.scope_id()], work).await
    }
}

impl<P: QuorumPolicy> QuorumLock<P> {
    /// Acquires (as [`QuorumLock::lock`]: waiting as long as it takes, renewed by
    /// the watchdog), runs `work` with the fencing token (`None` unless the
    /// lock is fenced), releases, and returns what `work` returned. `work`
    /// is the hold's scope, as in [`Lock::run_locked`]: acquires inside it of
    /// this lock, or of one of its parts, re-enter.
    ///
    /// If the lock can no longer be proven held before `work` finishes (the
    /// guard's [`lost()`](crate::Guard::lost) fires), `work` is dropped and
    /// the call returns [`Error::LockLost`](crate::Error::LockLost). Dropped
    /// means what dropping any future means: it stops at the await point it
    /// was waiting at and never resumes, and what it already did stays done.
    /// A request it had sent may still be applied, and a task it spawned
    /// goes on. So pass the fencing token with every write the lock
    /// protects, and let the resource refuse a token lower than one it has
    /// seen.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::RedLock) -> multilock::Result<()> {
    /// let total = lock
    ///     .run_locked(|token| async move {
    ///         // ... read, compute, write with `token` ...
    ///         42
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`QuorumLock::lock`]; [`Error::LockLost`](crate::Error::LockLost) as
    /// above; and the release's error, if the release fails after `work`
    /// finished ([`Error::NotHeld`](crate::Error::NotHeld) when the lock ran
    /// out just as it ended: then `work` cannot be known to have run under
    /// the lock).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `work` and releases the lock in the
    /// background.
    pub async fn run_locked<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(Option<u64>) -> Fut,
        Fut: Future<Output = T>,
    {
        let scope = self.locks().iter().map(Lock::scope_id);
        run_locked(self.lock(), self.name(), scope, work).await
    }

    /// [`QuorumLock::run_locked`] with a bounded wait: acquires with
    /// [`QuorumLock::try_lock_for`]`(wait, lease)`, runs `work` with the
    /// fencing token, releases, and returns `Some` of what `work` returned;
    /// `Ok(None)` when the lock was not granted within `wait`, and then
    /// `work` did not run.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn demo(lock: multilock::RedLock) -> multilock::Result<()> {
    /// let wait = Duration::from_secs(2);
    /// if let Some(total) = lock.run_locked_for(wait, None, |_token| async { 42 }).await? {
    ///     println!("computed {total} under the lock");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`QuorumLock::try_lock_for`], and as [`QuorumLock::run_locked`]
    /// once granted.
    ///
    /// # Cancel safety
    ///
    /// As [`QuorumLock::run_locked`].
    pub async fn run_locked_for<F, Fut, T>(
        &self,
        wait: Duration,
        lease: Option<Duration>,
        work: F,
    ) -> Result<Option<T>>
    where
        F: FnOnce(Option<u64>) -> Fut,
        Fut: Future<Output = T>,
    {
        let scope = self.locks().iter().map(Lock::scope_id);
        let acquire = self.try_lock_for(wait, lease);
        run_locked_for(acquire, self.name(), scope, work).await
    }
}

/// Acquires with `acquire` (a lock's `lock()`), runs `work` with the
/// fencing token as the scope of the hold of the locks `scope`, and
/// releases. If the guard's `lost()` fires first, `work` is dropped and the
/// result is [`Error::LockLost`] naming lock `name`; see
/// [`Lock::run_locked`](crate::Lock::run_locked).
pub(crate) async fn run_locked<F, Fut, T>(
    acquire: impl Future<Output = Result<Guard>>,
    name: &str,
    scope: impl IntoIterator<Item = LockId>,
    work: F,
) -> Result<T>
where
    F: FnOnce(Option<u64>) -> Fut,
    Fut: Future<Output = T>,
{
    run_held(acquire.await?, name, scope, work).await
}

/// As [`run_locked`], with an acquire that may end without the lock (a
/// lock's `try_lock_for`): then `work` is not run, and the result is
/// `Ok(None)`.
pub(crate) async fn run_locked_for<F, Fut, T>(
    acquire: impl Future<Output = Result<Option<Guard>>>,
    name: &str,
    scope: impl IntoIterator<Item = LockId>,
    work: F,
) -> Result<Option<T>>
where
    F: FnOnce(Option<u64>) -> Fut,
    Fut: Future<Output = T>,
{
    match acquire.await? {
        Some(guard) => run_held(guard, name, scope, work).await.map(Some),
        None => Ok(None),
    }
}

/// Runs `work` under `guard`, then releases; see [`run_locked`].
async fn run_held<F, Fut, T>(
    guard: Guard,
    name: &str,
    scope: impl IntoIterator<Item = LockId>,
    work: F,
) -> Result<T>
where
    F: FnOnce(Option<u64>) -> Fut,
    Fut: Future<Output = T>,
{
    let finished = {
        let work = owner::within(scope, guard.owner(), work(guard.fencing_token()));
        tokio::pin!(work);
        tokio::select! {
            // A loss seen together with the work's end wins: that end cannot
            // be trusted to have happened under the lock.
            biased;
            () = guard.lost() => None,
            output = &mut work => Some(output),
        }
        // `work` is dropped here, finished or not.
    };
    match finished {
        Some(output) => guard.unlock().await.map(|()| output),
        None => {
            tracing::warn!(lock = %name, "lock lost while its work ran; the work was dropped");
            // What is left of the hold goes; it is already known lost.
            let _ = guard.unlock().await;
            Err(Error::LockLost {
                lock: name.to_owned(),
            })
        }
    }
}
