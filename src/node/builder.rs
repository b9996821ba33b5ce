//! Building a node: its settings, checked, and the node they make.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

// Configuration types through deadpool-redis, the facade that pins the deadpool
// and redis versions this pool is built for.
use deadpool_redis::{Runtime, Timeouts};

#[cfg(feature = "cluster")]
use super::cluster;
#[cfg(feature = "sentinel")]
use super::sentinel;
use super::settings::ShardSettings;
use super::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVE, DEFAULT_POOL_SIZE, DEFAULT_RESPONSE_TIMEOUT, Node,
    NodeInner, ServerIdentity, addr_of, connection_info, health, pool, redact_url, subscriber,
    target, tcp_settings,
};
use crate::error::{Error, Result};

/// Builds a [`Node`]; see [`Node::builder`].
#[derive(Clone)]
#[must_use = "a builder does nothing until `build()`"]
pub struct NodeBuilder {
    pub(super) url: String,
    /// Set for a node that is the primary of a Sentinel group.
    #[cfg(feature = "sentinel")]
    pub(super) sentinel: Option<sentinel::SentinelSource>,
    /// Set for a node that is a Redis Cluster.
    #[cfg(feature = "cluster")]
    pub(super) cluster: Option<cluster::ClusterSource>,
    pub(super) pool_size: usize,
    pub(super) shared_connections: usize,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) keepalive: Duration,
    pub(super) nodelay: bool,
    /// A certificate authority (PEM) trusted for TLS, besides the webpki
    /// roots' (`tls_root_cert`).
    pub(super) tls_root_cert: Option<Vec<u8>>,
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
            .field("tcp_nodelay", &self.nodelay)
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

    /// Whether the node's connections set `TCP_NODELAY` (default `true`,
    /// as Redisson does): each request leaves at once, one round trip from
    /// its reply. `false` turns Nagle's algorithm on: while a request is
    /// unacknowledged, the next ones wait and leave together, in fewer
    /// packets. That costs a request up to one more round trip, and saves
    /// the kernel's work per packet: with 64 tasks locking at once on 2
    /// cores, in a closed loop on loopback, the client's CPU per
    /// lock+unlock fell by a fifth to a third, most of it the kernel's
    /// (`BENCHMARKS.md`). For a client whose CPU is the limit, close to its
    /// servers; keep the default where latency counts. (With `true`,
    /// requests made while others are in flight on a connection leave
    /// together through one task per connection; with `false` the kernel
    /// gathers them and every request goes straight to the connection.)
    /// Applies to the connections to a URL node's server, a Sentinel
    /// group's primary and a Cluster's shards.
    ///
    /// # Examples
    ///
    /// ```
    /// let node = multilock::Node::builder("redis://127.0.0.1:6379")
    ///     .tcp_nodelay(false)
    ///     .build()?;
    /// # Ok::<(), multilock::Error>(())
    /// ```
    pub fn tcp_nodelay(mut self, nodelay: bool) -> Self {
        self.nodelay = nodelay;
        self
    }

    /// Trusts the certificate authority `pem` (PEM) for the node's TLS
    /// connections, besides the webpki roots (feature `tls`): a server
    /// with a private CA's certificate. For a URL node with a `rediss://`
    /// URL, a Sentinel node's data nodes (with
    /// [`tls`](NodeBuilder::tls)) and a Cluster node's shards (with
    /// `rediss://` seeds).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ca = std::fs::read("ca.crt").unwrap();
    /// let node = multilock::Node::builder("rediss://redis.internal:6380")
    ///     .tls_root_cert(ca)
    ///     .build()?;
    /// # Ok::<(), multilock::Error>(())
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_cert = Some(pem.into());
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
    /// for a Cluster node no seed URL, or one naming a database other than
    /// 0 (a Cluster has one);
    /// and the data-node settings (`username`, `password`, `database`,
    /// `tls`) on a URL node; a TLS root certificate that is not PEM.
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
            nodelay: self.nodelay,
            tls_root_cert: self.tls_root_cert.clone(),
        };
        if let Some(pem) = &settings.tls_root_cert {
            // redis-rs takes a PEM without certificates as an empty list.
            let probe = connection_info("redis://127.0.0.1:6379")?.set_addr(
                redis::ConnectionAddr::TcpTls {
                    host: "127.0.0.1".into(),
                    port: 6379,
                    insecure: false,
                    tls_params: None,
                },
            );
            let marked = pem
                .windows(b"-----BEGIN CERTIFICATE-----".len())
                .any(|w| w == b"-----BEGIN CERTIFICATE-----");
            if !marked || super::open_client(probe, Some(pem)).is_err() {
                return Err(Error::invalid(
                    "the TLS root certificate is not a PEM certificate",
                ));
            }
        }
        let (addr, target) = self.target(&settings)?;
        let server = match &target {
            #[cfg(feature = "cluster")]
            target::Target::Cluster(map) => map.identity(),
            _ => Arc::new(ServerIdentity::new(addr.clone())),
        };
        Ok(Node::assemble(addr, target, server, &settings))
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
            nodelay: true,
            tls_root_cert: None,
        }
    }

    /// A node going to `target`, checked settings. Nothing is sent.
    pub(super) fn assemble(
        addr: String,
        target: target::Target,
        server: Arc<ServerIdentity>,
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
                metric_keys: Default::default(),
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
            let (name, map) = source.map(settings.clone(), |addr, shard, server, settings| {
                Node::assemble(addr, target::Target::Shard(shard), server, settings)
            })?;
            return Ok((name, target::Target::Cluster(map)));
        }
        #[cfg(feature = "sentinel")]
        if let Some(source) = &self.sentinel {
            if !self.url.is_empty() {
                return Err(Error::invalid(
                    "username, password, database and tls are a Sentinel node's settings: a URL node takes them from its URL",
                ));
            }
            let (name, primary) = source.primary(settings)?;
            return Ok((name, target::Target::Sentinel(primary)));
        }
        let info = connection_info(&self.url)?.set_tcp_settings(tcp_settings(settings.nodelay));
        let root_cert = settings.tls_root_cert.as_deref();
        let client = super::open_client(info.clone(), root_cert).map_err(|_| {
            let shown = redact_url(&self.url);
            Error::invalid(format!("Redis URL {shown:?} is not usable"))
        })?;
        Ok((addr_of(&info), target::Target::Server(Arc::new(client))))
    }
}
