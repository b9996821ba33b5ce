//! How a user asks for a Sentinel or a Cluster node: `Node::sentinel`,
//! `Node::cluster` and their settings on the builder. Above the builder
//! and the topologies, so neither of them imports the other's public face.

#[cfg(feature = "sentinel")]
use super::sentinel::SentinelSource;
use super::{Node, NodeBuilder};
#[cfg(feature = "cluster")]
use super::{ShardedPubSub, cluster::ClusterSource};

#[cfg(feature = "sentinel")]
impl Node {
    /// A builder of a node that is the primary the sentinels at
    /// `sentinel_urls` name for `master_name`, followed across failovers
    /// (behind the `sentinel` feature). The sentinels' own passwords and
    /// TLS come from their URLs (`redis://:pw@host:26379`,
    /// `rediss://...`); the data nodes' from
    /// [`NodeBuilder::username`](NodeBuilder::username), [`NodeBuilder::password`](NodeBuilder::password),
    /// [`NodeBuilder::database`](NodeBuilder::database) and [`NodeBuilder::tls`](NodeBuilder::tls). The node is named
    /// `sentinel/<master_name>@<lowest sentinel host:port>` in errors and
    /// logs (so groups that share a master name are told apart).
    ///
    /// The sentinels are asked about once a second; at once, then every
    /// 100 ms for 10 s, on a sentinel's `+switch-master`, a lost connection
    /// or a `READONLY` reply; and before every new connection. A majority's
    /// answer wins. Once a new primary is known, no request goes to the old
    /// one, and waiters re-subscribe there and re-check. What asynchronous
    /// replication can still lose is in the [deployments
    /// guide](crate::guide::deployments): a
    /// Sentinel group counts as **one** member of a MultiLock or RedLock.
    ///
    /// # Examples
    ///
    /// ```
    /// use multilock::Node;
    ///
    /// let node = Node::sentinel(
    ///     "mymaster",
    ///     ["redis://127.0.0.1:26380", "redis://127.0.0.1:26379"],
    /// )
    /// .password("s3cret")
    /// .build()?;
    /// assert_eq!(node.addr(), "sentinel/mymaster@127.0.0.1:26379");
    /// assert!(!format!("{node:?}").contains("s3cret"));
    /// # Ok::<(), multilock::Error>(())
    /// ```
    pub fn sentinel<I, S>(master_name: impl Into<String>, sentinel_urls: I) -> NodeBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut builder = Node::builder(String::new());
        builder.sentinel = Some(SentinelSource {
            master: master_name.into(),
            sentinel_urls: sentinel_urls.into_iter().map(Into::into).collect(),
            ..SentinelSource::default()
        });
        builder
    }
}

#[cfg(feature = "sentinel")]
/// Settings of a Sentinel node's data nodes ([`Node::sentinel`]).
///
/// [`Node::sentinel`]: Node::sentinel
impl NodeBuilder {
    /// The data nodes' ACL user (a Sentinel node; a URL node takes it from
    /// its URL, and [`NodeBuilder::build`] refuses it here).
    ///
    /// [`NodeBuilder::build`]: NodeBuilder::build
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.sentinel_source().username = Some(username.into());
        self
    }

    /// The data nodes' password (a Sentinel node only, as
    /// [`NodeBuilder::username`](NodeBuilder::username)). It never appears in errors or logs.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_source().password = Some(password.into());
        self
    }

    /// The data nodes' database number (a Sentinel node only; default 0).
    pub fn database(mut self, database: i64) -> Self {
        self.sentinel_source().database = database;
        self
    }

    /// Whether the data nodes are reached over TLS, with certificate checks
    /// (a Sentinel node only; needs the `tls` feature).
    pub fn tls(mut self, tls: bool) -> Self {
        self.sentinel_source().tls = tls;
        self
    }

    /// The Sentinel part, made for a URL node too, so `build` can refuse it.
    fn sentinel_source(&mut self) -> &mut SentinelSource {
        self.sentinel.get_or_insert_with(SentinelSource::default)
    }
}

#[cfg(feature = "cluster")]
impl Node {
    /// A builder of a node that is the Redis Cluster reached through
    /// `seed_urls` (behind the `cluster` feature). Each lock's requests go
    /// to the primary of its name's hash slot; `MOVED`, `ASK` (a slot
    /// migration), `TRYAGAIN`, `CLUSTERDOWN` and `READONLY` (a failover)
    /// are followed or retried within the response timeout, since they
    /// prove the request did not run. Passwords and TLS come from the URLs
    /// (the first seed's serve every shard). The node is named
    /// `cluster/<lowest seed host:port>` in errors and logs.
    ///
    /// A lock name whose braces would put its keys in different slots
    /// (`a{b`: the hash is `a{b`, its channel `redisson_lock__channel:a{b`)
    /// is refused when the lock is built, with [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// rather than `CROSSSLOT` at runtime. A cluster counts as **one**
    /// member of a MultiLock or RedLock: see the [deployments
    /// guide](crate::guide::deployments) for what its asynchronous failovers
    /// can lose.
    ///
    /// # Examples
    ///
    /// ```
    /// use multilock::{Node, ShardedPubSub};
    ///
    /// let node = Node::cluster(["redis://:s3cret@127.0.0.1:7001", "redis://:s3cret@127.0.0.1:7000"])
    ///     .sharded_pubsub(ShardedPubSub::Auto)
    ///     .build()?;
    /// assert_eq!(node.addr(), "cluster/127.0.0.1:7000");
    /// assert!(!format!("{node:?}").contains("s3cret"));
    /// # Ok::<(), multilock::Error>(())
    /// ```
    pub fn cluster<I, S>(seed_urls: I) -> NodeBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut builder = Node::builder(String::new());
        builder.cluster = Some(ClusterSource {
            seed_urls: seed_urls.into_iter().map(Into::into).collect(),
            sharded: ShardedPubSub::Auto,
        });
        builder
    }
}

#[cfg(feature = "cluster")]
impl NodeBuilder {
    /// Whether a Cluster node uses sharded pub/sub (default
    /// [`ShardedPubSub::Auto`], as Redisson). Ignored by other nodes.
    pub fn sharded_pubsub(mut self, mode: ShardedPubSub) -> Self {
        if let Some(cluster) = self.cluster.as_mut() {
            cluster.sharded = mode;
        }
        self
    }
}
