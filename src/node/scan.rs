//! Finding the locks on a node: `SCAN` for hashes in bounded steps (never
//! `KEYS`), each found hash sampled for Redisson's lock shape. A Cluster
//! node scans every primary.

use futures::future::join_all;

use super::{Lane, Node};
use crate::error::Result;
use crate::inspect::{FoundLock, FoundLocks};
use crate::protocol;

impl Node {
    /// The locks whose names match `pattern` (a `SCAN MATCH` glob such as
    /// `orders:*`; `*` for all): hashes of Redisson's lock shape (fields
    /// `<client-uuid>:<owner>` with hold counts, and a read-write lock's
    /// `mode`), told from other hashes by a sample of their fields. A
    /// Cluster node scans each primary in turn, and lists the locks of
    /// those it could scan beside the ones it could not
    /// ([`FoundLocks::unscanned`]); a Sentinel node scans its primary. Keys
    /// are read in steps of `SCAN … COUNT 1000 TYPE hash` (Redis 6.2+), so
    /// a large keyspace costs time, never a blocked server. A key that
    /// moves or expires during the scan may be missed, as `SCAN` promises
    /// no more; a Cluster's key found on a shard that is importing it is
    /// sampled where its slot's owner redirects.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> multilock::Result<()> {
    /// let node = multilock::Node::new("redis://127.0.0.1:6379")?;
    /// let found = node.find_locks("orders:*").await?;
    /// for lock in &found.locks {
    ///     println!("{} on {}", lock.name, lock.node);
    /// }
    /// for failed in &found.unscanned {
    ///     println!("{} not scanned: {}", failed.node, failed.error);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`](crate::Error::NodeUnavailable) /
    /// [`Error::Redis`](crate::Error::Redis) when a standalone or Sentinel
    /// node's server fails a `SCAN`, or a Cluster's slot map cannot be had.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn find_locks(&self, pattern: &str) -> Result<FoundLocks> {
        #[cfg(feature = "cluster")]
        if let Some(map) = self.cluster_map() {
            map.refresh().await?;
            let mut found = FoundLocks::default();
            for shard in map.shard_nodes() {
                match Box::pin(self.scan_server(&shard, pattern)).await {
                    Ok(locks) => found.locks.extend(locks),
                    Err(error) => found.unscanned.push(crate::inspect::Unscanned {
                        node: shard.addr().to_owned(),
                        error,
                    }),
                }
            }
            found.locks.sort_by(|a, b| a.name.cmp(&b.name));
            return Ok(found);
        }
        let mut locks = self.scan_server(self, pattern).await?;
        locks.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(FoundLocks {
            locks,
            unscanned: Vec::new(),
        })
    }

    /// The locks on `server`: this node, or one of its cluster's shards.
    /// Each hash found is sampled through this node, which on a cluster
    /// routes by the key's slot and follows `ASK` to where it is imported.
    async fn scan_server(&self, server: &Node, pattern: &str) -> Result<Vec<FoundLock>> {
        server.refuse_if_suspect().await?;
        let mut conn = server.checkout_any_conn().await?;
        let routed = self.cluster_map().is_some();
        let mut found = Vec::new();
        let mut cursor = 0;
        loop {
            let (next, keys) = conn.run(&protocol::scan_hashes(cursor, pattern)).await?;
            // Sampled at once: the shared connection pipelines them.
            let shapes = join_all(keys.iter().map(|key| {
                let mut conn = conn.share();
                async move {
                    let sample = protocol::sample_lock_shape(key);
                    match routed {
                        true => self.run(Lane::of(key), &sample).await,
                        false => conn.run(&sample).await,
                    }
                }
            }))
            .await;
            for (name, shape) in keys.into_iter().zip(shapes) {
                match shape {
                    Ok(Some(read_write)) => found.push(FoundLock {
                        name,
                        node: server.addr().to_owned(),
                        read_write,
                    }),
                    Ok(None) => {}
                    // Gone meanwhile, or moved to a shard scanned already.
                    Err(err) => tracing::debug!(key = %name, error = %err, "a hash not sampled"),
                }
            }
            if next == 0 {
                return Ok(found);
            }
            cursor = next;
        }
    }
}
