//! The subscription's connection: a reconnecting connection to the node's
//! server, or, for a Redis Cluster node, redis-rs's cluster connection,
//! which routes each channel to its slot's shard and reconnects to it. It
//! carries only SUBSCRIBE / UNSUBSCRIBE (or their sharded forms) and
//! PING: a command sent on a connection holding shard subscriptions may be
//! handed a `sunsubscribe` push as its reply when a failover demotes the
//! shard (measured with redis-rs 1.8.1).

use redis::aio::ConnectionManager;
use redis::{RedisResult, Value};

pub(super) enum Link {
    Server(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster {
        conn: redis::cluster_async::ClusterConnection,
        /// `SSUBSCRIBE` rather than `SUBSCRIBE`.
        sharded: bool,
    },
}

impl Link {
    pub(super) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Link::Server(conn) => conn.subscribe(channel).await,
            #[cfg(feature = "cluster")]
            Link::Cluster { conn, sharded } => match sharded {
                true => conn.ssubscribe(channel).await,
                false => conn.subscribe(channel).await,
            },
        }
    }

    pub(super) async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Link::Server(conn) => conn.unsubscribe(channel).await,
            #[cfg(feature = "cluster")]
            Link::Cluster { conn, sharded } => match sharded {
                true => conn.sunsubscribe(channel).await,
                false => conn.unsubscribe(channel).await,
            },
        }
    }

    pub(super) async fn ping(&mut self) -> RedisResult<Value> {
        let ping = redis::cmd("PING");
        match self {
            Link::Server(conn) => ping.query_async(conn).await,
            #[cfg(feature = "cluster")]
            Link::Cluster { conn, .. } => ping.query_async(conn).await,
        }
    }
}

/// The cluster connection of a Cluster node's subscription: its map must
/// be known first (it says whether pub/sub is sharded, and where the shards
/// are).
#[cfg(feature = "cluster")]
pub(super) async fn to_cluster(
    map: &crate::node::cluster::ClusterMap,
    push: impl redis::aio::AsyncPushSender,
    connect_timeout: std::time::Duration,
    response_timeout: std::time::Duration,
) -> RedisResult<Link> {
    if let Err(err) = map.ensure_loaded().await {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "the cluster's slot map is unknown",
            err.to_string(),
        )));
    }
    let builder = redis::cluster::ClusterClientBuilder::new(map.subscription_points());
    #[cfg(feature = "tls")]
    let builder = match map.tls_root_cert() {
        Some(pem) => builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        }),
        None => builder,
    };
    let client = builder
        .use_protocol(redis::ProtocolVersion::RESP3)
        .connection_timeout(connect_timeout)
        .response_timeout(response_timeout)
        .push_sender(push)
        .build()?;
    let conn = tokio::time::timeout(
        connect_timeout + response_timeout,
        client.get_async_connection(),
    )
    .await
    .map_err(|_| {
        redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no cluster node answered",
        ))
    })??;
    Ok(Link::Cluster {
        conn,
        sharded: map.is_sharded(),
    })
}
