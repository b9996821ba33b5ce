//! The settings a node is built with, beneath the builder and the
//! topologies: a Cluster node keeps them to build its shards' nodes alike,
//! and a Sentinel node its connections to the sentinels.

use std::time::Duration;

/// The settings a node is built with, kept by a Cluster node to build its
/// shards' nodes alike.
#[derive(Debug, Clone)]
pub(crate) struct ShardSettings {
    pub(super) pool_size: usize,
    pub(super) shared_connections: usize,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) keepalive: Duration,
    /// `TCP_NODELAY` on the data nodes' connections.
    pub(super) nodelay: bool,
    pub(crate) tls_root_cert: Option<Vec<u8>>,
}
