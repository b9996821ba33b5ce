//! Proof of holding: the [`Guard`] and the per-node parts it is made of.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::detach::FinishOnDrop;
use crate::error::{Error, FailureCause, NodeFailure, QuorumError, Result};
use crate::lock::Lock;
use crate::owner::Owner;
use crate::protocol::Released;
use crate::watchdog::Renewal;

/// One node's share of a hold: the lock there, the field written, and its
/// renewal. Dropping a part that was not released releases it in the
/// background, so a part can never be forgotten while granted.
pub(crate) struct HeldPart {
    pub(crate) lock: Lock,
    pub(crate) field: Arc<str>,
    /// `None`: renewed by the watchdog.
    pub(crate) lease: Option<Duration>,
    pub(crate) renewal: Option<Renewal>,
    pub(crate) token: Option<u64>,
    /// When the acquire request was sent: a fixed lease runs at least until
    /// this plus the lease (the server applied the request after it).
    pub(crate) sent_at: Instant,
    /// When its grant arrived: a fixed lease has surely run out once this
    /// plus the lease (and drift) is past.
    replied_at: Instant,
    armed: bool,
}

impl HeldPart {
    pub(crate) fn new(
        lock: Lock,
        field: Arc<str>,
        lease: Option<Duration>,
        renewal: Option<Renewal>,
        token: Option<u64>,
        sent_at: Instant,
    ) -> Self {
        HeldPart {
            lock,
            field,
            lease,
            renewal,
            token,
            sent_at,
            replied_at: Instant::now(),
            armed: true,
        }
    }

    pub(crate) fn node_addr(&self) -> &str {
        self.lock.node().addr()
    }

    /// Releases this part: stops its renewal first, waits out a renewal call
    /// under way, then sends the release. Finishes in the background if the
    /// returned future is dropped.
    pub(crate) fn release(mut self) -> FinishOnDrop<impl Future<Output = Result<Released>>> {
        self.armed = false;
        let job = self.release_job();
        FinishOnDrop::new(job, log_failure)
    }

    fn release_job(&mut self) -> impl Future<Output = Result<Released>> + Send + 'static + use<> {
        // A hold that is over (the watchdog found it gone, or its fixed lease
        // surely ran out) is not released: releasing its field would lower
        // the count of a later hold by the same owner.
        let gone = match (&self.renewal, self.lease) {
            (Some(renewal), _) => renewal.is_gone(),
            (None, Some(lease)) => {
                Instant::now() >= crate::lease::surely_expired_at(self.replied_at, lease)
            }
            (None, None) => false,
        };
        // Deregistered now, before anything is sent: no renewal may follow.
        let watchdog = self.renewal.take().map(Renewal::stop);
        let lock = self.lock.clone();
        let field = self.field.clone();
        let lease = self.lease;
        async move {
            if gone {
                return Err(Error::NotHeld {
                    lock: lock.name().to_owned(),
                    node: lock.node().addr().to_owned(),
                });
            }
            if let Some(watchdog) = watchdog {
                watchdog.quiesce().await;
            }
            lock.release_field(&field, lease).await
        }
    }

    /// Until when this part surely holds; `None` once known gone.
    fn trusted_until(&self) -> Option<Instant> {
        match (&self.renewal, self.lease) {
            (Some(renewal), _) => renewal.trusted_until(),
            (None, Some(lease)) => Some(crate::lease::trusted_until(self.sent_at, lease)),
            (None, None) => None,
        }
    }

    /// Resolves when this part is gone or may be: the watchdog found it
    /// missing or could not confirm it in time, or its fixed lease ran out.
    async fn lost(&self) {
        match (&self.renewal, self.lease) {
            (Some(renewal), _) => renewal.lost().await,
            (None, Some(lease)) => {
                tokio::time::sleep_until(crate::lease::trusted_until(self.sent_at, lease)).await
            }
            (None, None) => std::future::pending().await,
        }
    }
}

impl Drop for HeldPart {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Dropped unpolled, it moves the whole release onto the runtime.
        drop(FinishOnDrop::new(self.release_job(), log_failure));
    }
}

/// What a release nobody awaits does with its outcome.
fn log_failure(result: Result<Released>) -> futures::future::BoxFuture<'static, ()> {
    async move {
        if let Err(err) = result {
            tracing::warn!(error = %err, "background release failed");
        }
    }
    .boxed()
}

/// Proof that a lock is held: returned by every acquire of [`Lock`],
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
    /// Nodes of the lock, held or not.
    nodes: usize,
    quorum: usize,
    valid_until: Option<Instant>,
    token: Option<u64>,
}

impl Guard {
    pub(crate) fn new(
        owner: Owner,
        parts: Vec<HeldPart>,
        nodes: usize,
        quorum: usize,
        valid_until: Option<Instant>,
        token: Option<u64>,
    ) -> Self {
        Guard {
            owner,
            parts,
            nodes,
            quorum,
            valid_until,
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
        if self.nodes == 1
            && parts.len() == 1
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
        if released >= self.quorum {
            Ok(())
        } else {
            Err(Error::NoQuorum(QuorumError {
                lock: name,
                succeeded: released,
                required: self.quorum,
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
        let spare = self.parts.len().saturating_sub(self.quorum);
        let mut lost: FuturesUnordered<_> = self.parts.iter().map(HeldPart::lost).collect();
        for _ in 0..=spare {
            if lost.next().await.is_none() {
                return;
            }
        }
    }

    /// The fencing token, when the lock was made with fencing on
    /// ([`Lock::with_fencing`]). Tokens strictly increase across successive
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
        if let Some(fixed) = self.valid_until {
            return Some(fixed.into_std());
        }
        let mut trusted: Vec<Instant> = self
            .parts
            .iter()
            .filter_map(HeldPart::trusted_until)
            .collect();
        trusted.sort_unstable_by(|a, b| b.cmp(a));
        trusted
            .get(self.quorum.checked_sub(1)?)
            .map(|t| t.into_std())
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("name", &self.name())
            .field("owner", &self.owner)
            .field("nodes", &self.nodes())
            .field("quorum", &self.quorum)
            .field("fencing_token", &self.token)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_static<T: Send + 'static>() {}
    fn assert_send_sync<T: Send + Sync + 'static>() {}

    #[test]
    fn guards_and_handles_move_between_tasks() {
        assert_send_static::<Guard>();
        assert_send_sync::<Lock>();
        assert_send_sync::<crate::MultiLock>();
        assert_send_sync::<crate::RedLock>();
        assert_send_sync::<crate::Client>();
        assert_send_sync::<crate::Node>();
    }

    #[allow(dead_code)]
    fn futures_are_send(lock: Lock, guard: Guard) {
        fn is_send<T: Send>(_: T) {}
        is_send(lock.lock());
        is_send(lock.try_lock_for(Duration::ZERO, None));
        is_send(guard.unlock());
    }
}
