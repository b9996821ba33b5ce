//! `MultiLock` and `RedLock`: one algorithm over independent nodes, with two
//! quorum policies. This file holds the lock's configuration, its public
//! methods and its queries; [`round`] holds the algorithm itself (one round,
//! read top to bottom, and the wait around it); [`policy`] holds the pure
//! arithmetic of the two policies.

pub(crate) mod fan_out;
mod fencing;
pub(crate) mod grace;
pub(crate) mod policy;
mod queries;
mod round;

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use grace::Pace;
pub use policy::{All, Majority, QuorumPolicy};

use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::metrics;
use crate::owner::Owner;
use crate::single::{Lock, QueueSeats};
use crate::timing::{check_hold_warning, check_lease};

/// Default per-node timeout of one acquire request in a multi-node lock.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// A lock over several single-node [`Lock`]s, granted when the policy's
/// quorum of them is: see [`MultiLock`] (all) and [`RedLock`] (N/2+1).
///
/// It offers the same methods as [`Lock`], so the three are interchangeable.
/// Each node's part is a single-node lock with its own renewal: reentrant,
/// or fair ([`Client::fair_lock`](crate::Client::fair_lock)). A waiter on
/// fair parts queues on every node for its wait (`try_lock_for`'s; the
/// part's own queue wait for `lock()`; not at all for `try_lock()`, as a
/// single fair lock) and keeps its places from round to round; when its
/// acquire ends (granted, out of time, failed or dropped) it leaves every
/// queue it is still in. A round lost after some nodes
/// granted releases those grants, so the waiter queues again at their tail:
/// across nodes, fairness is per node and best effort.
pub struct QuorumLock<P: QuorumPolicy> {
    locks: Arc<[Lock]>,
    /// The parts' node addresses, in order: every guard names them.
    addrs: Arc<[String]>,
    owner: Option<Owner>,
    node_timeout: Duration,
    /// How long a guard may be held before the crate warns, for the whole
    /// hold (`None`: never).
    hold_warning: Option<Duration>,
    /// How fast its fan-outs reach their quorum, shared with its guards.
    pace: Arc<Pace>,
    /// When its servers were last found independent: the sum of their
    /// `run_id` change counts then, plus one (0: not yet).
    independent_at: Arc<AtomicU64>,
    /// Its acquisitions' metrics.
    metrics: metrics::LockMetrics,
    policy: PhantomData<fn() -> P>,
}

/// The metrics of multi-node locks, by kind.
static MULTI_NODE_METRICS: std::sync::LazyLock<metrics::KeyCache> =
    std::sync::LazyLock::new(metrics::KeyCache::default);

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
    /// A lock of `locks`, checked against the policy. The caller checks
    /// that they come from one client.
    pub(crate) fn new(locks: Vec<Lock>) -> Result<Self> {
        let parts: Vec<policy::Part<'_>> = locks
            .iter()
            .map(|lock| policy::Part {
                server: lock.node().addr(),
                key: lock.name(),
            })
            .collect();
        policy::check::<P>(&parts).map_err(|rejected| {
            Error::invalid(match rejected {
                policy::Rejected::Empty => format!("a {} needs at least one lock", P::NAME),
                policy::Rejected::SameKeyTwice(part) => format!(
                    "lock {:?} on node {} appears twice in a {}",
                    part.key,
                    part.server,
                    P::NAME
                ),
                policy::Rejected::SameServerTwice(server) => format!(
                    "node {server} appears twice in a {}: its majority needs independent nodes",
                    P::NAME
                ),
            })
        })?;
        // The composite owns its protocol: a part's own fencing would settle
        // tokens over single-node counters (created where missing), and
        // parts that wait for replicas differently would make one round
        // mean different things on different nodes.
        if let Some(fenced) = locks.iter().find(|lock| lock.part_settings().0) {
            return Err(Error::invalid(format!(
                "lock {:?} on node {} was built with_fencing(): a {} settles its own tokens; \
                 build its parts without fencing and call with_fencing() on the {}",
                fenced.name(),
                fenced.node().addr(),
                P::NAME,
                P::NAME
            )));
        }
        let replica_sync = locks[0].part_settings().1;
        if locks
            .iter()
            .any(|lock| lock.part_settings().1 != replica_sync)
        {
            return Err(Error::invalid(format!(
                "the parts of a {} must share one replica-sync setting (with_replica_sync)",
                P::NAME
            )));
        }
        // A guard warns once for the whole hold, never per part: the parts
        // must agree on when.
        let hold_warning = locks[0].hold_warning();
        if locks.iter().any(|lock| lock.hold_warning() != hold_warning) {
            return Err(Error::invalid(format!(
                "the parts of a {} must share one hold warning (with_hold_warning); \
                 or set it on the {} itself",
                P::NAME,
                P::NAME
            )));
        }
        Ok(QuorumLock {
            locks: locks.iter().map(|lock| lock.as_part_of(P::LABEL)).collect(),
            addrs: locks
                .iter()
                .map(|lock| lock.node().addr().to_owned())
                .collect(),
            owner: None,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            hold_warning,
            pace: Arc::default(),
            independent_at: Arc::default(),
            metrics: MULTI_NODE_METRICS.lock_metrics(P::LABEL, None),
            policy: PhantomData,
        })
    }

    /// The lock's name: its first lock's (a MultiLock may lock several
    /// names at once).
    pub fn name(&self) -> &str {
        self.locks[0].name()
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
    #[must_use = "this returns a new handle and leaves the original as it was"]
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
    #[must_use = "this returns a new handle and leaves the original as it was"]
    pub fn with_node_timeout(&self, timeout: Duration) -> Result<Self> {
        if timeout.is_zero() {
            return Err(Error::invalid("node timeout must be greater than zero"));
        }
        Ok(Self {
            node_timeout: timeout,
            ..self.clone()
        })
    }

    /// This lock with fencing tokens ([`Guard::fencing_token`]).
    ///
    /// Each node keeps a counter, `redisson_lock_token:{name}`, which
    /// expires when no grant of the name renewed it for
    /// [`ClientBuilder::fencing_counter_expiry`] (30 days by default: the
    /// name then starts again at the wall-clock floor). A won round settles
    /// the token before it returns the guard: it reads every node's counter
    /// (raising it to one above the highest counter its grants reported),
    /// takes a value above every counter read, has a quorum of nodes hold
    /// it (the *seal*), and checks, once every write of the seal landed,
    /// that a quorum still holds it. Validity is checked again after the
    /// settlement.
    ///
    /// A counter is a witness only when its node vouches for it: the seal
    /// and every repair write, beside it, the `run_id` and replication ID
    /// of the server they wrote on and the value they left
    /// (`multilock_token_vouch:{name}`), and the settlement reads the vouch
    /// with the counter, in one script. A restart (empty, or from a stale
    /// dump), a failover or failback, or a counter set back below that
    /// value leaves it unvouched for every client, including one that
    /// never saw the node. A token is proven
    /// when the settlement read `nodes - quorum + 1` vouched counters (they
    /// share a node with every earlier seal). The client also watches the
    /// nodes of every name it has fenced: a node whose `run_id` changed,
    /// or whose counter is missing or lower than last seen, is repaired at
    /// once, in the background, to the highest vouched counter of enough
    /// nodes; a settlement that finds an unvouched counter repairs it with
    /// its seal.
    ///
    /// **When tokens strictly increase:** proven by the counters, as long
    /// as at most `nodes - quorum` nodes lose their counters between two
    /// completed repairs (2 of 5 for a RedLock; a MultiLock, every node of
    /// which holds every token, needs one intact node), whatever the
    /// servers' persistence.
    /// **Beyond the proof** (a new name, counters lost on more nodes), the
    /// token does not fall back: a round that cannot prove
    /// one takes the wall-clock floor (microseconds since the Unix epoch,
    /// and above every counter read) once a quorum answered and the others
    /// had the round's grace, logging a warning for a name this client had
    /// fenced. No earlier token exceeds the floor unless the name was
    /// granted more than once per microsecond, or clients' clocks disagree
    /// by more than the time since its previous token.
    ///
    /// **Availability:** fenced grants go on while a quorum of nodes
    /// answers, inside the proof and beyond it; a dead minority never
    /// stalls a name, new or not. The protocol, both properties and this
    /// one are model-checked (`src/fencing/model/`).
    ///
    /// Build the parts without their own fencing: [`Client::red_lock`]
    /// refuses parts made with [`Lock::with_fencing`] (their single-node
    /// counters would count as witnesses).
    ///
    /// [`Client::red_lock`]: crate::Client::red_lock
    /// [`ClientBuilder::fencing_counter_expiry`]: crate::ClientBuilder::fencing_counter_expiry
    #[must_use = "this returns a new handle and leaves the original as it was"]
    pub fn with_fencing(&self) -> Self {
        Self {
            locks: self.locks.iter().map(Lock::with_quorum_fencing).collect(),
            ..self.clone()
        }
    }

    /// This lock with a maximum hold time on every node (see
    /// [`Lock::with_max_hold`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a duration under 1 ms or over
    /// [`MAX_LEASE`](crate::MAX_LEASE).
    #[must_use = "this returns a new handle and leaves the original as it was"]
    pub fn with_max_hold(&self, max_hold: Duration) -> Result<Self> {
        let locks = self
            .locks
            .iter()
            .map(|lock| lock.with_max_hold(max_hold))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            locks: locks.into(),
            ..self.clone()
        })
    }

    /// This lock with its own hold warning (see [`Lock::with_hold_warning`]):
    /// a guard still held `after` from when it was handed out warns once
    /// for the whole hold, naming the nodes that still hold it, never once
    /// per node. Overrides the parts' setting, which they must share
    /// ([`Client::red_lock`](crate::Client::red_lock) refuses parts that
    /// disagree; by default each part has the client's
    /// [`ClientBuilder::hold_warning`](crate::ClientBuilder::hold_warning)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a duration under 1 ms or over
    /// [`MAX_LEASE`](crate::MAX_LEASE).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(client: multilock::Client, nodes: Vec<multilock::Node>) -> multilock::Result<()> {
    /// use std::time::Duration;
    /// let red = client.red_lock_on(&nodes, "orders:42")?.with_hold_warning(Duration::from_secs(30))?;
    /// # Ok(()) }
    /// ```
    #[must_use = "this returns a new handle and leaves the original as it was"]
    pub fn with_hold_warning(&self, after: Duration) -> Result<Self> {
        check_hold_warning(after)?;
        Ok(Self {
            hold_warning: Some(after),
            ..self.clone()
        })
    }

    /// True when fencing tokens are on ([`QuorumLock::with_fencing`]).
    pub fn is_fenced(&self) -> bool {
        self.locks.iter().all(Lock::is_fenced)
    }

    /// The owner an acquisition through this handle holds for: as
    /// [`Lock::owner`], where a `run_locked` scope holding any of its
    /// parts counts.
    pub fn owner(&self) -> Owner {
        self.resolve_owner().owner
    }

    /// [`QuorumLock::owner`], with the turn a re-entry of a `run_locked`
    /// scope takes.
    fn resolve_owner(&self) -> crate::owner::Resolved {
        crate::owner::resolve(
            self.owner.as_ref(),
            self.locks
                .iter()
                .map(|lock| (lock.node().id(), lock.name())),
        )
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
    /// [`Error::NoQuorum`] when nodes refuse for good (a wrong password, an
    /// ACL refusal, the key holding another type) on too many nodes to reach
    /// the quorum. Node failures that may pass (refused or dropped
    /// connections, timeouts) are retried, as Redisson does.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves nothing held: requests in flight complete
    /// in the background and every grant is released. A waiter on fair
    /// parts leaves every queue, in the background.
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
    /// [`Error::InvalidArgument`] for a lease under [`MIN_LEASE`](crate::MIN_LEASE)
    /// or over [`MAX_LEASE`](crate::MAX_LEASE);
    /// [`Error::NoQuorum`] when nodes refuse for good (a wrong password, an
    /// ACL refusal, the key holding another type) on too many nodes to reach
    /// the quorum. Other node failures are retried.
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
        let resolved = self.resolve_owner();
        let owner = resolved.owner.clone();
        // A re-entry of a `run_locked` scope waits for its siblings'.
        let turn = resolved.wait_turn().await;
        // A fair part's place in its queue is kept from one budget to the next.
        let seats = QueueSeats::new(self.locks.iter(), &owner);
        let outcome = loop {
            match self.acquire_within(&owner, budget, None, lease).await {
                Ok(Some(guard)) => break Ok(guard.in_turn(turn)),
                Ok(None) => {}
                Err(Error::NoQuorum(err)) if !err.is_permanent() => {
                    // Node changes are logged once each, by the nodes themselves.
                    tracing::debug!(error = %err, "no quorum within the budget; trying again");
                }
                Err(err) => break Err(err),
            }
        };
        seats.finish(outcome.is_ok()).await;
        outcome
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
    /// [`Error::InvalidArgument`] for a lease under [`MIN_LEASE`](crate::MIN_LEASE)
    /// or over [`MAX_LEASE`](crate::MAX_LEASE);
    /// [`Error::NoQuorum`] when nodes refuse for good (a wrong password, an
    /// ACL refusal, the key holding another type) on too many nodes to reach
    /// the quorum. Other node failures are retried. [`Error::NoQuorum`]
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
}

impl<P: QuorumPolicy> Clone for QuorumLock<P> {
    fn clone(&self) -> Self {
        QuorumLock {
            locks: self.locks.clone(),
            addrs: self.addrs.clone(),
            owner: self.owner.clone(),
            node_timeout: self.node_timeout,
            hold_warning: self.hold_warning,
            pace: self.pace.clone(),
            independent_at: self.independent_at.clone(),
            metrics: self.metrics.clone(),
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
