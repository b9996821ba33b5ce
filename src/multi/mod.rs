//! `MultiLock` and `RedLock`: one algorithm over independent nodes, with two
//! quorum policies.
//!
//! The whole algorithm is [`QuorumLock::round`], read top to bottom: send the
//! acquire to every part at once under a per-node timeout; measure how long
//! it took on a monotonic clock; keep the grants when a quorum granted within
//! the validity window, else release them all concurrently.

mod policy;

use std::fmt;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::futures::Notified;
use tokio::time::Instant;
use tracing::Instrument;

pub use policy::{All, Majority, QuorumPolicy};

use crate::client::Client;
use crate::error::{Error, FailureCause, NodeFailure, QuorumError, Result, Unavailable};
use crate::guard::{Guard, HeldPart};
use crate::lease;
use crate::lock::{Attempt, Lock, check_lease};
use crate::owner::Owner;
use crate::protocol;

/// Default per-node timeout of one acquire request in a multi-node lock.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// A lock over several single-node [`Lock`]s, granted when the policy's
/// quorum of them is: see [`MultiLock`] (all) and [`RedLock`] (N/2+1).
///
/// It offers the same methods as [`Lock`], so the three are interchangeable.
/// Each node's part is a single-node reentrant lock with its own renewal.
pub struct QuorumLock<P: QuorumPolicy> {
    locks: Arc<[Lock]>,
    owner: Option<Owner>,
    node_timeout: Duration,
    policy: PhantomData<fn() -> P>,
}

/// A lock that every one of its locks must grant.
///
/// Safe across independent masters (no failover can hand the lock to two
/// holders while every part is on its own master), and the way to lock
/// several resources at once (its parts may have different names, on one
/// node or many). One unreachable node makes it unavailable.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: multilock::Client, a: multilock::Node, b: multilock::Node) -> multilock::Result<()> {
/// let both = client.multi_lock(vec![
///     client.lock(&a, "account:1")?,
///     client.lock(&b, "account:2")?,
/// ])?;
/// let guard = both.lock().await?;
/// // ... move money between the two accounts ...
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
pub type MultiLock = QuorumLock<All>;

/// A lock that a majority (N/2+1) of its locks, each on an independent
/// master, must grant within a validity window: the Redlock algorithm.
///
/// Survives the loss of a minority of nodes. Known limits, as for every
/// Redlock: a jump of a node's clock shortens a key's life; a node restarted
/// without persistence forgets its keys (restart it only after the longest
/// lease has passed, or use AOF with `fsync always`); a holder paused longer
/// than its lease (GC, swap) keeps acting while someone else holds the
/// lock, which is what [fencing tokens](QuorumLock::with_fencing) are for.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: multilock::Client, nodes: Vec<multilock::Node>) -> multilock::Result<()> {
/// use std::time::Duration;
///
/// let red = client.red_lock_on(&nodes, "orders:42")?;
/// if let Some(guard) = red.try_lock_for(Duration::from_secs(2), Some(Duration::from_secs(10))).await? {
///     assert!(guard.nodes().len() >= nodes.len() / 2 + 1);
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
pub type RedLock = QuorumLock<Majority>;

impl<P: QuorumPolicy> QuorumLock<P> {
    pub(crate) fn new(client: &Client, locks: Vec<Lock>) -> Result<Self> {
        P::check(&locks)?;
        if locks.iter().any(|l| !l.client().same_as(client)) {
            return Err(Error::invalid(format!(
                "every lock of a {} must come from the client that makes it",
                P::NAME
            )));
        }
        Ok(QuorumLock {
            locks: locks.into(),
            owner: None,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            policy: PhantomData,
        })
    }

    /// The single-node locks this lock is made of.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// Grants required: all for a MultiLock, N/2+1 for a RedLock.
    pub fn quorum(&self) -> usize {
        P::required(self.locks.len())
    }

    /// This lock bound to an explicit owner (see [`Lock::with_owner`]).
    pub fn with_owner(&self, owner: Owner) -> Self {
        Self {
            owner: Some(owner),
            ..self.clone()
        }
    }

    /// This lock with a different per-node timeout for each acquire request
    /// (default [`DEFAULT_NODE_TIMEOUT`]; never more than a tenth of the
    /// lease, or of the watchdog timeout when the watchdog renews). A node slower than this counts as not granting, and
    /// whatever it did is rolled back.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a zero timeout.
    pub fn with_node_timeout(&self, timeout: Duration) -> Result<Self> {
        if timeout.is_zero() {
            return Err(Error::invalid("node timeout must be greater than zero"));
        }
        Ok(Self {
            node_timeout: timeout,
            ..self.clone()
        })
    }

    /// This lock with fencing tokens. Every granted node INCRs its counter
    /// in the acquire script; the guard's token is the highest of them, and
    /// before the guard is returned every reachable node's counter is raised
    /// to at least that value (a quorum of them must confirm). Any later
    /// quorum shares a node with that one, so tokens strictly increase
    /// across holders, even when a minority of nodes restarts empty.
    pub fn with_fencing(&self) -> Self {
        Self {
            locks: self.locks.iter().map(Lock::with_fencing).collect(),
            ..self.clone()
        }
    }

    /// True when fencing tokens are on ([`QuorumLock::with_fencing`]).
    pub fn is_fenced(&self) -> bool {
        self.locks.iter().all(Lock::is_fenced)
    }

    fn owner(&self) -> Owner {
        self.owner.clone().unwrap_or_else(Owner::current)
    }

    /// Acquires, trying until granted: rounds of `locks × 1500 ms` budget,
    /// repeated; node failures are logged and retried. Without a lease, each
    /// node's part is renewed by its node's watchdog.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// let guard = red.lock().await?;      // a majority of the nodes, renewed
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Only for bad input; node failures are retried.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves nothing held: requests in flight complete
    /// in the background and every grant is released.
    pub async fn lock(&self) -> Result<Guard> {
        self.acquire_until_granted(None).await
    }

    /// As [`QuorumLock::lock`], with a fixed lease on every node.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// use std::time::Duration;
    /// let guard = red.lock_with_lease(Duration::from_secs(10)).await?;
    /// println!("valid until {:?}", guard.valid_until());
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a lease under 1 ms or over [`MAX_LEASE`](crate::MAX_LEASE).
    ///
    /// # Cancel safety
    ///
    /// As [`QuorumLock::lock`].
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<Guard> {
        check_lease(lease)?;
        self.acquire_until_granted(Some(lease)).await
    }

    async fn acquire_until_granted(&self, lease: Option<Duration>) -> Result<Guard> {
        let budget = policy::default_budget(self.locks.len());
        loop {
            match self.acquire(budget, lease).await {
                Ok(Some(guard)) => return Ok(guard),
                Ok(None) => {}
                Err(Error::NoQuorum(err)) => {
                    tracing::warn!(error = %err, "no quorum within the budget; trying again");
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// One round, no waiting. `None` when the quorum was not granted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// if let Some(guard) = red.try_lock().await? {
    ///     guard.unlock().await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when so many nodes failed (rather than being
    /// held by someone else) that the quorum could not be reached.
    ///
    /// # Cancel safety
    ///
    /// As [`QuorumLock::lock`].
    pub async fn try_lock(&self) -> Result<Option<Guard>> {
        self.acquire(Duration::ZERO, None).await
    }

    /// Rounds until granted or `wait` is spent; `lease` fixes the lease,
    /// `None` lets the watchdogs renew. Between rounds it waits for an
    /// unlock message from any node (then a random fraction of a round
    /// trip, so that waiters woken together do not split the nodes), or a
    /// jittered delay.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// use std::time::Duration;
    /// match red.try_lock_for(Duration::from_secs(3), Some(Duration::from_secs(10))).await {
    ///     Ok(Some(guard)) => guard.unlock().await?,
    ///     Ok(None) => { /* contended for the whole wait */ }
    ///     Err(multilock::Error::NoQuorum(q)) => eprintln!("nodes down: {q}"),
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a lease under 1 ms or over [`MAX_LEASE`](crate::MAX_LEASE); [`Error::NoQuorum`]
    /// when, at the end of the wait, so many nodes failed that the quorum
    /// could not be reached (with each node and its error).
    ///
    /// # Cancel safety
    ///
    /// As [`QuorumLock::lock`].
    pub async fn try_lock_for(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<Guard>> {
        if let Some(lease) = lease {
            check_lease(lease)?;
        }
        self.acquire(wait, lease).await
    }

    async fn acquire(&self, wait: Duration, lease: Option<Duration>) -> Result<Option<Guard>> {
        let owner = self.owner();
        let started = Instant::now();
        let deadline = crate::lease::deadline(started, wait);
        let span = tracing::debug_span!(
            "acquire",
            kind = P::NAME,
            lock = %self.locks[0].name(),
            nodes = self.locks.len(),
            owner = %owner
        );
        async {
            let outcome = self.rounds(&owner, lease, deadline).await;
            let elapsed_us = started.elapsed().as_micros() as u64;
            match &outcome {
                Ok(Some(guard)) => tracing::debug!(elapsed_us, held = ?guard.nodes(), "acquired"),
                Ok(None) => tracing::debug!(elapsed_us, "not acquired within the wait"),
                Err(err) => tracing::debug!(elapsed_us, error = %err, "acquire failed"),
            }
            outcome
        }
        .instrument(span)
        .await
    }

    /// Round; subscribe on every node; then round again after every wake-up
    /// until granted or past the deadline.
    async fn rounds(
        &self,
        owner: &Owner,
        lease: Option<Duration>,
        deadline: Instant,
    ) -> Result<Option<Guard>> {
        let mut lost = match self.round(owner, lease).await {
            Ok(guard) => return Ok(Some(guard)),
            Err(lost) => lost,
        };
        if Instant::now() >= deadline {
            return self.give_up(lost);
        }
        let _ = back_off_after_split(&lost, deadline).await;
        // Subscribed before the next round, so a release during it wakes us.
        let patience = self.node_timeout.min(deadline - Instant::now());
        let subscriptions = join_all(
            self.locks
                .iter()
                .map(|lock| lock.node().subscribe(&lock.keys().channel, patience)),
        )
        .await;
        loop {
            let mut wakes: Vec<Pin<Box<Notified<'_>>>> = subscriptions
                .iter()
                .map(|s| {
                    let mut woken = Box::pin(s.wake().notified());
                    woken.as_mut().enable();
                    woken
                })
                .collect();
            lost = match self.round(owner, lease).await {
                Ok(guard) => return Ok(Some(guard)),
                Err(lost) => lost,
            };
            if Instant::now() >= deadline {
                return self.give_up(lost);
            }
            if back_off_after_split(&lost, deadline).await {
                continue;
            }
            let any_release = futures::future::select_all(wakes.iter_mut().map(|w| w.as_mut()));
            let woken = tokio::select! {
                _ = any_release => true,
                _ = sleep_within(policy::retry_delay(), deadline) => false,
            };
            if woken {
                stagger_after_wake(&lost, deadline).await;
            }
        }
    }

    /// `None`, or the error when node failures (not contention) made the
    /// quorum unreachable.
    fn give_up(&self, lost: LostRound) -> Result<Option<Guard>> {
        let errors = lost
            .failures
            .iter()
            .filter(|f| matches!(f.cause, FailureCause::Failed(_)))
            .count();
        if errors > self.locks.len() - self.quorum() {
            Err(Error::NoQuorum(QuorumError {
                lock: self.locks[0].name().to_owned(),
                succeeded: lost.granted,
                required: self.quorum(),
                failures: lost.failures,
            }))
        } else {
            Ok(None)
        }
    }

    /// One attempt of the algorithm. On failure every grant has been
    /// released (or is being released, if this future is dropped) and the
    /// reasons are returned.
    async fn round(
        &self,
        owner: &Owner,
        lease: Option<Duration>,
    ) -> std::result::Result<Guard, LostRound> {
        let n = self.locks.len();
        let required = self.quorum();
        let validity_lease = lease.unwrap_or_else(|| self.locks[0].client().watchdog_timeout());
        // Small next to the lease the validity is measured against, whether
        // given or the watchdog's.
        let node_timeout = self
            .node_timeout
            .min(validity_lease / 10)
            .max(Duration::from_millis(1));

        // 1. Fan out to every node at once, each under its own timeout. A
        //    request cut off (by its timeout, or because the round is over)
        //    finishes in the background and is rolled back there (see
        //    `Lock::attempt`).
        let started = Instant::now();
        let mut attempts: FuturesUnordered<_> = self
            .locks
            .iter()
            .enumerate()
            .map(|(index, lock)| async move {
                let attempt =
                    match tokio::time::timeout(node_timeout, lock.attempt(owner, lease)).await {
                        Ok(attempt) => attempt,
                        Err(_) => Err(Error::NodeUnavailable {
                            node: lock.node().addr().to_owned(),
                            reason: Unavailable::Timeout,
                            source: None,
                        }),
                    };
                (index, lock, attempt)
            })
            .collect();

        // 2. Count the answers as they come. Once the quorum is out of reach,
        //    stop waiting for slow nodes: releasing now lets a competitor that
        //    split the nodes with us win instead of both waiting out timeouts.
        let mut parts = Vec::with_capacity(n);
        let mut failures = Vec::new();
        while let Some((index, lock, attempt)) = attempts.next().await {
            let node = lock.node().addr().to_owned();
            match attempt {
                Ok(Attempt::Granted(part)) => parts.push((index, part)),
                Ok(Attempt::Taken(ttl)) => failures.push(NodeFailure {
                    node,
                    cause: FailureCause::Taken(ttl),
                }),
                Err(err) => failures.push(NodeFailure {
                    node,
                    cause: FailureCause::Failed(err),
                }),
            }
            if failures.len() > n - required {
                break;
            }
        }
        drop(attempts);
        let elapsed = started.elapsed();
        // In the order of the locks, whatever order the answers came in.
        parts.sort_unstable_by_key(|(index, _)| *index);
        let parts: Vec<HeldPart> = parts.into_iter().map(|(_, part)| part).collect();

        // 3. A quorum, still valid once acquiring time and drift are paid?
        let validity = lease::validity(validity_lease, elapsed);
        if parts.len() >= required {
            if let Some(validity) = validity {
                let token = if self.is_fenced() {
                    match self.settle_token(&parts, node_timeout).await {
                        Some(token) => Some(token),
                        None => {
                            return Err(LostRound::released(
                                parts,
                                failures,
                                elapsed,
                                node_timeout,
                            )
                            .await);
                        }
                    }
                } else {
                    None
                };
                // Every key was set after `started`, so each lives until at
                // least `started + lease`; less the drift, that is
                // `started + elapsed + validity` (the Redlock paper's T2 + validity).
                let valid_until = lease.map(|_| started + elapsed + validity);
                return Ok(Guard::new(
                    owner.clone(),
                    parts,
                    n,
                    required,
                    valid_until,
                    token,
                ));
            }
            tracing::debug!(
                elapsed_ms = elapsed.as_millis() as u64,
                "quorum granted too late: validity spent"
            );
        }

        // 4. No: release every grant, concurrently.
        Err(LostRound::released(parts, failures, elapsed, node_timeout).await)
    }

    /// The token of a fenced round: the highest INCR among the grants, then
    /// every node's counter raised to it. `None` when fewer than a quorum of
    /// nodes confirmed the raise (the token would not be safe).
    async fn settle_token(&self, parts: &[HeldPart], node_timeout: Duration) -> Option<u64> {
        let token = parts.iter().filter_map(|p| p.token).max()?;
        let raises = join_all(self.locks.iter().map(|lock| async move {
            let raise = protocol::raise_token(lock.keys(), token);
            let raised = tokio::time::timeout(node_timeout, lock.node().run(&raise)).await;
            matches!(raised, Ok(Ok(_)))
        }))
        .await;
        let confirmed = raises.into_iter().filter(|ok| *ok).count();
        (confirmed >= self.quorum()).then_some(token)
    }

    /// Deletes the lock on every node, whoever holds it. Returns whether it
    /// was held on a quorum of nodes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// red.force_unlock().await?;
    /// assert!(!red.is_locked().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when more nodes failed than the policy tolerates.
    ///
    /// # Cancel safety
    ///
    /// One request per node; if dropped after sending, each may or may not
    /// be applied.
    pub async fn force_unlock(&self) -> Result<bool> {
        let deleted = self
            .on_every_node(|lock| async move { lock.force_unlock().await })
            .await?;
        Ok(deleted >= self.quorum())
    }

    /// Whether a quorum of the parts is held by anyone.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// let locked = red.is_locked().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when more nodes failed than the policy tolerates.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self
            .on_every_node(|lock| async move { lock.is_locked().await })
            .await?
            >= self.quorum())
    }

    /// Whether the owner of this handle holds a quorum of the parts.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// let guard = red.lock().await?;
    /// assert!(red.is_held_by_current_owner().await?);
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when more nodes failed than the policy tolerates.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn is_held_by_current_owner(&self) -> Result<bool> {
        let owner = self.owner();
        let held = self
            .on_every_node(|lock| {
                let lock = lock.with_owner(owner.clone());
                async move { lock.is_held_by_current_owner().await }
            })
            .await?;
        Ok(held >= self.quorum())
    }

    /// How many times the owner of this handle holds the lock: the count
    /// that a quorum of parts has at least.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// let outer = red.lock().await?;
    /// let inner = red.lock().await?;
    /// assert_eq!(red.hold_count().await?, 2);
    /// inner.unlock().await?;
    /// outer.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when more nodes failed than the policy tolerates.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn hold_count(&self) -> Result<u32> {
        let owner = self.owner();
        let counts = self
            .gather(|lock| {
                let lock = lock.with_owner(owner.clone());
                async move { lock.hold_count().await }
            })
            .await?;
        Ok(self.quorum_value(counts).unwrap_or(0))
    }

    /// The remaining time to live that a quorum of parts has at least;
    /// `None` when a quorum is not held.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// let ttl = red.remaining_ttl().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when more nodes failed than the policy tolerates.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        let ttls = self
            .gather(|lock| async move { lock.remaining_ttl().await })
            .await?;
        Ok(self.quorum_value(ttls.into_iter().flatten().collect()))
    }

    /// The `quorum`-th largest value.
    fn quorum_value<T: Ord>(&self, mut values: Vec<T>) -> Option<T> {
        values.sort_unstable_by(|a, b| b.cmp(a));
        values.into_iter().nth(self.quorum() - 1)
    }

    /// How many nodes answered `true`.
    async fn on_every_node<F, Fut>(&self, op: F) -> Result<usize>
    where
        F: Fn(Lock) -> Fut,
        Fut: Future<Output = Result<bool>>,
    {
        Ok(self.gather(op).await?.into_iter().filter(|b| *b).count())
    }

    /// Runs `op` on every part at once; the answers of the nodes that
    /// answered, unless more failed than the policy tolerates.
    async fn gather<T, F, Fut>(&self, op: F) -> Result<Vec<T>>
    where
        F: Fn(Lock) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let results = join_all(self.locks.iter().map(|lock| {
            let node = lock.node().addr().to_owned();
            op(lock.clone()).map(move |r| (node, r))
        }))
        .await;
        let mut answers = Vec::new();
        let mut failures = Vec::new();
        for (node, result) in results {
            match result {
                Ok(value) => answers.push(value),
                Err(err) => failures.push(NodeFailure {
                    node,
                    cause: FailureCause::Failed(err),
                }),
            }
        }
        if failures.len() > self.locks.len() - self.quorum() {
            return Err(Error::NoQuorum(QuorumError {
                lock: self.locks[0].name().to_owned(),
                succeeded: answers.len(),
                required: self.quorum(),
                failures,
            }));
        }
        Ok(answers)
    }
}

/// A round that did not win: how many nodes granted (all released since),
/// what the others said, and how long the fan-out took.
struct LostRound {
    granted: usize,
    failures: Vec<NodeFailure>,
    elapsed: Duration,
}

/// After a round that won some nodes but not the quorum (a split vote),
/// sleep a jittered delay, deaf to unlock messages: our own rollback has
/// just published them, and contenders that split the nodes must not retry
/// in lockstep. Returns whether it slept.
async fn back_off_after_split(lost: &LostRound, deadline: Instant) -> bool {
    if lost.granted == 0 {
        return false;
    }
    sleep_within(policy::retry_delay(), deadline).await;
    true
}

/// After an unlock message, before the next round: a random part of twice
/// the last round's duration (at most [`policy::MAX_STAGGER`]). One release
/// wakes every waiter of the lock, in every process, at the same moment;
/// firing together they would split the nodes between them, and each split
/// costs a whole round (a per-node timeout, when a node is down). Staggered
/// by about a round trip, the first to fire usually finds every node free,
/// and the others find them taken and fail fast, holding nothing. A single
/// node needs none of this: Redis itself orders the contenders.
async fn stagger_after_wake(lost: &LostRound, deadline: Instant) {
    let spread = (lost.elapsed * 2).min(policy::MAX_STAGGER);
    sleep_within(spread.mul_f64(rand::random::<f64>()), deadline).await;
}

/// Sleeps `nap`, or until `deadline` if that comes first.
async fn sleep_within(nap: Duration, deadline: Instant) {
    let left = deadline.saturating_duration_since(Instant::now());
    tokio::time::sleep(nap.min(left)).await;
}

impl LostRound {
    /// Releases every grant at once, waiting at most `patience` (the
    /// per-node timeout) so a stalled node cannot stretch the caller's wait;
    /// releases still under way then finish in the background. Failures are
    /// logged (each part's lease bounds the damage).
    async fn released(
        parts: Vec<HeldPart>,
        failures: Vec<NodeFailure>,
        elapsed: Duration,
        patience: Duration,
    ) -> LostRound {
        let granted = parts.len();
        let releases = join_all(parts.into_iter().map(HeldPart::release));
        match tokio::time::timeout(patience, releases).await {
            Ok(results) => {
                for err in results.into_iter().filter_map(Result::err) {
                    tracing::debug!(error = %err, "rollback release failed");
                }
            }
            Err(_) => tracing::debug!("rollback still under way; finishing in the background"),
        }
        LostRound {
            granted,
            failures,
            elapsed,
        }
    }
}

impl<P: QuorumPolicy> Clone for QuorumLock<P> {
    fn clone(&self) -> Self {
        QuorumLock {
            locks: self.locks.clone(),
            owner: self.owner.clone(),
            node_timeout: self.node_timeout,
            policy: PhantomData,
        }
    }
}

impl<P: QuorumPolicy> fmt::Debug for QuorumLock<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(P::NAME)
            .field("locks", &self.locks)
            .field("quorum", &self.quorum())
            .field("node_timeout", &self.node_timeout)
            .field("fenced", &self.is_fenced())
            .finish()
    }
}
