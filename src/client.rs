//! The client: its uuid (the first half of every hash field), its
//! configuration and its watchdogs. Locks are made from here.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use crate::client_core::ClientCore;
use crate::error::{Error, Result};
use crate::node::Node;
use crate::quorum::{MultiLock, QuorumLock, QuorumPolicy, RedLock};
use crate::single::{Lock, ReadWriteLock};

/// Default watchdog timeout (Redisson's `lockWatchdogTimeout`).
pub const DEFAULT_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(30);

/// Default idle time after which a multi-node lock's fencing counter
/// expires: 30 days (see [`ClientBuilder::fencing_counter_expiry`]).
pub const DEFAULT_FENCING_COUNTER_EXPIRY: Duration = Duration::from_secs(30 * 24 * 3600);

/// A lock client: one uuid, one configuration, one watchdog per node.
///
/// Holds made through one client are told apart by their [`Owner`]; two
/// clients never share a hold, even in one process. Cloning is cheap.
///
/// [`Owner`]: crate::Owner
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use multilock::{Client, Node};
///
/// let client = Client::builder()
///     .watchdog_timeout(Duration::from_secs(10))
///     .build()?;
/// let node = Node::new("redis://127.0.0.1:6379")?;
/// let lock = client.lock(&node, "orders:42")?;
/// assert_eq!(lock.name(), "orders:42");
/// # Ok::<(), multilock::Error>(())
/// ```
#[derive(Clone)]
pub struct Client {
    core: Arc<ClientCore>,
}

/// Builds a [`Client`]; see [`Client::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build()`"]
pub struct ClientBuilder {
    watchdog_timeout: Duration,
    max_hold: Option<Duration>,
    hold_warning: Option<Duration>,
    fencing_counter_expiry: Option<Duration>,
    id: Option<Uuid>,
}

impl ClientBuilder {
    /// The lease of locks taken without one, renewed every third of it while
    /// held (default [`DEFAULT_WATCHDOG_TIMEOUT`], 30 s). If the process
    /// dies, its locks expire after at most this long. From
    /// [`MIN_LEASE`](crate::MIN_LEASE) to [`MAX_LEASE`](crate::MAX_LEASE);
    /// `build()` checks.
    pub fn watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }

    /// The longest a lock taken without a lease is kept by the watchdog
    /// (default: no limit, as in Redisson). Past it renewal stops, the lock
    /// expires with its last lease, and the guard's `lost()` fires: a holder
    /// stuck for good (a task that never ends) cannot keep the lock forever.
    /// A lock may set its own ([`Lock::with_max_hold`]). From 1 ms to
    /// [`MAX_LEASE`](crate::MAX_LEASE); `build()` checks.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// How long a guard may be held before the crate warns (default: never).
    /// A guard still held this long after it was handed out logs one
    /// `tracing` warning naming the lock, its owner, its nodes and how long
    /// it has been held, and (feature `metrics`) counts one
    /// `multilock_hold_warnings_total`: once per guard, a re-entry's guard
    /// being a guard of its own, and a MultiLock's or RedLock's once for
    /// the whole hold. Unlike [`max_hold`](ClientBuilder::max_hold), it
    /// changes nothing about the hold. A lock may set its own
    /// ([`Lock::with_hold_warning`]). From 1 ms to
    /// [`MAX_LEASE`](crate::MAX_LEASE); `build()` checks.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let client = multilock::Client::builder()
    ///     .hold_warning(Duration::from_secs(60))
    ///     .build()?;
    /// # Ok::<(), multilock::Error>(())
    /// ```
    pub fn hold_warning(mut self, after: Duration) -> Self {
        self.hold_warning = Some(after);
        self
    }

    /// How long a fenced RedLock's or MultiLock's counter
    /// (`redisson_lock_token:{name}`, on each node) and its vouch
    /// (`multilock_token_vouch:{name}`) live without a grant of its name:
    /// every settlement and repair renews them (default
    /// [`DEFAULT_FENCING_COUNTER_EXPIRY`], 30 days; `None`: never, as in
    /// Redisson, and an expiry another client left on them is removed by
    /// this client's next settlement of that name). Counters of names used
    /// once (`orders:{id}`) then do not pile up. A name whose counters expired starts again at the
    /// wall-clock floor, above every token it had, as a new name does (see
    /// [`QuorumLock::with_fencing`] for the floor's assumption). From 1 s
    /// to 10 years; `build()` checks.
    ///
    /// A single-node lock's counter ([`Lock::with_fencing`]) never
    /// expires, whatever this says: it is Redisson's `RFencedLock`
    /// counter, which a Redisson client sharing the name INCRs without
    /// renewing, and would restart at 1 once expired. For the same reason,
    /// set `None` when a Redisson `RFencedLock` fences the same name on one
    /// of a quorum lock's nodes.
    pub fn fencing_counter_expiry(mut self, expiry: Option<Duration>) -> Self {
        self.fencing_counter_expiry = expiry;
        self
    }

    /// The client's uuid (default: a random v4 uuid). Two clients must never
    /// share one.
    pub fn id(mut self, id: Uuid) -> Self {
        self.id = Some(id);
        self
    }

    /// Validates the settings and builds the client.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the watchdog timeout is under
    /// [`MIN_LEASE`](crate::MIN_LEASE) or over [`MAX_LEASE`](crate::MAX_LEASE),
    /// or the maximum hold time, the hold warning or the fencing counter
    /// expiry is out of bounds.
    pub fn build(self) -> Result<Client> {
        // The watchdog timeout is the lease of every hold it renews.
        crate::timing::check_lease(self.watchdog_timeout)
            .map_err(|err| Error::invalid(format!("watchdog timeout: {err}")))?;
        if let Some(max_hold) = self.max_hold {
            crate::timing::check_max_hold(max_hold)?;
        }
        if let Some(after) = self.hold_warning {
            crate::timing::check_hold_warning(after)?;
        }
        if let Some(expiry) = self.fencing_counter_expiry
            && !(MIN_COUNTER_EXPIRY..=MAX_COUNTER_EXPIRY).contains(&expiry)
        {
            return Err(Error::invalid(format!(
                "fencing counter expiry {expiry:?}: from 1 s to 10 years, or None for never"
            )));
        }
        Ok(Client {
            core: ClientCore::new(
                self.id.unwrap_or_else(Uuid::new_v4).to_string(),
                self.watchdog_timeout,
                self.max_hold,
                self.hold_warning,
                self.fencing_counter_expiry,
            ),
        })
    }
}

/// Bounds of [`ClientBuilder::fencing_counter_expiry`]: shorter than a
/// second would outrun a settlement; ten years is forever enough.
const MIN_COUNTER_EXPIRY: Duration = Duration::from_secs(1);
const MAX_COUNTER_EXPIRY: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

impl Client {
    /// A client with default settings and a random uuid.
    pub fn new() -> Client {
        Client::builder()
            .build()
            .expect("the default settings are valid")
    }

    /// A builder for the watchdog timeout and the uuid.
    pub fn builder() -> ClientBuilder {
        ClientBuilder {
            watchdog_timeout: DEFAULT_WATCHDOG_TIMEOUT,
            max_hold: None,
            hold_warning: None,
            fencing_counter_expiry: Some(DEFAULT_FENCING_COUNTER_EXPIRY),
            id: None,
        }
    }

    /// The client's uuid, the first half of every hash field it writes.
    pub fn id(&self) -> &str {
        &self.core.id
    }

    /// The watchdog timeout.
    pub fn watchdog_timeout(&self) -> Duration {
        self.core.watchdog_timeout()
    }

    /// A single-node reentrant lock named `name` on `node`. Nothing is sent.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo() -> multilock::Result<()> {
    /// # use multilock::{Client, Node};
    /// let node = Node::new("redis://127.0.0.1:6379")?;
    /// let lock = Client::new().lock(&node, "orders:42")?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `name` is empty.
    pub fn lock(&self, node: &Node, name: impl Into<String>) -> Result<Lock> {
        Lock::new(self.core.clone(), node.clone(), name.into())
    }

    /// A fair lock named `name` on `node`, compatible with Redisson's
    /// `getFairLock`: it is granted in the order its waiters asked.
    ///
    /// Waiters queue in `redisson_lock_queue:{name}` with their deadlines
    /// in `redisson_lock_timeout:{name}`, and each listens on its own
    /// channel, `redisson_lock__channel:{name}:<client-uuid>:<owner>`: a
    /// release wakes the head of the queue only. A waiter whose wait ends
    /// without a grant (its deadline, an error, or the future dropped)
    /// leaves the queue and moves the waiters behind it up; one that dies
    /// keeps its turn for its share of the queue (its own wait, or
    /// [`Lock::with_queue_wait`] for an unbounded wait, 5 minutes by
    /// default), then the queue drops it. Waiters also ask again after the
    /// time the queue estimates, as Redisson's do: a holder that expired
    /// tells nobody. Everything else (re-entry, lease or watchdog, fencing,
    /// the guard) is as [`Client::lock`]'s.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> multilock::Result<()> {
    /// # use multilock::{Client, Node};
    /// let client = Client::new();
    /// let node = Node::new("redis://127.0.0.1:6379")?;
    /// let tickets = client.fair_lock(&node, "tickets")?;
    /// let guard = tickets.lock().await?; // first come, first served
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `name` is empty.
    pub fn fair_lock(&self, node: &Node, name: impl Into<String>) -> Result<Lock> {
        Lock::new_fair(self.core.clone(), node.clone(), name.into())
    }

    /// The read-write lock named `name` on `node`, compatible with
    /// Redisson's `getReadWriteLock`: see [`ReadWriteLock`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> multilock::Result<()> {
    /// # use multilock::{Client, Node};
    /// let client = Client::new();
    /// let node = Node::new("redis://127.0.0.1:6379")?;
    /// let config = client.read_write_lock(&node, "config")?;
    /// let guard = config.read().lock().await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `name` is empty.
    pub fn read_write_lock(&self, node: &Node, name: impl Into<String>) -> Result<ReadWriteLock> {
        let (read, write) = Lock::new_read_write(self.core.clone(), node.clone(), name.into())?;
        Ok(ReadWriteLock::new(read, write))
    }

    /// A lock that every one of `locks` must grant. The locks may be on the
    /// same or different nodes and have different names (to lock several
    /// resources at once).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo() -> multilock::Result<()> {
    /// # use multilock::{Client, Node};
    /// let client = Client::new();
    /// let node = Node::new("redis://127.0.0.1:6379")?;
    /// // Two resources at once, all or nothing.
    /// let both = client.multi_lock(vec![client.lock(&node, "a")?, client.lock(&node, "b")?])?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `locks` is empty or a lock comes from
    /// another client.
    pub fn multi_lock(&self, locks: Vec<Lock>) -> Result<MultiLock> {
        self.quorum_lock(locks)
    }

    /// A lock that a majority (N/2+1) of `locks` must grant. Each lock must be
    /// on a different node: the quorum assumes independent masters.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo() -> multilock::Result<()> {
    /// # use multilock::{Client, Node};
    /// let client = Client::new();
    /// let locks = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"]
    ///     .iter()
    ///     .map(|url| client.lock(&Node::new(url)?, "orders:42"))
    ///     .collect::<multilock::Result<Vec<_>>>()?;
    /// let red = client.red_lock(locks)?;
    /// assert_eq!(red.quorum(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `locks` is empty, two locks share a
    /// node, or a lock comes from another client.
    pub fn red_lock(&self, locks: Vec<Lock>) -> Result<RedLock> {
        self.quorum_lock(locks)
    }

    /// A quorum lock of `locks`, all of which must come from this client:
    /// their holds share its id and watchdogs.
    fn quorum_lock<P: QuorumPolicy>(&self, locks: Vec<Lock>) -> Result<QuorumLock<P>> {
        if locks.iter().any(|l| !Arc::ptr_eq(l.core(), &self.core)) {
            return Err(Error::invalid(format!(
                "every lock of a {} must come from the client that makes it",
                P::NAME
            )));
        }
        QuorumLock::new(locks)
    }

    /// A RedLock with the same `name` on each of `nodes`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo() -> multilock::Result<()> {
    /// # use multilock::{Client, Node};
    /// let nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"]
    ///     .iter()
    ///     .map(|url| Node::new(url))
    ///     .collect::<multilock::Result<Vec<_>>>()?;
    /// let red = Client::new().red_lock_on(&nodes, "orders:42")?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::red_lock`], and for an empty name.
    pub fn red_lock_on(&self, nodes: &[Node], name: impl Into<String>) -> Result<RedLock> {
        let name = name.into();
        let locks = nodes
            .iter()
            .map(|node| self.lock(node, name.as_str()))
            .collect::<Result<Vec<_>>>()?;
        self.red_lock(locks)
    }

    /// A MultiLock with the same `name` on each of `nodes`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo() -> multilock::Result<()> {
    /// # use multilock::{Client, Node};
    /// let nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"]
    ///     .iter()
    ///     .map(|url| Node::new(url))
    ///     .collect::<multilock::Result<Vec<_>>>()?;
    /// let multi = Client::new().multi_lock_on(&nodes, "orders:42")?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::multi_lock`], and for an empty name.
    pub fn multi_lock_on(&self, nodes: &[Node], name: impl Into<String>) -> Result<MultiLock> {
        let name = name.into();
        let locks = nodes
            .iter()
            .map(|node| self.lock(node, name.as_str()))
            .collect::<Result<Vec<_>>>()?;
        self.multi_lock(locks)
    }
}

impl Default for Client {
    fn default() -> Self {
        Client::new()
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.core.id)
            .field("watchdog_timeout", &self.watchdog_timeout())
            .finish()
    }
}
