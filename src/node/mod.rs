//! One Redis master: its command pool, its shared subscription, its timeouts.
//! How a node is built is [`builder`]; how a request gets a connection and
//! runs on it is [`conn`].

mod address;
mod builder;
#[cfg(feature = "cluster")]
mod cluster;
mod coalesce;
mod conn;
#[cfg(any(feature = "sentinel", feature = "cluster"))]
mod deployments;
mod health;
mod identity;
#[cfg(any(feature = "sentinel", feature = "cluster"))]
mod poller;
mod pool;
mod retry;
mod scan;
#[cfg(feature = "sentinel")]
mod sentinel;
mod settings;
mod subscriber;
mod target;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use crate::error::{Error, Result, Unavailable};
pub use address::redact_url;
pub(crate) use address::{addr_of, connection_info, open_client, tcp_settings};
pub use builder::NodeBuilder;
#[cfg(feature = "cluster")]
pub use cluster::ShardedPubSub;
pub(crate) use conn::{Conn, Lane};
pub use health::Health;
pub(crate) use identity::ServerIdentity;
pub(crate) use retry::RetryPause;
#[cfg(any(feature = "sentinel", feature = "cluster"))]
pub(crate) use settings::ShardSettings;
pub(crate) use subscriber::{AfterSubscribing, Subscription};

/// Default number of pooled command connections per node.
pub const DEFAULT_POOL_SIZE: usize = 8;
/// Default time to establish a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default time to wait for a reply (Redisson's `timeout`).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
/// Default quiet time after which the subscription connection is PINGed.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);

/// One Redis master: a standalone server ([`Node::new`]); with the
/// `sentinel` feature, whichever server a Sentinel group names its primary
/// (`Node::sentinel`), followed across failovers; or, with the `cluster`
/// feature, a Redis Cluster (`Node::cluster`), each lock on its slot's
/// primary. Each counts as one member of a MultiLock or RedLock.
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
/// master name and a sentinel's address, a Cluster node by a seed's).
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

/// A [`Node`] held by background work that must not keep it, and its
/// connections, alive once its users dropped it (bb8's reaper pattern).
#[derive(Clone)]
pub(crate) struct WeakNode(std::sync::Weak<NodeInner>);

impl WeakNode {
    /// The node, unless every user dropped it.
    pub(crate) fn upgrade(&self) -> Option<Node> {
        self.0.upgrade().map(|inner| Node { inner })
    }
}

struct NodeInner {
    id: u64,
    addr: String,
    server: Arc<ServerIdentity>,
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
    /// The metrics of its locks, by kind.
    metric_keys: crate::metrics::KeyCache,
}

/// The most spent latches one release deletes, and the most kept waiting:
/// beyond that, they expire with their TTL.
const SPENT_LATCHES_PER_RELEASE: usize = 8;
const SPENT_LATCHES_KEPT: usize = 256;

impl Node {
    /// The node's address, `host:port`, as shown in errors and logs.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// The metrics of a lock of `kind` on this node.
    pub(crate) fn lock_metrics(&self, kind: crate::metrics::Kind) -> crate::metrics::LockMetrics {
        self.inner
            .metric_keys
            .lock_metrics(kind, Some(&self.inner.addr))
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

    /// Whether [`Node::health`] is [`Health::Healthy`].
    #[cfg(feature = "cluster")]
    pub(crate) fn is_healthy(&self) -> bool {
        self.health() == Health::Healthy
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
    pub(crate) fn server_run_id(&self) -> Option<Arc<str>> {
        self.inner.server.run_id()
    }

    /// How many times [`Node::server_run_id`] changed so far.
    pub(crate) fn server_run_id_changes(&self) -> u64 {
        self.inner.server.run_id_changes()
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// This node, held weakly.
    pub(crate) fn downgrade(&self) -> WeakNode {
        WeakNode(Arc::downgrade(&self.inner))
    }

    /// What the node's connections tell of its server (restarts, lost
    /// connections), to follow without holding the node.
    pub(crate) fn server_events(&self) -> Arc<ServerIdentity> {
        self.inner.server.clone()
    }

    /// The server's restarts seen so far: its `run_id` changed between two
    /// connections.
    pub(crate) fn generation(&self) -> u64 {
        self.inner.server.generation()
    }

    /// The pauses between tries of a request about `lane`'s lock that must
    /// reach the node in the end, cut short when the node moves or answers
    /// again (see [`RetryPause`]).
    pub(crate) fn retry_pause(&self, lane: Lane) -> RetryPause {
        let serving = self.serving(lane).unwrap_or_else(|| self.clone());
        RetryPause::new(
            self.inner.target.switches(),
            serving.inner.health.recoveries(),
        )
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
    /// connection is not enough: the next one is usually fine.) A server
    /// refusing requests for a while (`BUSY`, `OOM`, ...) is logged once.
    fn observe(&self, err: &Error) {
        match err {
            Error::NodeUnavailable {
                reason: Unavailable::Timeout | Unavailable::Refused | Unavailable::NoPrimary,
                ..
            } => self.inner.health.suspect(health::Why::Failed),
            Error::Redis { .. } => {
                if let Some(code) = err.condition() {
                    self.inner.health.refusing(code);
                }
            }
            _ => {}
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
        assert_eq!(redact_url("redis://:p@ss@h:1"), "redis://***@h:1");
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
