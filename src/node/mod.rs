//! One Redis master: its command pool, its shared subscription, its timeouts.
//! How a request gets a connection and runs on it is [`conn`].

#[cfg(feature = "cluster")]
mod cluster;
mod conn;
mod health;
#[cfg(any(feature = "sentinel", feature = "cluster"))]
mod poller;
mod pool;
#[cfg(feature = "sentinel")]
mod sentinel;
mod subscriber;
mod target;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

// Configuration types through deadpool-redis, the facade that pins the deadpool
// and redis versions this pool is built for.
use deadpool_redis::{Runtime, Timeouts};
use redis::{ConnectionAddr, ConnectionInfo, ProtocolVersion};

use crate::error::{Error, Result, Unavailable};
#[cfg(feature = "cluster")]
pub use cluster::ShardedPubSub;
pub(crate) use conn::{Conn, Lane};
pub use health::Health;
pub(crate) use subscriber::{AfterSubscribing, Subscription};

/// Default number of pooled command connections per node.
pub const DEFAULT_POOL_SIZE: usize = 8;
/// Default time to establish a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default time to wait for a reply (Redisson's `timeout`).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
/// Default quiet time after which the subscription connection is PINGed.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);

/// One Redis master: a standalone server ([`Node::new`]), or, with the
/// `sentinel` feature, whichever server a Sentinel group names its primary
/// (`Node::sentinel`), followed across failovers.
///
/// A node owns a pool of command connections and one subscription connection
/// shared by every waiter of this process on that node. It connects lazily:
/// building a `Node` for a server that is down succeeds, operations then fail
/// with [`Error::NodeUnavailable`] and work again once the server is back.
///
/// Cloning is cheap and clones share the pool and the subscription.
///
/// The password of the URL never appears in `Debug` output, errors or logs:
/// a node is named by its address, `host:port` (a Sentinel node by its
/// master name and a sentinel's address).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use multilock::Node;
///
/// let node = Node::new("redis://127.0.0.1:6379")?;
/// let secured = Node::builder("redis://app:s3cret@127.0.0.1:6380/0")
///     .pool_size(16)
///     .response_timeout(Duration::from_millis(500))
///     .build()?;
/// assert_eq!(secured.addr(), "127.0.0.1:6380");
/// assert!(!format!("{secured:?}").contains("s3cret"));
/// # Ok::<(), multilock::Error>(())
/// ```
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
}

struct NodeInner {
    id: u64,
    addr: String,
    server: Arc<pool::ServerIdentity>,
    health: Arc<health::HealthState>,
    pool: pool::Pool,
    /// The connections requests share (see [`Node::checkout`]): pooled
    /// objects kept out of the pool while usable, one slot per place in the
    /// pool, of which the first `spread` are used.
    shared: Box<[std::sync::RwLock<Option<pool::Object>>]>,
    /// Over how many shared connections requests are spread (see
    /// [`NodeBuilder::shared_connections`]), at most the pool size.
    spread: usize,
    /// Turns taken over the shared connections by requests about no lock
    /// in particular (the watchdog's batches).
    turn: AtomicUsize,
    /// Held while a shared connection is made (one request at a time).
    filling: tokio::sync::Mutex<()>,
    subscriber: subscriber::Subscriber,
    response_timeout: Duration,
    /// Where its connections go (a Sentinel node's moves on failovers).
    target: target::Target,
    /// Unlock latches of releases whose replies came, for the next release
    /// on this node to delete (see `protocol::release`).
    spent_latches: std::sync::Mutex<Vec<String>>,
}

/// The most spent latches one release deletes, and the most kept waiting:
/// beyond that, they expire with their TTL.
const SPENT_LATCHES_PER_RELEASE: usize = 8;
const SPENT_LATCHES_KEPT: usize = 256;

/// Builds a [`Node`]; see [`Node::builder`].
#[derive(Clone)]
#[must_use = "a builder does nothing until `build()`"]
pub struct NodeBuilder {
    url: String,
    /// Set for a node that is the primary of a Sentinel group.
    #[cfg(feature = "sentinel")]
    sentinel: Option<sentinel::SentinelSource>,
    /// Set for a node that is a Redis Cluster.
    #[cfg(feature = "cluster")]
    cluster: Option<cluster::ClusterSource>,
    pool_size: usize,
    shared_connections: usize,
    connect_timeout: Duration,
    response_timeout: Duration,
    keepalive: Duration,
}

impl fmt::Debug for NodeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("NodeBuilder");
        f.field("url", &redact_url(&self.url));
        #[cfg(feature = "sentinel")]
        f.field("sentinel", &self.sentinel);
        #[cfg(feature = "cluster")]
        f.field("cluster", &self.cluster);
        f.field("pool_size", &self.pool_size)
            .field("shared_connections", &self.shared_connections)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("keepalive", &self.keepalive)
            .finish()
    }
}

impl NodeBuilder {
    /// Maximum command connections (default [`DEFAULT_POOL_SIZE`]).
    /// Connections are multiplexed and shared: requests spread over
    /// [`shared_connections`](NodeBuilder::shared_connections) of them (a
    /// lock's requests all take the same one) and pipeline there; more are
    /// made only for requests that need one to themselves (a replica-sync
    /// `WAIT`), or while a broken one is replaced.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Over how many multiplexed connections requests are spread (default
    /// 1, at most the pool size). One connection pipelines the most
    /// requests per read and write, which costs the server least: on 2
    /// cores, 64 tasks on their own locks cost it 0.93× of Redisson 3.24+'s
    /// CPU per lock+unlock on one connection and 1.03× on two, at the same
    /// throughput. More let several worker threads each drive one, for a
    /// client whose own CPU is the limit.
    ///
    /// # Examples
    ///
    /// ```
    /// let node = multilock::Node::builder("redis://127.0.0.1:6379")
    ///     .shared_connections(4)
    ///     .build()?;
    /// # Ok::<(), multilock::Error>(())
    /// ```
    pub fn shared_connections(mut self, connections: usize) -> Self {
        self.shared_connections = connections;
        self
    }

    /// Time allowed to establish a connection (default
    /// [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Time allowed for a reply, and for a pooled connection to become free
    /// (default [`DEFAULT_RESPONSE_TIMEOUT`]).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long the node's subscription connection (shared by every waiter)
    /// may stay quiet before it is PINGed (default [`DEFAULT_KEEPALIVE`]).
    /// The PING keeps a NAT or load balancer from dropping it as idle; one
    /// that gets no answer within the response timeout means the connection
    /// was dropped silently, and it is rebuilt. Set it below the idle
    /// timeout of whatever sits between this process and Redis.
    pub fn keepalive(mut self, interval: Duration) -> Self {
        self.keepalive = interval;
        self
    }

    /// Validates the settings and builds the node. Nothing is sent.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a URL that does not parse, a scheme
    /// other than `redis://` / `rediss://` (the latter needs the `tls`
    /// feature), a zero pool size or number of shared connections, or a zero
    /// timeout or keepalive; for a Sentinel node also an empty master name,
    /// no sentinel URL, or TLS to the data nodes without the `tls` feature;
    /// and the data-node settings (`username`, `password`, `database`,
    /// `tls`) on a URL node.
    pub fn build(self) -> Result<Node> {
        if self.pool_size == 0 {
            return Err(Error::invalid("pool size must be at least 1"));
        }
        if self.shared_connections == 0 {
            return Err(Error::invalid("shared connections must be at least 1"));
        }
        if self.connect_timeout.is_zero()
            || self.response_timeout.is_zero()
            || self.keepalive.is_zero()
        {
            return Err(Error::invalid(
                "node timeouts and keepalive must be greater than zero",
            ));
        }
        let settings = ShardSettings {
            pool_size: self.pool_size,
            shared_connections: self.shared_connections,
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            keepalive: self.keepalive,
        };
        let (addr, target) = self.target(&settings)?;
        let server = match &target {
            #[cfg(feature = "cluster")]
            target::Target::Cluster(map) => map.identity(),
            _ => Arc::new(pool::ServerIdentity::new(addr.clone())),
        };
        Ok(Node::assemble(addr, target, server, &settings))
    }
}

/// The settings a node is built with, kept by a Cluster node to build its
/// shards' nodes alike.
#[derive(Debug, Clone)]
pub(crate) struct ShardSettings {
    pool_size: usize,
    shared_connections: usize,
    connect_timeout: Duration,
    response_timeout: Duration,
    keepalive: Duration,
}

impl Node {
    /// A node going to `target`, checked settings. Nothing is sent.
    fn assemble(
        addr: String,
        target: target::Target,
        server: Arc<pool::ServerIdentity>,
        settings: &ShardSettings,
    ) -> Node {
        let factory = pool::ConnectionFactory {
            target: target.clone(),
            connect_timeout: settings.connect_timeout,
            response_timeout: settings.response_timeout,
            server: server.clone(),
        };
        let pool = pool::Pool::builder(factory)
            .max_size(settings.pool_size)
            .runtime(Runtime::Tokio1)
            .timeouts(Timeouts {
                wait: Some(settings.response_timeout),
                create: Some(settings.connect_timeout),
                recycle: None,
            })
            .build()
            .expect("a pool with a runtime and a size above zero");
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Node {
            inner: Arc::new(NodeInner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                subscriber: subscriber::Subscriber::new(
                    addr.clone(),
                    target.clone(),
                    settings.connect_timeout,
                    settings.response_timeout,
                    settings.keepalive,
                ),
                health: health::HealthState::new(
                    addr.clone(),
                    target.clone(),
                    settings.connect_timeout,
                    settings.response_timeout,
                ),
                addr,
                server,
                pool,
                shared: (0..settings.pool_size)
                    .map(|_| std::sync::RwLock::new(None))
                    .collect(),
                spread: settings.shared_connections.min(settings.pool_size),
                turn: AtomicUsize::new(0),
                filling: tokio::sync::Mutex::new(()),
                response_timeout: settings.response_timeout,
                target,
                spent_latches: std::sync::Mutex::new(Vec::new()),
            }),
        }
    }
}

impl NodeBuilder {
    /// The node's name in errors and logs, and where its connections go.
    fn target(&self, settings: &ShardSettings) -> Result<(String, target::Target)> {
        #[cfg(feature = "cluster")]
        if let Some(source) = &self.cluster {
            #[cfg(feature = "sentinel")]
            if self.sentinel.is_some() {
                return Err(Error::invalid(
                    "username, password, database and tls are a Sentinel node's settings: a Cluster node takes them from its seed URLs",
                ));
            }
            return source.target(settings.clone());
        }
        let _ = settings;
        #[cfg(feature = "sentinel")]
        if let Some(source) = &self.sentinel {
            if !self.url.is_empty() {
                return Err(Error::invalid(
                    "username, password, database and tls are a Sentinel node's settings: a URL node takes them from its URL",
                ));
            }
            return source.target(self.connect_timeout, self.response_timeout);
        }
        let info = connection_info(&self.url)?;
        let client = redis::Client::open(info.clone()).map_err(|_| {
            let shown = redact_url(&self.url);
            Error::invalid(format!("Redis URL {shown:?} is not usable"))
        })?;
        Ok((addr_of(&info), target::Target::Server(Arc::new(client))))
    }
}

impl Node {
    /// A node with default settings. Lazy: nothing is sent until used.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad URL (see [`NodeBuilder::build`]).
    pub fn new(url: &str) -> Result<Node> {
        Node::builder(url).build()
    }

    /// A builder to set the pool size and timeouts.
    pub fn builder(url: impl Into<String>) -> NodeBuilder {
        NodeBuilder {
            url: url.into(),
            #[cfg(feature = "sentinel")]
            sentinel: None,
            #[cfg(feature = "cluster")]
            cluster: None,
            pool_size: DEFAULT_POOL_SIZE,
            shared_connections: 1,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            keepalive: DEFAULT_KEEPALIVE,
        }
    }

    /// The node's address, `host:port`, as shown in errors and logs.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// Hands over the unlock latch of a release whose reply came: no retry
    /// of it can follow, so the next release on this node deletes it.
    pub(crate) fn spend_latch(&self, latch: String) {
        if self.cluster_map().is_some() {
            // Latches of different locks are in different slots, and one
            // release cannot delete keys of another slot: they expire.
            return;
        }
        let mut spent = self.inner.spent_latches.lock().unwrap();
        if spent.len() < SPENT_LATCHES_KEPT {
            spent.push(latch);
        }
    }

    /// Calls `release` with spent latches for it to delete, a few at a
    /// time, moved out under the lock (no copy, no allocation).
    pub(crate) fn with_spent_latches<R>(
        &self,
        release: impl FnOnce(std::vec::Drain<'_, String>) -> R,
    ) -> R {
        let mut spent = self.inner.spent_latches.lock().unwrap();
        let keep = spent.len().saturating_sub(SPENT_LATCHES_PER_RELEASE);
        release(spent.drain(keep..))
    }

    /// The reply timeout this node was built with.
    pub fn response_timeout(&self) -> Duration {
        self.inner.response_timeout
    }

    /// Whether the node answers: [`Health::Suspect`] from a request that
    /// timed out or was refused until the node answers again (a probe
    /// checks it in the background). Requests to a suspect node fail at once
    /// with [`Unavailable::Suspect`], so a frozen node costs one timeout, not
    /// one per request, and nothing piles up on its connection.
    ///
    /// # Examples
    ///
    /// ```
    /// use multilock::{Health, Node};
    /// let node = Node::new("redis://127.0.0.1:6379")?;
    /// assert_eq!(node.health(), Health::Healthy);
    /// # Ok::<(), multilock::Error>(())
    /// ```
    ///
    /// A Cluster node is suspect while any of its shards is (since the
    /// earliest): requests to the other shards still go.
    pub fn health(&self) -> Health {
        #[cfg(feature = "cluster")]
        if let Some(map) = self.cluster_map() {
            let since = map
                .shard_nodes()
                .iter()
                .filter_map(|shard| match shard.health() {
                    Health::Suspect { since } => Some(since),
                    Health::Healthy => None,
                })
                .min();
            return since.map_or(Health::Healthy, |since| Health::Suspect { since });
        }
        self.inner.health.health()
    }

    /// The keys of lock `name` on this node. A Cluster node's releases
    /// publish as its pub/sub mode says, and it refuses a name whose keys
    /// would hash to different slots (`a{b`: the hash is `a{b`, the channel
    /// `redisson_lock__channel:a{b`), which would fail with CROSSSLOT.
    pub(crate) fn lock_keys(&self, name: &str) -> Result<crate::protocol::LockKeys> {
        let keys = crate::protocol::LockKeys::new(name);
        #[cfg(feature = "cluster")]
        if let Some(map) = self.cluster_map() {
            let slot = cluster::key_slot(name.as_bytes());
            if cluster::key_slot(keys.channel.as_bytes()) != slot {
                return Err(Error::invalid(format!(
                    "lock name {name:?} on a Redis Cluster: its keys would hash to different slots (a `{{` needs a `}}` after it, with the tag between them, as in `orders{{42}}`)"
                )));
            }
            let publish = crate::protocol::Publish::shared(map.sharded_flag());
            return Ok(keys.with_publish(publish));
        }
        Ok(keys)
    }

    /// The Redis Cluster this node is, if it is one.
    #[cfg(feature = "cluster")]
    pub(crate) fn cluster_map(&self) -> Option<&Arc<cluster::ClusterMap>> {
        match &self.inner.target {
            target::Target::Cluster(map) => Some(map),
            _ => None,
        }
    }

    #[cfg(not(feature = "cluster"))]
    pub(crate) fn cluster_map(&self) -> Option<std::convert::Infallible> {
        None
    }

    /// The node requests about the lock of `lane` go to now, without I/O:
    /// this one, or a Cluster node's shard for the lock's slot (none when
    /// its slot map is not known yet).
    fn serving(&self, lane: Lane) -> Option<Node> {
        #[cfg(feature = "cluster")]
        if let Some(map) = self.cluster_map() {
            return map.known_shard(lane.slot());
        }
        let _ = lane;
        Some(self.clone())
    }

    /// The server's `run_id` (`INFO server`), once a connection to it was
    /// made: two nodes with one run_id are one server under two addresses.
    pub(crate) fn server_run_id(&self) -> Option<String> {
        self.inner.server.run_id()
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// The server's restarts seen so far: its `run_id` changed between two
    /// connections.
    pub(crate) fn generation(&self) -> u64 {
        self.inner.server.generation()
    }

    /// Follows [`Node::generation`].
    pub(crate) fn restarts(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.server.restarts()
    }

    /// Resolves when a connection to the node next reports it was lost.
    pub(crate) async fn disconnected(&self) {
        self.inner.server.disconnected().await
    }

    /// Registers a waiter on `channel` if this node's shared subscription
    /// already has it confirmed (other local waiters are on it): no I/O.
    pub(crate) fn join_subscription(&self, channel: &str) -> Option<Subscription> {
        self.inner.subscriber.join(channel)
    }

    /// Registers a waiter on `channel` of this node's shared subscription.
    /// Waits at most `max_wait` for the server to confirm, and not at all
    /// while the node is suspect: it would not confirm in time (a frozen
    /// node holds the wait for all of `max_wait`, every time a waiter
    /// subscribes), and it grants nothing meanwhile, so its unlock messages
    /// do not matter. The subscription is still made once the node answers.
    pub(crate) async fn subscribe(&self, channel: &str, max_wait: Duration) -> Subscription {
        let max_wait = if self.inner.health.is_suspect() {
            Duration::ZERO
        } else {
            max_wait
        };
        self.inner.subscriber.subscribe(channel, max_wait).await
    }
}

impl Node {
    /// Marks the node suspect (a Cluster node: the shard of `lane`'s lock):
    /// a request to it went unanswered for longer than its caller could
    /// wait (a multi-node round's per-node timeout).
    pub(crate) fn suspect(&self, lane: Lane) {
        if let Some(node) = self.serving(lane) {
            node.inner.health.suspect(health::Why::Failed);
        }
    }

    /// Marks the node suspect because a request to it is overdue: far
    /// slower than the other nodes' answers to the same round. Any answer
    /// ends the suspicion.
    pub(crate) fn suspect_overdue(&self, lane: Lane) {
        if let Some(node) = self.serving(lane) {
            node.inner.health.suspect(health::Why::Overdue);
        }
    }

    /// A request timed out or was refused: the node is suspect. (A broken
    /// connection is not enough: the next one is usually fine.)
    fn observe(&self, err: &Error) {
        if let Error::NodeUnavailable {
            reason: Unavailable::Timeout | Unavailable::Refused | Unavailable::NoPrimary,
            ..
        } = err
        {
            self.inner.health.suspect(health::Why::Failed);
        }
    }
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("addr", &self.inner.addr)
            .finish()
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.addr)
    }
}

/// The connection settings of a `redis://` or `rediss://` URL, for RESP3
/// with `TCP_NODELAY`; the error shows the URL without its password.
pub(crate) fn connection_info(url: &str) -> Result<ConnectionInfo> {
    let shown = redact_url(url);
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(Error::invalid(format!(
            "Redis URL {shown:?} must start with redis:// or rediss://"
        )));
    }
    if url.starts_with("rediss://") && !cfg!(feature = "tls") {
        return Err(Error::invalid(format!(
            "Redis URL {shown:?} uses TLS: enable the `tls` feature of multilock"
        )));
    }
    let info = redis::IntoConnectionInfo::into_connection_info(url)
        .map_err(|_| Error::invalid(format!("Redis URL {shown:?} does not parse")))?;
    // RESP3: the subscription shares one connection with pushes, and
    // command connections report their own disconnection.
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    // TCP_NODELAY, as Redisson (Netty) sets it: with Nagle's algorithm a
    // request written while an earlier one is unacknowledged waits for
    // that reply, one more round trip on a real network.
    Ok(info
        .set_redis_settings(settings)
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true)))
}

/// `host:port` of a connection's address, as nodes are named.
pub(crate) fn addr_of(info: &ConnectionInfo) -> String {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
        other => format!("{other}"),
    }
}

/// The URL without its `user:password@` part.
pub(crate) fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(end) => url.split_at(end + 3),
        None => ("", url),
    };
    // The last `@` anywhere, not just in the authority: a password holding
    // `/`, `?` or `#` must not end the search early and leak.
    match rest.rfind('@') {
        Some(at) => format!("{scheme}***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_credentials() {
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact_url("redis://:p@ss@h:1"), "redis://***@h:1");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(redact_url("redis://u:pa#ss@h:1"), "redis://***@h:1");
        assert_eq!(redact_url("redis://u:p/w?x@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact_url("nonsense"), "nonsense");
        assert_eq!(redact_url("u:hunter2@h:1"), "***@h:1");
    }

    #[test]
    fn bad_urls_are_typed_errors_without_secrets() {
        for url in [
            "",
            "http://h:1",
            "redis://:hunter2@h:notaport",
            "redis://",
            "redis://u:hun#ter2@h:1",
        ] {
            let builder = Node::builder(url);
            assert!(!format!("{builder:?}").contains("ter2"), "{builder:?}");
            let Err(err) = builder.build() else { continue };
            assert!(matches!(err, Error::InvalidArgument(_)), "{url}: {err}");
            assert!(!err.to_string().contains("ter2"), "{err}");
        }
        assert!(Node::builder("redis://h:1").pool_size(0).build().is_err());
        let err = Node::builder("redis://h:1")
            .shared_connections(0)
            .build()
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        let err = Node::builder("redis://h:1")
            .response_timeout(Duration::ZERO)
            .build()
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
    }

    #[test]
    fn lazy_outside_a_runtime() {
        let node = Node::new("redis://u:hunter2@127.0.0.1:1").unwrap();
        assert_eq!(node.addr(), "127.0.0.1:1");
        assert!(!format!("{node:?}").contains("hunter2"));
    }
}
