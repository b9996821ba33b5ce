//! The single-node reentrant lock, wire-compatible with Redisson's `RLock`:
//! its configuration. Its public acquire methods are in [`methods`], its
//! queries in [`queries`]; how an acquire waits, sends and rolls back is in
//! [`acquire`]; a hold and its release are in [`hold`].

mod acquire;
mod burial;
mod fair;
mod hold;
mod kind;
mod methods;
mod queries;
mod read_write;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::client_core::ClientCore;
use crate::error::{Error, Result};
use crate::metrics;
use crate::node::{Lane, Node};
use crate::owner::Owner;
use crate::protocol::{Fencing, LockKeys};
use crate::timing;
use crate::watchdog::{KeptWatchdog, Renewal};

pub(crate) use acquire::Attempt;
pub use fair::DEFAULT_QUEUE_WAIT;
pub(crate) use fair::QueueSeats;
pub use read_write::ReadWriteLock;

/// The longest replica-sync wait ([`Lock::with_replica_sync`]): one minute.
pub const MAX_REPLICA_SYNC_TIMEOUT: Duration = Duration::from_secs(60);
pub(crate) use hold::{HeldPart, PartView, proven};

/// A reentrant lock on one Redis node, compatible with Redisson's `RLock`.
///
/// The lock is a hash named `name`; the field `<client-uuid>:<owner>` holds
/// the hold count. Waiters listen on `redisson_lock__channel:{name}`. A Java
/// service using Redisson and this crate can share one lock.
///
/// The handle is cheap to clone, `Send + Sync`, and holds no state of holding:
/// that lives in the [`Guard`](crate::Guard). By default every acquire has an owner of its
/// own, so two acquires never both hold, even from one task; re-entry is
/// asked for, with [`Lock::with_owner`] or inside [`Lock::run_locked`] (see
/// [`Owner`]).
///
/// Locks taken without a lease are renewed by the client's watchdog every
/// third of the watchdog timeout while held; with a lease they expire after it.
///
/// Like Redisson's `RLock`, the lock is not fair: a release wakes one local
/// waiter per unlock message, but a holder that releases and asks again at
/// once often wins the race against the woken waiter.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use multilock::{Client, Node};
///
/// # async fn demo() -> multilock::Result<()> {
/// let client = Client::new();
/// let node = Node::new("redis://127.0.0.1:6379")?;
/// let lock = client.lock(&node, "orders:42")?;
///
/// let guard = lock.lock().await?;          // waits; renewed by the watchdog
/// guard.unlock().await?;
///
/// let job = lock.with_owner(multilock::Owner::new("job-1")?);
/// let outer = job.lock().await?;
/// let inner = job.lock().await?;           // the same owner re-enters
/// assert_eq!(job.hold_count().await?, 2);
/// inner.unlock().await?;
/// outer.unlock().await?;
///
/// if let Some(guard) = lock.try_lock_for(Duration::from_secs(1), Some(Duration::from_secs(10))).await? {
///     // held for at most 10 s
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    inner: Arc<LockInner>,
    owner: Option<Owner>,
    /// A fair lock's share of the queue for the acquire under way (`None`:
    /// the lock's own, see [`Lock::with_queue_wait`]).
    queue_wait: Option<Duration>,
}

#[derive(Clone)]
struct LockInner {
    core: Arc<ClientCore>,
    node: Node,
    keys: LockKeys,
    /// The node's shared connection its requests take.
    lane: Lane,
    /// How grants treat the fencing counter.
    fencing: Fencing,
    /// How long a hold may be kept by renewal alone (`None`: no limit).
    max_hold: Option<Duration>,
    /// How long a guard may be held before the crate warns (`None`: never).
    hold_warning: Option<Duration>,
    /// Its metrics, whose `kind` is a lock of its own, or a part of which
    /// quorum lock.
    metrics: metrics::LockMetrics,
    /// Replicas that must acknowledge a grant, and how long to wait for them.
    replica_sync: Option<(u32, Duration)>,
    /// Which of Redisson's locks this is.
    family: kind::Family,
    /// Its node's watchdog, kept between holds.
    watchdog: KeptWatchdog,
}

impl Lock {
    pub(crate) fn new(core: Arc<ClientCore>, node: Node, name: String) -> Result<Lock> {
        let (max_hold, hold_warning) = (core.max_hold, core.hold_warning);
        if name.is_empty() {
            return Err(Error::invalid("lock name must not be empty"));
        }
        let keys = node.lock_keys(&name)?;
        let metrics = node.lock_metrics(metrics::SINGLE);
        Ok(Lock {
            inner: Arc::new(LockInner {
                core,
                node,
                keys,
                lane: Lane::of(&name),
                fencing: Fencing::Off,
                max_hold,
                hold_warning,
                metrics,
                replica_sync: None,
                family: kind::Family::Reentrant,
                watchdog: KeptWatchdog::default(),
            }),
            owner: None,
            queue_wait: None,
        })
    }

    /// A fair lock (Redisson's `getFairLock`) named `name` on `node`.
    pub(crate) fn new_fair(core: Arc<ClientCore>, node: Node, name: String) -> Result<Lock> {
        let lock = Lock::new(core, node, name)?;
        let queue = fair::FairQueue::new(lock.name());
        Ok(lock.rebuilt(|inner| inner.family = kind::Family::Fair(queue)))
    }

    /// The read lock and the write lock of the read-write lock `name` on
    /// `node` (Redisson's `getReadWriteLock`).
    pub(crate) fn new_read_write(
        core: Arc<ClientCore>,
        node: Node,
        name: String,
    ) -> Result<(Lock, Lock)> {
        let lock = Lock::new(core, node, name)?;
        let keys = LockKeys::read_write(lock.name()).with_publish(lock.keys().publish.clone());
        let half = |family: kind::Family| {
            let keys = keys.clone();
            lock.rebuilt(move |inner| {
                inner.keys = keys;
                inner.family = family;
            })
        };
        Ok((half(kind::Family::Read), half(kind::Family::Write)))
    }

    /// True for a fair lock ([`Client::fair_lock`](crate::Client::fair_lock)).
    pub fn is_fair(&self) -> bool {
        self.queue().is_some()
    }

    /// This fair lock with `wait` as the share of the queue a waiter takes
    /// when its acquire waits until granted ([`Lock::lock`],
    /// [`Lock::lock_with_lease`], and a MultiLock's or RedLock's `lock()`
    /// of it; a bounded wait takes its own, and [`Lock::try_lock`] does not
    /// queue): how long the queue keeps the turn of a waiter that
    /// stopped asking (it crashed) before the waiters behind it move on.
    /// A live waiter whose turn was dropped queues again at the tail.
    /// Redisson's default is [`DEFAULT_QUEUE_WAIT`], 5 minutes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] on a lock that is not fair, or for a wait
    /// under 1 ms or over [`MAX_LEASE`](crate::MAX_LEASE).
    ///
    /// # Examples
    ///
    /// ```
    /// # let client = multilock::Client::new();
    /// # let node = multilock::Node::new("redis://127.0.0.1:6379")?;
    /// use std::time::Duration;
    /// let queue = client.fair_lock(&node, "tickets")?.with_queue_wait(Duration::from_secs(30))?;
    /// # Ok::<(), multilock::Error>(())
    /// ```
    #[must_use = "this returns a new handle and leaves the original as it was"]
    pub fn with_queue_wait(&self, wait: Duration) -> Result<Lock> {
        if self.queue().is_none() {
            return Err(Error::invalid(format!(
                "lock {:?} is not a fair lock: it has no queue",
                self.name()
            )));
        }
        if wait < Duration::from_millis(1) || wait > timing::MAX_LEASE {
            return Err(Error::invalid(
                "a fair lock's queue wait must be from 1 ms to ten years (MAX_LEASE)",
            ));
        }
        Ok(self.rebuilt(|inner| {
            if let kind::Family::Fair(queue) = &mut inner.family {
                queue.wait = wait;
            }
        }))
    }

    /// The lock's name (the Redis key).
    pub fn name(&self) -> &str {
        &self.inner.keys.name
    }

    /// The node the lock lives on.
    pub fn node(&self) -> &Node {
        &self.inner.node
    }

    pub(crate) fn keys(&self) -> &LockKeys {
        &self.inner.keys
    }

    /// Which of its node's shared connections this lock's requests take.
    pub(crate) fn lane(&self) -> Lane {
        self.inner.lane
    }

    /// The client this lock was made by.
    pub(crate) fn core(&self) -> &Arc<ClientCore> {
        &self.inner.core
    }

    /// The lease of holds taken without one (the client's watchdog timeout).
    pub(crate) fn watchdog_timeout(&self) -> Duration {
        self.inner.core.watchdog_timeout()
    }

    /// This handle bound to an explicit owner: every acquire through it holds
    /// for `owner`, whatever task runs it, and re-enters `owner`'s hold. For
    /// nested acquires, sharing a hold between tasks or handing it over
    /// (`lock.with_owner(guard.owner().clone())` re-enters a guard's hold).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// use multilock::Owner;
    /// let job = lock.with_owner(Owner::new("job-17")?);
    /// let guard = job.lock().await?;
    /// // Another task, same owner: re-enters instead of waiting.
    /// let again = tokio::spawn(async move { job.lock().await }).await.unwrap()?;
    /// again.unlock().await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    #[must_use = "this returns a new handle and leaves the original as it was"]
    pub fn with_owner(&self, owner: Owner) -> Lock {
        Lock {
            inner: self.inner.clone(),
            owner: Some(owner),
            queue_wait: self.queue_wait,
        }
    }

    /// This lock with fencing tokens: each grant (re-entries too) INCRs the counter
    /// `redisson_lock_token:{name}` in the acquire script (Redisson's fenced
    /// lock) and the guard carries the value ([`Guard::fencing_token`](crate::Guard::fencing_token)).
    ///
    /// The counter has no expiry, as in Redisson: a Redisson client
    /// fencing the same name INCRs it without renewing any expiry, and
    /// would start an expired counter again from 1, handing the next
    /// holder a token lower than ones already used, so the protected
    /// resource would refuse its writes (or accept an old holder's). One
    /// small key per lock name is the price. (A RedLock's or MultiLock's
    /// counters, which only this crate writes, expire after an idle time:
    /// see [`ClientBuilder::fencing_counter_expiry`](crate::ClientBuilder::fencing_counter_expiry).) A node that loses its data (a restart without persistence, a
    /// failover to a replica that missed the INCR) loses the counter too.
    /// Redisson's next token is then 1; here a missing counter starts at
    /// the wall-clock floor (microseconds since the Unix epoch, created in
    /// the same script), which no earlier token exceeds unless the name was
    /// granted more than once per microsecond: tokens do not go back. A
    /// counter restored lower (from a stale snapshot) is not detected on
    /// one node; [`RedLock`](crate::RedLock)'s fencing repairs that too.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let fenced = lock.with_fencing();
    /// let guard = fenced.lock().await?;
    /// let token = guard.fencing_token().expect("fencing is on");
    /// // Send `token` with every write; the store refuses tokens lower than seen.
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    #[must_use = "this returns a new handle and leaves the original as it was"]
    pub fn with_fencing(&self) -> Lock {
        self.rebuilt(|inner| inner.fencing = Fencing::Single)
    }

    /// This lock with replica sync: after each grant, `WAIT replicas timeout`
    /// on the same connection (Redisson's replica-sync check). When fewer
    /// replicas acknowledge in time, the grant is released and the acquire
    /// fails with [`Error::ReplicaSync`]: a lock that a failover could lose
    /// is never handed out. Costs one more round trip per acquire (plus the
    /// replication delay).
    ///
    /// This narrows the failover window of a primary with replicas; it does
    /// not close it (a replica can acknowledge and still not be the one
    /// promoted). Independent masters ([`MultiLock`](crate::MultiLock),
    /// [`RedLock`](crate::RedLock)) do not depend on replication at all.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `replicas` is 0, or `timeout` is under
    /// 1 ms (`WAIT` with 0 would block forever) or over
    /// [`MAX_REPLICA_SYNC_TIMEOUT`] (a `WAIT` blocks its connection and the
    /// acquire meanwhile).
    ///
    /// # Examples
    ///
    /// ```
    /// # let client = multilock::Client::new();
    /// # let primary = multilock::Node::new("redis://127.0.0.1:6379")?;
    /// use std::time::Duration;
    /// let lock = client.lock(&primary, "orders:42")?
    ///     .with_replica_sync(1, Duration::from_millis(100))?;
    /// # Ok::<(), multilock::Error>(())
    /// ```
    #[must_use = "this returns a new handle and leaves the original as it was"]
    pub fn with_replica_sync(&self, replicas: u32, timeout: Duration) -> Result<Lock> {
        if replicas == 0 {
            return Err(Error::invalid("replica sync needs at least one replica"));
        }
        if timeout < Duration::from_millis(1) || timeout > MAX_REPLICA_SYNC_TIMEOUT {
            return Err(Error::invalid(
                "replica sync timeout must be from 1 ms to one minute (MAX_REPLICA_SYNC_TIMEOUT)",
            ));
        }
        Ok(self.rebuilt(|inner| inner.replica_sync = Some((replicas, timeout))))
    }

    /// This lock with its own maximum hold time: a hold taken without a
    /// lease is renewed for at most `max_hold` from its grant; then renewal
    /// stops, it expires with its last lease, and the guard's `lost()`
    /// fires. Overrides [`ClientBuilder::max_hold`](crate::ClientBuilder::max_hold).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a duration under 1 ms or over
    /// [`MAX_LEASE`](crate::MAX_LEASE).
    ///
    /// # Examples
    ///
    /// ```
    /// # let client = multilock::Client::new();
    /// # let node = multilock::Node::new("redis://127.0.0.1:6379")?;
    /// use std::time::Duration;
    /// let job = client.lock(&node, "nightly-report")?.with_max_hold(Duration::from_secs(3600))?;
    /// # Ok::<(), multilock::Error>(())
    /// ```
    #[must_use = "this returns a new handle and leaves the original as it was"]
    pub fn with_max_hold(&self, max_hold: Duration) -> Result<Lock> {
        timing::check_max_hold(max_hold)?;
        Ok(self.rebuilt(|inner| inner.max_hold = Some(max_hold)))
    }

    /// This lock with its own hold warning: a guard of it still held
    /// `after` from when it was handed out logs one `tracing` warning (the
    /// lock, its owner, its node, how long held) and counts one
    /// `multilock_hold_warnings_total` (feature `metrics`). Each guard warns
    /// once at most (a re-entry's guard is a guard of its own); a guard
    /// released, dropped or [lost](crate::Guard::lost) before then never
    /// does. Unlike [`Lock::with_max_hold`], it changes nothing about the
    /// hold. Overrides
    /// [`ClientBuilder::hold_warning`](crate::ClientBuilder::hold_warning).
    /// A [`MultiLock`](crate::MultiLock) or [`RedLock`](crate::RedLock)
    /// warns for its whole hold by its own setting
    /// ([`QuorumLock::with_hold_warning`](crate::QuorumLock::with_hold_warning)),
    /// never for its parts.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a duration under 1 ms or over
    /// [`MAX_LEASE`](crate::MAX_LEASE).
    ///
    /// # Examples
    ///
    /// ```
    /// # let client = multilock::Client::new();
    /// # let node = multilock::Node::new("redis://127.0.0.1:6379")?;
    /// use std::time::Duration;
    /// let job = client.lock(&node, "nightly-report")?.with_hold_warning(Duration::from_secs(600))?;
    /// # Ok::<(), multilock::Error>(())
    /// ```
    #[must_use = "this returns a new handle and leaves the original as it was"]
    pub fn with_hold_warning(&self, after: Duration) -> Result<Lock> {
        timing::check_hold_warning(after)?;
        Ok(self.rebuilt(|inner| inner.hold_warning = Some(after)))
    }

    /// How long a guard of this lock may be held before the crate warns.
    pub(crate) fn hold_warning(&self) -> Option<Duration> {
        self.inner.hold_warning
    }

    /// How the watchdog renews a hold granted by a request sent at
    /// `sent_at` (`lease`: `None` for the watchdog's).
    fn renewal(&self, lease: Option<Duration>, sent_at: tokio::time::Instant) -> Renewal {
        match lease {
            Some(_) => Renewal::None,
            None => Renewal::Until(
                self.inner
                    .max_hold
                    .map(|cap| timing::deadline(sent_at, cap)),
            ),
        }
    }

    fn rebuilt(&self, change: impl FnOnce(&mut LockInner)) -> Lock {
        let mut inner = (*self.inner).clone();
        change(&mut inner);
        Lock {
            inner: Arc::new(inner),
            owner: self.owner.clone(),
            queue_wait: self.queue_wait,
        }
    }

    /// Whether the lock was built with its own (single-node) fencing, and
    /// its replica sync: what a quorum lock checks of its parts.
    pub(crate) fn part_settings(&self) -> (bool, Option<(u32, Duration)>) {
        (
            self.inner.fencing == Fencing::Single,
            self.inner.replica_sync,
        )
    }

    /// True when fencing tokens are on.
    pub fn is_fenced(&self) -> bool {
        self.inner.fencing != Fencing::Off
    }

    /// This lock as a part of a multi-node lock of `kind`, as its metrics
    /// say.
    pub(crate) fn as_part_of(&self, kind: metrics::Kind) -> Lock {
        self.rebuilt(|inner| inner.metrics = inner.node.lock_metrics(kind))
    }

    /// The kind its metrics give it.
    pub(crate) fn kind(&self) -> metrics::Kind {
        self.inner.metrics.kind()
    }

    /// Its metrics.
    pub(crate) fn metrics(&self) -> &metrics::LockMetrics {
        &self.inner.metrics
    }

    /// This lock as a part of a fenced multi-node lock: its grants INCR the
    /// counter only where it exists, and the quorum lock settles the token
    /// (a node that lost its counter is seeded from the others).
    pub(crate) fn with_quorum_fencing(&self) -> Lock {
        self.rebuilt(|inner| inner.fencing = Fencing::Quorum)
    }

    /// The owner an acquisition through this handle, made here and now,
    /// holds for: the handle's explicit owner ([`Lock::with_owner`]); else,
    /// inside the work of a [`Lock::run_locked`] of this lock, that hold's
    /// owner (the acquisition re-enters it); else a fresh
    /// [`Owner::unique`], different at every call. So the queries about
    /// "the current owner" ([`Lock::hold_count`],
    /// [`Lock::is_held_by_current_owner`]) answer for a guard's hold only
    /// through a handle bound to its owner, or inside its `run_locked`.
    pub fn owner(&self) -> Owner {
        self.resolve_owner().owner
    }

    /// [`Lock::owner`], with the turn a re-entry of a `run_locked` scope
    /// takes.
    pub(crate) fn resolve_owner(&self) -> crate::owner::Resolved {
        crate::owner::resolve(self.owner.as_ref(), [self.id_pair()])
    }

    /// The lease a request sets: the given one, else the watchdog's.
    pub(super) fn lease(&self, lease: Option<Duration>) -> Duration {
        lease.unwrap_or_else(|| self.watchdog_timeout())
    }

    /// The node's id and the lock's key: what a `run_locked` scope names.
    fn id_pair(&self) -> (u64, &str) {
        (self.inner.node.id(), self.name())
    }

    /// The lock as a `run_locked` scope names it.
    pub(crate) fn scope_id(&self) -> crate::owner::LockId {
        (self.inner.node.id(), self.inner.keys.name.clone())
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.inner.keys.name)
            .field("node", &self.inner.node.addr())
            .field("owner", &self.owner)
            .field("fenced", &self.is_fenced())
            .field("replica_sync", &self.inner.replica_sync)
            .field("family", &self.inner.family)
            .finish()
    }
}
