//! Scoped locking: acquire, run the caller's work, release. Like
//! node-redlock's and rslock's `using`, but the work is stopped (dropped)
//! as soon as the lock can no longer be proven held, and the caller is told.
//! The work is the hold's scope: acquires of the same locks made inside it
//! re-enter the hold (see [`Owner`](crate::Owner)).

use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::owner::{self, LockId};

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
