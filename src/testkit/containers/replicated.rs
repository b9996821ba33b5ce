//! Replicated topologies: a primary with one replica, in containers.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use super::container::{READY_LIMIT, REDIS_PORT, RedisContainer};
use super::docker::{connect, ensure_image, image};
use super::network::{Network, Side};
use crate::testkit::process::wait_replica_acks;
use crate::testkit::{PollLimit, TestServer};

/// A primary with one asynchronous replica, without Sentinel: the test
/// plays the failover itself ([`ReplicatedPair::promote`]).
///
/// Both servers are two-sided: clients use side A ([`TestServer::url`]),
/// replication runs over side B (`--replicaof <primary's side B address>
/// 6379`). So [`ReplicatedPair::cut_link`] stops replication while clients
/// still reach both servers. The fields are public so tests can inject
/// other faults into either server.
#[derive(Debug)]
pub struct ReplicatedPair {
    /// The server clients write to.
    pub primary: RedisContainer,
    /// Replicates the primary until [`ReplicatedPair::cut_link`] or
    /// [`ReplicatedPair::promote`].
    pub replica: RedisContainer,
}

impl ReplicatedPair {
    /// Starts the primary, then the replica, and waits until replication
    /// is up (`master_link_status:up` on the replica) and the replica
    /// acknowledges writes ([`wait_replica_acks`](crate::testkit::wait_replica_acks)).
    ///
    /// # Errors
    ///
    /// As [`RedisContainer::start`], or when the link does not come up, or
    /// the replica does not acknowledge a write, within 30 s each.
    ///
    /// # Cancel safety
    ///
    /// As [`RedisContainer::start`].
    pub async fn start() -> io::Result<ReplicatedPair> {
        let docker = connect().await?;
        ensure_image(&docker, &image()).await?;
        let clients = Arc::new(Network::create(&docker).await?);
        let replication = Arc::new(Network::create(&docker).await?);
        let networks = vec![clients, replication];
        // Sync a (re)connecting replica at once, not after the default
        // 5 s wait for more replicas.
        let primary_flags = vec!["--repl-diskless-sync-delay".to_owned(), "0".to_owned()];
        let primary =
            RedisContainer::launch(docker.clone(), networks.clone(), primary_flags).await?;
        let flags = vec![
            "--replicaof".to_owned(),
            primary.sides[Side::B.index()].ip.to_string(),
            REDIS_PORT.to_string(),
        ];
        let replica = RedisContainer::launch(docker, networks, flags).await?;
        let pair = ReplicatedPair { primary, replica };
        pair.wait_link_up(READY_LIMIT).await?;
        wait_replica_acks(&pair.primary.url(), READY_LIMIT).await?;
        Ok(pair)
    }

    /// Waits until the replica reports its link to the primary up.
    ///
    /// # Errors
    ///
    /// When it is not up within `limit`, or the replica does not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only polls.
    pub async fn wait_link_up(&self, limit: Duration) -> io::Result<()> {
        let poll = PollLimit::new(limit);
        while !self.link_is_up().await? {
            poll.tick(|| format!("replica {} not in sync", self.replica.name))
                .await?;
        }
        Ok(())
    }

    /// Whether the replica reports `master_link_status:up`.
    ///
    /// # Errors
    ///
    /// When the replica does not answer within 5 s.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn link_is_up(&self) -> io::Result<bool> {
        let info: String = self
            .replica
            .command(redis::cmd("INFO").arg("replication"))
            .await?;
        Ok(info.lines().any(|l| l.trim() == "master_link_status:up"))
    }

    /// Cuts the replication link (the replica leaves the replication
    /// network): writes to the primary no longer reach the replica, and
    /// clients still reach both.
    ///
    /// # Errors
    ///
    /// When Docker refuses.
    ///
    /// # Cancel safety
    ///
    /// One request: if dropped, it may or may not have been applied.
    pub async fn cut_link(&mut self) -> io::Result<()> {
        self.replica.partition_side(Side::B).await
    }

    /// Reconnects the replication link. If the primary still runs, the
    /// replica resynchronises from it.
    ///
    /// # Errors
    ///
    /// When Docker refuses.
    ///
    /// # Cancel safety
    ///
    /// One request: if dropped, it may or may not have been applied.
    pub async fn restore_link(&mut self) -> io::Result<()> {
        self.replica.heal_side(Side::B).await
    }

    /// The failover: `REPLICAOF NO ONE` on the replica, which becomes a
    /// writable master with the data it had received.
    ///
    /// # Errors
    ///
    /// When the replica does not answer.
    ///
    /// # Cancel safety
    ///
    /// One request: if dropped, it may or may not have been applied.
    pub async fn promote(&mut self) -> io::Result<()> {
        let _: String = self
            .replica
            .command(redis::cmd("REPLICAOF").arg("NO").arg("ONE"))
            .await?;
        Ok(())
    }

    /// Removes both containers and their networks.
    ///
    /// # Errors
    ///
    /// When Docker refuses a removal.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future still removes the containers: their `Drop` does.
    pub async fn rm(self) -> io::Result<()> {
        let replica = self.replica.rm().await;
        let primary = self.primary.rm().await;
        replica.and(primary)
    }
}
