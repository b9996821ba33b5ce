//! Where a node's connections go: the one server its URL names, the
//! primary a Sentinel group names now ([`super::sentinel`]), or a Redis
//! Cluster and its shards ([`super::cluster`]).
//!
//! Every connection of a node (pooled, subscription, probe) asks its target
//! for a client when it is made, and remembers the target's *epoch* then: a
//! Sentinel target bumps it when its primary changes, and a connection of
//! an older epoch is unusable from that moment on. A single server's epoch
//! never changes, and checking it is one match, no atomic.
//!
//! The dispatcher sits above the topologies: it names their types, they
//! never name it (arrows one way). The builder wraps what a topology hands
//! it, and gives a Cluster map the function that makes its shards' nodes.

use std::sync::Arc;

use redis::RedisResult;

/// A resolved client and its epoch.
type Resolved = RedisResult<(redis::Client, u64)>;

/// A node's connections' destination. Cheap to clone.
#[derive(Clone)]
pub(crate) enum Target {
    /// One server (boxed: a client is large, and every pooled connection
    /// keeps its target).
    Server(Arc<redis::Client>),
    /// The primary of a Sentinel group.
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<super::sentinel::SentinelPrimary>),
    /// A Redis Cluster, for its subscription (commands go to its shards).
    #[cfg(feature = "cluster")]
    Cluster(Arc<super::cluster::ClusterMap>),
    /// One primary of a Redis Cluster.
    #[cfg(feature = "cluster")]
    Shard(Arc<super::cluster::ShardTarget>),
}

impl Target {
    /// The client to connect with now, and its epoch. A Sentinel target asks
    /// its sentinels first: every new connection re-resolves the primary.
    pub(crate) async fn resolve(&self) -> Resolved {
        match self {
            Target::Server(client) => Ok((redis::Client::clone(client), 0)),
            #[cfg(feature = "sentinel")]
            // Boxed as a trait object: the sentinel lookup's future is deep,
            // and every request's future would otherwise carry its type.
            Target::Sentinel(primary) => {
                let resolve: std::pin::Pin<Box<dyn Future<Output = Resolved> + Send + '_>> =
                    Box::pin(primary.resolve());
                resolve.await
            }
            #[cfg(feature = "cluster")]
            Target::Shard(shard) => Ok((shard.client.clone(), 0)),
            // Commands and probes go to its shards' own targets.
            #[cfg(feature = "cluster")]
            Target::Cluster(_) => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "a Cluster node connects through its shards",
            ))),
        }
    }

    /// Whether a connection made at `epoch` still goes to the current
    /// primary. No I/O.
    pub(crate) fn is_current(&self, epoch: u64) -> bool {
        match self {
            Target::Server(_) => epoch == 0,
            #[cfg(feature = "sentinel")]
            Target::Sentinel(primary) => primary.epoch() == epoch,
            #[cfg(feature = "cluster")]
            Target::Cluster(map) => map.epoch() == epoch,
            #[cfg(feature = "cluster")]
            Target::Shard(_) => epoch == 0,
        }
    }

    /// Follows the target's epoch; `None` for a single server, which keeps
    /// its epoch.
    pub(crate) fn switches(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match self {
            Target::Server(_) => None,
            #[cfg(feature = "sentinel")]
            Target::Sentinel(primary) => Some(primary.switches()),
            #[cfg(feature = "cluster")]
            Target::Cluster(map) => Some(map.switches()),
            #[cfg(feature = "cluster")]
            Target::Shard(_) => None,
        }
    }

    /// A connection was lost, or the server answered `READONLY`: the
    /// primary may have moved, so a Sentinel target asks its sentinels now
    /// rather than at its next poll.
    pub(crate) fn maybe_moved(&self) {
        match self {
            Target::Server(_) => {}
            #[cfg(feature = "sentinel")]
            Target::Sentinel(primary) => primary.check_soon(),
            #[cfg(feature = "cluster")]
            Target::Cluster(map) => map.check_soon(),
            #[cfg(feature = "cluster")]
            Target::Shard(shard) => shard.maybe_moved(),
        }
    }

    /// Whether a new connection must confirm the server is a primary
    /// (`ROLE`) before it is used: the sentinels may name a server that
    /// has not switched yet, and a cluster's map may name a demoted one.
    pub(crate) fn checks_role(&self) -> bool {
        !matches!(self, Target::Server(_))
    }

    /// The error of a new connection whose server answered `ROLE` as no
    /// primary: a Cluster shard's slots are changing hands (it reads as
    /// [`Unavailable::NoShard`], and a waiting acquire asks again after a
    /// pause); a Sentinel group's failover is under way
    /// ([`Unavailable::NoPrimary`]).
    ///
    /// [`Unavailable::NoShard`]: crate::Unavailable::NoShard
    /// [`Unavailable::NoPrimary`]: crate::Unavailable::NoPrimary
    pub(crate) fn not_a_primary(&self) -> redis::RedisError {
        #[cfg(feature = "cluster")]
        if matches!(self, Target::Shard(_)) {
            return redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown),
                "the server the slot map names is not a primary (any more)",
            ));
        }
        redis::RedisError::from((
            redis::ErrorKind::MasterNameNotFoundBySentinel,
            "the server the sentinels name is not a primary (yet)",
        ))
    }
}

/// Resolves at the next change of `switches` (see [`Target::switches`]);
/// never when there is none to follow.
pub(crate) async fn next_switch(switches: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    let changed = match switches {
        Some(rx) => rx.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
impl Target {
    /// Whether the connections to the data nodes set `TCP_NODELAY`.
    fn nodelay(&self) -> bool {
        let info = match self {
            Target::Server(client) => client.get_connection_info(),
            #[cfg(feature = "sentinel")]
            Target::Sentinel(primary) => primary.data_template(),
            #[cfg(feature = "cluster")]
            Target::Cluster(map) => map.template(),
            #[cfg(feature = "cluster")]
            Target::Shard(shard) => shard.client.get_connection_info(),
        };
        info.tcp_settings().nodelay()
    }
}

/// `NodeBuilder::tcp_nodelay` reaches every deployment's data nodes.
#[cfg(test)]
mod nodelay_tests {
    use crate::node::Node;

    #[test]
    fn tcp_nodelay_is_on_unless_turned_off() {
        let url = "redis://127.0.0.1:1";
        let nodelay = |node: Node| node.inner.target.nodelay();
        assert!(nodelay(Node::new(url).unwrap()));
        assert!(!nodelay(
            Node::builder(url).tcp_nodelay(false).build().unwrap()
        ));
        #[cfg(feature = "sentinel")]
        {
            let sentinel = || Node::sentinel("mymaster", [url]);
            assert!(nodelay(sentinel().build().unwrap()));
            assert!(!nodelay(sentinel().tcp_nodelay(false).build().unwrap()));
        }
        #[cfg(feature = "cluster")]
        {
            let cluster = || Node::cluster([url]);
            assert!(nodelay(cluster().build().unwrap()));
            assert!(!nodelay(cluster().tcp_nodelay(false).build().unwrap()));
        }
    }
}

#[cfg(all(test, feature = "cluster"))]
mod tests {
    use super::*;
    use crate::error::{Error, Unavailable};

    /// A shard's server that answers `ROLE` as a replica (the slot map
    /// named a demoted primary) is a slot changing hands, which a waiting
    /// acquire asks again after a pause: not a Sentinel group without a
    /// primary.
    #[test]
    fn a_demoted_shard_reads_as_no_shard() {
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let target = Target::Shard(Arc::new(super::super::cluster::ShardTarget::detached(
            client,
        )));
        let err = Error::from_redis("127.0.0.1:1", target.not_a_primary());
        assert!(
            matches!(
                err,
                Error::NodeUnavailable {
                    reason: Unavailable::NoShard,
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
