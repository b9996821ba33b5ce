//! Finding the locks on a node: `SCAN` for hashes in bounded steps (never
//! `KEYS`), each found hash sampled for Redisson's lock shape. A Cluster
//! node scans every primary.

use futures::future::join_all;

use super::Node;
use crate::error::Result;
use crate::inspect::FoundLock;
use crate::protocol;

impl Node {
    /// The locks whose names match `pattern` (a `SCAN MATCH` glob such as
    /// `orders:*`; `*` for all): hashes of Redisson's lock shape (fields
    /// `<client-uuid>:<owner>` with hold counts, and a read-write lock's
    /// `mode`), told from other hashes by a sample of their fields. A
    /// Cluster node scans each primary in turn; a Sentinel node its
    /// primary. Keys are read in steps of `SCAN … COUNT 1000 TYPE hash`
    /// (Redis 6.2+), so a large keyspace costs time, never a blocked
    /// server. A key that moves or expires during the scan may be missed,
    /// as `SCAN` promises no more.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> multilock::Result<()> {
    /// let node = multilock::Node::new("redis://127.0.0.1:6379")?;
    /// for lock in node.find_locks("orders:*").await? {
    ///     println!("{} on {}", lock.name, lock.node);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`](crate::Error::NodeUnavailable) /
    /// [`Error::Redis`](crate::Error::Redis) when a server fails a `SCAN`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn find_locks(&self, pattern: &str) -> Result<Vec<FoundLock>> {
        #[cfg(feature = "cluster")]
        if let Some(map) = self.cluster_map() {
            map.refresh().await?;
            let mut found = Vec::new();
            for shard in map.shard_nodes() {
                found.extend(Box::pin(shard.find_locks(pattern)).await?);
            }
            found.sort_by(|a, b| a.name.cmp(&b.name));
            return Ok(found);
        }
        self.refuse_if_suspect().await?;
        let mut conn = self.checkout_any_conn().await?;
        let mut found = Vec::new();
        let mut cursor = 0;
        loop {
            let (next, keys) = conn.run(&protocol::scan_hashes(cursor, pattern)).await?;
            // Sampled at once: the shared connection pipelines them.
            let shapes = join_all(keys.iter().map(|key| {
                let mut conn = conn.share();
                async move { conn.run(&protocol::sample_lock_shape(key)).await }
            }))
            .await;
            for (name, shape) in keys.into_iter().zip(shapes) {
                match shape {
                    Ok(Some(read_write)) => found.push(FoundLock {
                        name,
                        node: self.addr().to_owned(),
                        read_write,
                    }),
                    Ok(None) => {}
                    // Moved to another shard or gone meanwhile: its new
                    // owner's scan finds it, or it is no lock any more.
                    Err(err) => tracing::debug!(key = %name, error = %err, "a hash not sampled"),
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(found)
    }
}
