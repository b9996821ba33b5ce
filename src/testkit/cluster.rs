//! A Redis Cluster of `redis-server` processes on loopback: three
//! primaries, one replica each, joined by the kit itself.

use std::io;
use std::time::{Duration, Instant};

use redis::Value;

use super::command::{Role, ask, command, free_port, info_field, poll_ready, role, url_of};
use super::replicated::PRIMARY_FLAGS;
use super::{RedisProcess, TestServer};

/// How long a start, a failover or a return to health may take.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// The slots of the three primaries, split as `redis-cli --cluster create` does.
const SHARDS: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// How many hash slots a cluster has.
const SLOTS: u16 = 16384;

/// How many keys one `MIGRATE` of a slot migration moves, as `redis-cli
/// --cluster reshard` does by default.
const MIGRATE_BATCH: &str = "100";

/// The `MIGRATE` timeout, in milliseconds: how long the source may wait on
/// the target.
const MIGRATE_TIMEOUT_MS: &str = "5000";

/// The hash slot of `key` as Redis computes it: CRC16 (XMODEM) of the key,
/// or of its hash tag (what lies between the first `{` and the next `}`,
/// when not empty), modulo 16384.
///
/// ```no_run
/// use multilock::testkit::key_slot;
///
/// assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
/// ```
pub fn key_slot(key: impl AsRef<[u8]>) -> u16 {
    let key = key.as_ref();
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let crc = tag.unwrap_or(key).iter().fold(0u16, |mut crc, &byte| {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = (crc << 1) ^ if crc & 0x8000 != 0 { 0x1021 } else { 0 };
        }
        crc
    });
    crc % SLOTS
}

/// One node of a [`RedisCluster`]: a [`RedisProcess`] and its cluster node id.
///
/// ```no_run
/// # fn f(c: &multilock::testkit::RedisCluster) {
/// let (url, id, pid) = (c.nodes()[0].url(), c.nodes()[0].id(), c.nodes()[0].pid());
/// # }
/// ```
#[derive(Debug)]
pub struct ClusterNode {
    process: RedisProcess,
    id: String,
    paused: bool,
}

impl ClusterNode {
    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.process.url()
    }

    /// The client port (the cluster bus has a free port of its own).
    pub fn port(&self) -> u16 {
        self.process.port()
    }

    /// The process id, while it runs (it may be paused).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The cluster node id (`CLUSTER MYID`), kept across restarts.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The node's role, asked from the node itself; fails when it does not
    /// answer within 5 s.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    pub async fn role(&self) -> io::Result<Role> {
        Ok(role(&self.url()).await?.0)
    }

    fn is_up(&self) -> bool {
        self.process.is_running() && !self.paused
    }
}

/// A Redis Cluster on loopback: 3 primaries with one replica each, every
/// node a [`RedisProcess`] (`--cluster-enabled yes --cluster-node-timeout
/// 1000`, its `nodes.conf` in its own directory), killed when dropped.
///
/// Methods name a node by its index in [`RedisCluster::nodes`] (and panic
/// when there is no such node, as slice indexing does). At the
/// start nodes 0, 1 and 2 are the primaries of slots 0-5460, 5461-10922
/// and 10923-16383, and node `i + 3` replicates node `i`; failovers then
/// move the roles. The kit joins the nodes itself (`CLUSTER MEET`,
/// `ADDSLOTSRANGE`, `REPLICATE`) rather than with `redis-cli --cluster
/// create`: no second binary to find next to `$MULTILOCK_REDIS_SERVER`, no
/// fixed one-second waits, and the replica of each primary known in advance.
///
/// ```no_run
/// use multilock::testkit::RedisCluster;
///
/// # async fn demo() -> std::io::Result<()> {
/// let mut cluster = RedisCluster::start().await?;
/// let primary = cluster.primary_for_key("lock").await?;
/// let replica = cluster.replica_of(primary).await?;
/// cluster.kill(primary).await?;
/// cluster.wait_until_healthy().await?; // the replica took over
/// assert_eq!(cluster.primary_for_key("lock").await?, replica);
/// cluster.restart(primary).await?;
/// cluster.wait_until_healthy().await?; // back as the replica's replica
/// cluster.failover(primary).await?; // and primary again
/// cluster.pause(replica).await?; // SIGSTOP
/// cluster.unpause(replica).await?;
/// let node = &cluster.nodes()[primary];
/// println!("{} {} {:?} {:?}", node.url(), node.id(), node.pid(), node.role().await?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
}

impl RedisCluster {
    /// Starts 6 nodes, joins them, and waits until all are healthy
    /// ([`RedisCluster::wait_until_healthy`]); fails when `redis-server`
    /// cannot be run or the cluster is not ready within 30 s (the message
    /// says what was missing).
    ///
    /// # Cancel safety
    /// Dropping the future kills the nodes already started.
    pub async fn start() -> io::Result<RedisCluster> {
        let starts = (0..6).map(|_| RedisProcess::start_with_args(node_args));
        let mut nodes = Vec::new();
        for process in futures::future::try_join_all(starts).await? {
            let id = ask(&process.url(), &["CLUSTER", "MYID"]).await?;
            let paused = false;
            nodes.push(ClusterNode {
                process,
                id,
                paused,
            });
        }
        let cluster = RedisCluster { nodes };
        cluster.join().await?;
        let what = "the cluster did not become ready";
        poll_ready(READY_LIMIT, what, || cluster.health()).await?;
        Ok(cluster)
    }

    async fn join(&self) -> io::Result<()> {
        let first = self.nodes[0].url();
        for (i, node) in self.nodes.iter().enumerate() {
            let (url, epoch) = (node.url(), (i + 1).to_string());
            ask::<()>(&url, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch]).await?;
            if let Some((from, to)) = SHARDS.get(i).map(|(f, t)| (f.to_string(), t.to_string())) {
                ask::<()>(&url, &["CLUSTER", "ADDSLOTSRANGE", &from, &to]).await?;
            }
            if i > 0 {
                let bus: Vec<String> = ask(&url, &["CONFIG", "GET", "cluster-port"]).await?;
                let (port, bus) = (node.port().to_string(), bus.get(1).cloned());
                let bus = bus.unwrap_or_default();
                ask::<()>(&first, &["CLUSTER", "MEET", "127.0.0.1", &port, &bus]).await?;
            }
        }
        // A replica can follow its primary once gossip has told it the id.
        poll_ready(READY_LIMIT, "the cluster nodes did not meet", || async {
            for (primary, replica) in self.nodes.iter().zip(&self.nodes[3..]) {
                let url = replica.url();
                let info: String = ask(&url, &["CLUSTER", "INFO"]).await?;
                if info_field(&info, "cluster_known_nodes") != Some("6") {
                    return Err(io::Error::other(format!("{url} knows not all 6 nodes")));
                }
                if role(&url).await?.0 == Role::Primary {
                    ask::<()>(&url, &["CLUSTER", "REPLICATE", &primary.id]).await?;
                }
            }
            Ok(())
        })
        .await
    }

    /// `redis://` URLs of all 6 nodes, for a cluster client's seeds.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(ClusterNode::url).collect()
    }

    /// The nodes; methods name a node by its index here.
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// The index of the primary serving `slot`, once the running nodes all
    /// report the same `CLUSTER SLOTS`; fails when they do not within 30 s,
    /// or no node serves the slot.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    pub async fn primary_for_slot(&self, slot: u16) -> io::Result<usize> {
        let shards = self.agreed_slots().await?;
        let primary = owner_of(&shards, slot).and_then(|port| self.index_of(port));
        primary.ok_or_else(|| io::Error::other(format!("no node serves slot {slot}")))
    }

    /// The index of the primary serving `key`'s slot ([`key_slot`]); fails
    /// as [`RedisCluster::primary_for_slot`].
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    pub async fn primary_for_key(&self, key: impl AsRef<[u8]>) -> io::Result<usize> {
        self.primary_for_slot(key_slot(key)).await
    }

    /// The index of a running replica of node `primary`, as `CLUSTER
    /// SLOTS` lists it once the running nodes agree; fails when they do not
    /// within 30 s, or the node has no running replica.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    pub async fn replica_of(&self, primary: usize) -> io::Result<usize> {
        let port = self.nodes[primary].port();
        let shards = self.agreed_slots().await?;
        let mut replicas = shards.iter().filter(|s| s.primary == port);
        let replica = replicas.find_map(|s| {
            let mut nodes = s.replicas.iter().filter_map(|&p| self.index_of(p));
            nodes.find(|&i| self.nodes[i].process.is_running())
        });
        replica.ok_or_else(|| io::Error::other(format!("node {primary} has no replica")))
    }

    /// Kills node `node` (SIGKILL): its data is lost.
    ///
    /// # Cancel safety
    /// One signal: if dropped, it may or may not have been sent.
    pub async fn kill(&mut self, node: usize) -> io::Result<()> {
        let node = &mut self.nodes[node];
        node.paused = false;
        node.process.kill().await
    }

    /// Freezes node `node` (SIGSTOP): it neither answers nor gossips.
    ///
    /// # Cancel safety
    /// One signal: if dropped, it may or may not have been sent.
    pub async fn pause(&mut self, node: usize) -> io::Result<()> {
        let node = &mut self.nodes[node];
        node.process.pause().await?;
        node.paused = true;
        Ok(())
    }

    /// Resumes a node frozen by [`RedisCluster::pause`] (SIGCONT).
    ///
    /// # Cancel safety
    /// One signal: if dropped, it may or may not have been sent.
    pub async fn unpause(&mut self, node: usize) -> io::Result<()> {
        let node = &mut self.nodes[node];
        node.process.unpause().await?;
        node.paused = false;
        Ok(())
    }

    /// Starts node `node` again on its ports (killed first if it runs),
    /// empty but with its `nodes.conf`: it rejoins as itself, a replaced
    /// primary as a replica ([`RedisCluster::wait_until_healthy`]).
    /// Returns once it listens; fails if not within 10 s.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the node stopped.
    pub async fn restart(&mut self, node: usize) -> io::Result<()> {
        let node = &mut self.nodes[node];
        node.paused = false;
        node.process.restart().await
    }

    /// Sends `CLUSTER FAILOVER` to node `replica` and waits until it is a
    /// primary for itself and for every running node (sent again every
    /// 10 s, should a manual failover time out). Its former primary then
    /// resynchronises as its replica: [`RedisCluster::wait_until_healthy`].
    /// Fails when the node is not a replica, or not a primary within 30 s.
    ///
    /// # Cancel safety
    /// Dropping the future leaves a failover it has asked for under way.
    pub async fn failover(&self, replica: usize) -> io::Result<()> {
        let (url, port) = (self.nodes[replica].url(), self.nodes[replica].port());
        if role(&url).await?.0 != Role::Replica {
            let message = format!("CLUSTER FAILOVER: {url} is not a replica");
            return Err(io::Error::new(io::ErrorKind::InvalidInput, message));
        }
        let mut sent = None::<Instant>;
        poll_ready(READY_LIMIT, &format!("{url} did not take over"), || {
            let send = sent.is_none_or(|at| at.elapsed() > Duration::from_secs(10));
            sent = if send { Some(Instant::now()) } else { sent };
            let url = &url;
            async move {
                if role(url).await?.0 == Role::Replica {
                    if send {
                        ask::<()>(url, &["CLUSTER", "FAILOVER"]).await?;
                    }
                    return Err(io::Error::other("it is still a replica"));
                }
                for (other, shards) in self.views().await? {
                    if shards.iter().all(|s| s.primary != port) {
                        return Err(io::Error::other(format!("not primary for {other}")));
                    }
                }
                Ok(())
            }
        })
        .await
    }

    /// Waits until the running, unpaused nodes report `cluster_state:ok`
    /// and the same `CLUSTER SLOTS`, where each of them is listed, and only
    /// them (a dead primary was replaced), each replica with its link up;
    /// fails when not within 30 s (the message says what is missing).
    ///
    /// # Cancel safety
    /// Cancel safe: it only polls.
    pub async fn wait_until_healthy(&self) -> io::Result<()> {
        let what = "the cluster did not become healthy";
        poll_ready(READY_LIMIT, what, || self.health()).await?;
        Ok(())
    }

    /// Moves hash slot `slot` from the primary serving it to node `to`, the
    /// standard way: [`RedisCluster::begin_slot_migration`], then
    /// `SlotMigration::finish` (every key moved with `MIGRATE`, then
    /// `CLUSTER SETSLOT <slot> NODE` on every primary). Returns once the
    /// running nodes all report the slot at `to` in `CLUSTER SLOTS`.
    ///
    /// Fails ([`io::ErrorKind::InvalidInput`]) when `slot` is not below
    /// 16384, node `to` is not a primary, or it serves the slot already;
    /// fails when a step fails, or the nodes do not agree within 30 s.
    ///
    /// ```no_run
    /// # async fn f(cluster: &multilock::testkit::RedisCluster) -> std::io::Result<()> {
    /// use multilock::testkit::key_slot;
    ///
    /// let slot = key_slot("lock");
    /// let to = (cluster.primary_for_slot(slot).await? + 1) % 3;
    /// cluster.migrate_slot(slot, to).await?;
    /// assert_eq!(cluster.primary_for_slot(slot).await?, to);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Dropping the future may leave the slot migrating, its keys split
    /// between both nodes (`CLUSTER SETSLOT <slot> STABLE` on both undoes
    /// the states, not the moves), or reassigned on some primaries only
    /// (gossip then spreads the target's claim).
    pub async fn migrate_slot(&self, slot: u16, to: usize) -> io::Result<()> {
        self.begin_slot_migration(slot, to)
            .await?
            .finish(self)
            .await
    }

    /// Starts moving hash slot `slot` from the primary serving it to node
    /// `to`, and holds it there: `CLUSTER SETSLOT <slot> IMPORTING
    /// <source-id>` on the target, then `CLUSTER SETSLOT <slot> MIGRATING
    /// <target-id>` on the source. No key moves yet: move them with
    /// `SlotMigration::move_keys`, end with `SlotMigration::finish`.
    ///
    /// While the slot migrates, the source still serves the keys it holds;
    /// for a key it does not hold (moved, or new) it answers `-ASK <slot>
    /// 127.0.0.1:<target-port>`, and the target serves that key only to a
    /// connection that sent `ASKING` just before (otherwise it answers
    /// `MOVED` back to the source). A command on several keys of the slot,
    /// some there and some not (moved, or never written: a lock's Pub/Sub
    /// channel name passed as a key, say), gets `-TRYAGAIN` from the
    /// source, and from the target after `ASKING`, until the migration
    /// ends; with none of its keys on the source, `-ASK`.
    ///
    /// Fails ([`io::ErrorKind::InvalidInput`]) when `slot` is not below
    /// 16384, node `to` is not a primary, or it serves the slot already;
    /// fails when the nodes do not agree on `CLUSTER SLOTS` within 30 s,
    /// or a node refuses its `SETSLOT`.
    ///
    /// ```no_run
    /// # async fn f(cluster: &multilock::testkit::RedisCluster) -> std::io::Result<()> {
    /// use multilock::testkit::key_slot;
    ///
    /// let slot = key_slot("{user1000}");
    /// let to = (cluster.primary_for_slot(slot).await? + 1) % 3;
    /// let migration = cluster.begin_slot_migration(slot, to).await?;
    /// let moved = migration.move_keys(cluster).await?;
    /// // Here the source answers ASK for every key of the slot.
    /// migration.finish(cluster).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Dropping the future may leave the slot importing on the target, and
    /// migrating on the source, without a handle: `CLUSTER SETSLOT <slot>
    /// STABLE` on both undoes that.
    pub async fn begin_slot_migration(&self, slot: u16, to: usize) -> io::Result<SlotMigration> {
        let target = &self.nodes[to];
        let invalid = |message| Err(io::Error::new(io::ErrorKind::InvalidInput, message));
        if slot >= SLOTS {
            return invalid(format!("no hash slot {slot}: there are {SLOTS}"));
        }
        if role(&target.url()).await?.0 != Role::Primary {
            return invalid(format!("slot {slot}: {} is not a primary", target.url()));
        }
        let from = self.primary_for_slot(slot).await?;
        if from == to {
            return invalid(format!("slot {slot}: {} serves it already", target.url()));
        }
        let (source, slot_arg) = (&self.nodes[from], slot.to_string());
        let importing = ["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &source.id];
        ask::<()>(&target.url(), &importing).await?;
        let migrating = ["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &target.id];
        ask::<()>(&source.url(), &migrating).await?;
        Ok(SlotMigration { slot, from, to })
    }

    async fn health(&self) -> io::Result<Vec<Shard>> {
        let shards = self.agreement().await?;
        let up = |port| self.index_of(port).is_some_and(|i| self.nodes[i].is_up());
        for shard in &shards {
            let primary = shard.primary;
            if !up(primary) || role(&url_of(primary)).await?.0 != Role::Primary {
                return Err(io::Error::other(format!("{primary} is down or a replica")));
            }
            for &replica in &shard.replicas {
                if !up(replica) || role(&url_of(replica)).await?.1 != Some((primary, true)) {
                    return Err(io::Error::other(format!("{replica}: no link to {primary}")));
                }
            }
        }
        let listed = |node: &ClusterNode| shards.iter().any(|s| s.lists(node.port()));
        match self.nodes.iter().find(|n| n.is_up() && !listed(n)) {
            Some(node) => Err(io::Error::other(format!("{} not listed", node.url()))),
            None => Ok(shards),
        }
    }

    /// `CLUSTER SLOTS`, when every running, unpaused node reports
    /// `cluster_state:ok` and the same slots.
    async fn agreement(&self) -> io::Result<Vec<Shard>> {
        let mut views = self.views().await?.into_iter();
        let none = || io::Error::other("no node runs");
        let (first, shards) = views.next().ok_or_else(none)?;
        if let Some((other, _)) = views.find(|(_, other)| *other != shards) {
            return Err(io::Error::other(format!("{first} and {other} disagree")));
        }
        for url in self.up_urls() {
            let info: String = ask(&url, &["CLUSTER", "INFO"]).await?;
            if info_field(&info, "cluster_state") != Some("ok") {
                return Err(io::Error::other(format!("{url} says cluster_state not ok")));
            }
        }
        Ok(shards)
    }

    async fn agreed_slots(&self) -> io::Result<Vec<Shard>> {
        let what = "the cluster nodes did not agree on CLUSTER SLOTS";
        poll_ready(READY_LIMIT, what, || self.agreement()).await
    }

    /// `CLUSTER SLOTS` as each running, unpaused node reports it.
    async fn views(&self) -> io::Result<Vec<(String, Vec<Shard>)>> {
        let mut views = Vec::new();
        for url in self.up_urls() {
            let slots = parse_slots(ask(&url, &["CLUSTER", "SLOTS"]).await?)?;
            views.push((url, slots));
        }
        Ok(views)
    }

    fn up_urls(&self) -> Vec<String> {
        let up = self.nodes.iter().filter(|n| n.is_up());
        up.map(ClusterNode::url).collect()
    }

    fn index_of(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }
}

/// A hash slot held mid-migration between two primaries of a
/// [`RedisCluster`], from [`RedisCluster::begin_slot_migration`]: the slot
/// is importing on the target and migrating on the source, so the source
/// answers `ASK` for every key of the slot it no longer holds.
///
/// Dropping it leaves the slot migrating; [`SlotMigration::finish`] ends
/// the migration.
///
/// ```no_run
/// # async fn f(cluster: &multilock::testkit::RedisCluster) -> std::io::Result<()> {
/// let migration = cluster.begin_slot_migration(42, 1).await?;
/// println!("slot {} from node {} to node {}", migration.slot(), migration.from(), migration.to());
/// migration.move_keys(cluster).await?;
/// migration.finish(cluster).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "the slot stays migrating until `finish`"]
pub struct SlotMigration {
    slot: u16,
    from: usize,
    to: usize,
}

impl SlotMigration {
    /// The hash slot.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The index of the source, the primary that served the slot.
    pub fn from(&self) -> usize {
        self.from
    }

    /// The index of the target, the primary the slot moves to.
    pub fn to(&self) -> usize {
        self.to
    }

    /// Moves every key the source holds in the slot to the target
    /// (`CLUSTER GETKEYSINSLOT <slot> 100` on the source, then `MIGRATE
    /// 127.0.0.1 <target-port> "" 0 5000 KEYS <keys>`, until it holds
    /// none), and returns how many it moved (a key that expired before its
    /// `MIGRATE` counts). `cluster` is the cluster that began the
    /// migration. Fails when a node does not answer within 5 s or refuses
    /// a `MIGRATE` (for one, when the target holds one of the keys
    /// already: `BUSYKEY`).
    ///
    /// # Cancel safety
    /// Dropping the future leaves some of the keys moved; each key is on
    /// one node or the other.
    pub async fn move_keys(&self, cluster: &RedisCluster) -> io::Result<usize> {
        let (source, target) = (cluster.nodes[self.from].url(), &cluster.nodes[self.to]);
        let slot = self.slot.to_string();
        let mut moved = 0;
        loop {
            let batch = ["CLUSTER", "GETKEYSINSLOT", &slot, MIGRATE_BATCH];
            let keys: Vec<Vec<u8>> = ask(&source, &batch).await?;
            if keys.is_empty() {
                return Ok(moved);
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate.arg("127.0.0.1").arg(target.port()).arg("").arg(0);
            migrate.arg(MIGRATE_TIMEOUT_MS).arg("KEYS").arg(&keys);
            command::<()>(&source, &migrate).await?;
            moved += keys.len();
        }
    }

    /// Ends the migration: moves the keys left ([`SlotMigration::move_keys`]),
    /// assigns the slot to the target with `CLUSTER SETSLOT <slot> NODE
    /// <target-id>` on the target, the source, then every other running
    /// primary, and waits until the running nodes all report the slot at
    /// the target in `CLUSTER SLOTS`. `cluster` is the cluster that began
    /// the migration. Fails when a step fails, or the nodes do not agree
    /// within 30 s.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the slot migrating, or reassigned on
    /// some primaries only (gossip then spreads the target's claim, which
    /// has the newer config epoch).
    pub async fn finish(self, cluster: &RedisCluster) -> io::Result<()> {
        self.move_keys(cluster).await?;
        let (slot, target) = (self.slot.to_string(), &cluster.nodes[self.to]);
        let assign = ["CLUSTER", "SETSLOT", &slot, "NODE", &target.id];
        // The target first: it takes the slot with a config epoch of its
        // own, so gossip cannot hand the slot back to the source.
        ask::<()>(&target.url(), &assign).await?;
        ask::<()>(&cluster.nodes[self.from].url(), &assign).await?;
        let others = cluster.nodes.iter().enumerate();
        let others = others.filter(|&(i, node)| i != self.from && i != self.to && node.is_up());
        for (_, node) in others {
            // Replicas refuse SETSLOT; they learn the owner from gossip.
            if role(&node.url()).await?.0 == Role::Primary {
                ask::<()>(&node.url(), &assign).await?;
            }
        }
        let port = target.port();
        let what = format!("slot {slot} did not move to {}", target.url());
        poll_ready(READY_LIMIT, &what, || async {
            let owner = owner_of(&cluster.agreement().await?, self.slot);
            match owner {
                Some(owner) if owner == port => Ok(()),
                owner => Err(io::Error::other(format!("the nodes agree on {owner:?}"))),
            }
        })
        .await
    }
}

/// A node's arguments. The cluster bus gets a free port of its own, as the
/// default (port + 10000) may be past 65535; should another program take it
/// first, the node exits and [`RedisProcess::start_with_args`] tries again.
fn node_args(port: u16) -> Vec<String> {
    let mut bus = (0..5).filter_map(|_| free_port().ok());
    let bus = bus.find(|&bus| bus != port).unwrap_or(0).to_string();
    let args = [
        ["--cluster-enabled", "yes"],
        ["--cluster-node-timeout", "1000"],
        // Relative to the node's own `--dir`, which restarts keep.
        ["--cluster-config-file", "nodes.conf"],
        ["--cluster-port", &bus],
        ["--cluster-allow-replica-migration", "no"],
        // CLUSTER SLOTS leaves out a replica at offset 0, where it stays
        // until its primary's first ping (10 s by default) or write.
        ["--repl-ping-replica-period", "1"],
        PRIMARY_FLAGS,
    ];
    args.iter().flatten().map(|&a| a.to_owned()).collect()
}

/// One range of `CLUSTER SLOTS`: its primary's and replicas' ports.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shard {
    first: u16,
    last: u16,
    primary: u16,
    replicas: Vec<u16>,
}

impl Shard {
    fn lists(&self, port: u16) -> bool {
        self.primary == port || self.replicas.contains(&port)
    }
}

/// The port of the primary serving `slot` in `shards`.
fn owner_of(shards: &[Shard], slot: u16) -> Option<u16> {
    let shard = shards.iter().find(|s| (s.first..=s.last).contains(&slot));
    shard.map(|s| s.primary)
}

fn parse_slots(reply: Vec<Vec<Value>>) -> io::Result<Vec<Shard>> {
    let bad = || io::Error::other("unexpected CLUSTER SLOTS reply");
    let number = |v: &Value| redis::from_redis_value_ref::<u16>(v).map_err(|_| bad());
    let port = |node: &Value| match node {
        Value::Array(fields) => fields.get(1).ok_or_else(bad).and_then(number),
        _ => Err(bad()),
    };
    let mut shards = Vec::new();
    for range in reply {
        let [first, last, primary, replicas @ ..] = range.as_slice() else {
            return Err(bad());
        };
        let mut replicas: Vec<u16> = replicas.iter().map(port).collect::<io::Result<_>>()?;
        replicas.sort_unstable();
        let (first, last, primary) = (number(first)?, number(last)?, port(primary)?);
        shards.push(Shard {
            first,
            last,
            primary,
            replicas,
        });
    }
    shards.sort_by_key(|s| s.first);
    Ok(shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn set_get(url: &str, key: &str) -> io::Result<String> {
        ask::<()>(url, &["SET", key, "v"]).await?;
        ask(url, &["GET", key]).await
    }

    /// A key whose slot lies in `first..=last`.
    fn key_in((first, last): (u16, u16)) -> String {
        let mut keys = (0..).map(|n| format!("key:{n}"));
        let fits = |key: &String| (first..=last).contains(&key_slot(key));
        keys.find(fits).unwrap()
    }

    /// Keys go to their primaries; then a `CLUSTER FAILOVER` swaps roles.
    #[tokio::test]
    async fn keys_route_to_their_primaries_and_cluster_failover_swaps_roles() {
        let started = Instant::now();
        let mut cluster = RedisCluster::start().await.unwrap();
        tracing::info!("cluster ready in {:?}", started.elapsed());
        let url = cluster.nodes()[0].url();
        // The empty key first.
        for key in " lock {user1000}.a a{}{b} a{{b}}c a{b x{} {a}{b}".split(' ') {
            let slot: u16 = ask(&url, &["CLUSTER", "KEYSLOT", key]).await.unwrap();
            assert_eq!(key_slot(key), slot, "{key}");
        }
        for (i, shard) in SHARDS.into_iter().enumerate() {
            let (key, url) = (key_in(shard), cluster.nodes()[i].url());
            assert_eq!(cluster.primary_for_key(&key).await.unwrap(), i);
            assert_eq!(cluster.nodes()[i].role().await.unwrap(), Role::Primary);
            assert_eq!(set_get(&url, &key).await.unwrap(), "v");
            let moved = set_get(&cluster.nodes()[(i + 1) % 3].url(), &key).await;
            let moved = moved.unwrap_err().to_string();
            let port = cluster.nodes()[i].port();
            assert!(moved.ends_with(&format!(" 127.0.0.1:{port}")), "{moved}");
            assert_eq!(cluster.replica_of(i).await.unwrap(), i + 3);
            assert_eq!(cluster.nodes()[i + 3].role().await.unwrap(), Role::Replica);
        }
        assert_eq!(cluster.seed_urls().len(), 6);

        let started = Instant::now();
        cluster.failover(3).await.unwrap();
        tracing::info!("CLUSTER FAILOVER done in {:?}", started.elapsed());
        assert_eq!(cluster.primary_for_slot(0).await.unwrap(), 3);
        cluster.wait_until_healthy().await.unwrap();
        tracing::info!("healthy again after {:?}", started.elapsed());
        assert_eq!(cluster.replica_of(3).await.unwrap(), 0);
        assert_eq!(cluster.nodes()[0].role().await.unwrap(), Role::Replica);
        let key = key_in(SHARDS[0]);
        assert_eq!(set_get(&cluster.nodes()[3].url(), &key).await.unwrap(), "v");
        // A short freeze of a replica changes nothing.
        cluster.pause(5).await.unwrap();
        cluster.unpause(5).await.unwrap();
        cluster.wait_until_healthy().await.unwrap();
    }

    /// A plain connection to `url`, which follows no redirection.
    async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
        let client = redis::Client::open(url).unwrap();
        client.get_multiplexed_async_connection().await.unwrap()
    }

    /// GET `key` on `conn`: its value, or the error reply.
    async fn get(
        conn: &mut redis::aio::MultiplexedConnection,
        key: &str,
    ) -> redis::RedisResult<String> {
        redis::cmd("GET").arg(key).query_async(conn).await
    }

    /// The code and address of a redirection (`ASK`, `MOVED`) of `slot`.
    fn redirection(error: &redis::RedisError, slot: u16) -> (Option<&str>, Option<&str>) {
        let node = error.redirect_node();
        assert_eq!(node.map(|(_, s)| s), Some(slot), "{error}");
        (error.code(), node.map(|(address, _)| address))
    }

    /// The value the migration tests write to `key`.
    fn value_of(key: &str) -> String {
        format!("value of {key}")
    }

    /// A slot held mid-migration: moved keys get ASK from the source and
    /// are served by the target after ASKING; once finished, every node puts
    /// the slot on the target, and the source answers MOVED.
    #[tokio::test]
    async fn a_slot_mid_migration_answers_ask_then_moves_to_the_target() {
        let cluster = RedisCluster::start().await.unwrap();
        let keys = ["{migrating}.a", "{migrating}.b", "{migrating}.c"];
        let slot = key_slot(keys[0]);
        assert!(keys.iter().all(|key| key_slot(key) == slot));
        let from = cluster.primary_for_slot(slot).await.unwrap();
        let to = (from + 1) % 3;
        let (source, target) = (&cluster.nodes()[from], &cluster.nodes()[to]);
        for key in keys {
            ask::<()>(&source.url(), &["SET", key, &value_of(key)])
                .await
                .unwrap();
        }

        let started = Instant::now();
        let migration = cluster.begin_slot_migration(slot, to).await.unwrap();
        assert_eq!(
            (migration.slot(), migration.from(), migration.to()),
            (slot, from, to)
        );
        let mut on_source = raw(&source.url()).await;
        // Nothing moved yet: the source serves its keys.
        assert_eq!(
            get(&mut on_source, keys[0]).await.unwrap(),
            value_of(keys[0])
        );
        // A command on held and absent keys of the slot (a lock and its
        // Pub/Sub channel name, say) waits the migration out.
        let absent = "{migrating}.absent";
        let mut mget = redis::cmd("MGET");
        mget.arg(keys[0]).arg(absent);
        let error = mget.query_async::<()>(&mut on_source).await.unwrap_err();
        assert_eq!(error.code(), Some("TRYAGAIN"), "{error}");
        assert_eq!(migration.move_keys(&cluster).await.unwrap(), 3);
        assert_eq!(migration.move_keys(&cluster).await.unwrap(), 0);
        let target_at = format!("127.0.0.1:{}", target.port());
        let source_at = format!("127.0.0.1:{}", source.port());
        let (ask, moved) = (Some("ASK"), Some("MOVED"));
        let (to_target, to_source) = (Some(target_at.as_str()), Some(source_at.as_str()));
        for key in keys {
            let error = get(&mut on_source, key).await.unwrap_err();
            assert_eq!(redirection(&error, slot), (ask, to_target));
        }
        // The target serves a moved key only after ASKING.
        let mut on_target = raw(&target.url()).await;
        let error = get(&mut on_target, keys[0]).await.unwrap_err();
        assert_eq!(redirection(&error, slot), (moved, to_source));
        let mut asking = redis::pipe();
        asking.cmd("ASKING").ignore().cmd("GET").arg(keys[1]);
        let (value,): (String,) = asking.query_async(&mut on_target).await.unwrap();
        assert_eq!(value, value_of(keys[1]));
        let mut asking = redis::pipe();
        asking
            .cmd("ASKING")
            .ignore()
            .cmd("MGET")
            .arg(keys[0])
            .arg(absent);
        let error = asking.query_async::<()>(&mut on_target).await.unwrap_err();
        assert_eq!(error.code(), Some("TRYAGAIN"), "{error}");

        migration.finish(&cluster).await.unwrap();
        tracing::info!("slot {slot} migrated in {:?}", started.elapsed());
        for (url, shards) in cluster.views().await.unwrap() {
            assert_eq!(owner_of(&shards, slot), Some(target.port()), "{url}");
        }
        assert_eq!(cluster.primary_for_slot(slot).await.unwrap(), to);
        for key in keys {
            assert_eq!(get(&mut on_target, key).await.unwrap(), value_of(key));
            let error = get(&mut on_source, key).await.unwrap_err();
            assert_eq!(redirection(&error, slot), (moved, to_target));
        }
        // The neighbouring slots stay where they were.
        let neighbours = [slot.checked_sub(1), Some(slot + 1).filter(|&s| s < SLOTS)];
        for neighbour in neighbours.into_iter().flatten() {
            let shard = SHARDS
                .iter()
                .position(|&(first, last)| (first..=last).contains(&neighbour));
            let owner = cluster.primary_for_slot(neighbour).await.unwrap();
            assert_eq!(Some(owner), shard, "slot {neighbour}");
        }
        cluster.wait_until_healthy().await.unwrap();
    }

    /// `migrate_slot` moves a slot with its keys there and back, and
    /// refuses a replica, the current owner and a slot past 16383.
    #[tokio::test]
    async fn migrate_slot_moves_a_slot_there_and_back() {
        let cluster = RedisCluster::start().await.unwrap();
        let key = "{migrate}.key";
        let slot = key_slot(key);
        let from = cluster.primary_for_slot(slot).await.unwrap();
        let to = (from + 2) % 3;
        let invalid = |result: io::Result<()>| result.unwrap_err().kind();
        let to_replica = cluster.migrate_slot(slot, from + 3).await;
        assert_eq!(invalid(to_replica), io::ErrorKind::InvalidInput);
        let to_owner = cluster.migrate_slot(slot, from).await;
        assert_eq!(invalid(to_owner), io::ErrorKind::InvalidInput);
        assert_eq!(
            invalid(cluster.migrate_slot(SLOTS, to).await),
            io::ErrorKind::InvalidInput
        );

        ask::<()>(&cluster.nodes()[from].url(), &["SET", key, &value_of(key)])
            .await
            .unwrap();
        let started = Instant::now();
        cluster.migrate_slot(slot, to).await.unwrap();
        tracing::info!("slot {slot} migrated in {:?}", started.elapsed());
        assert_eq!(cluster.primary_for_key(key).await.unwrap(), to);
        let value: String = ask(&cluster.nodes()[to].url(), &["GET", key])
            .await
            .unwrap();
        assert_eq!(value, value_of(key));
        // The target's replica has the key too.
        let replica = cluster.replica_of(to).await.unwrap();
        let url = cluster.nodes()[replica].url();
        poll_ready(READY_LIMIT, "the replica did not get the key", || async {
            let mut conn = raw(&url).await;
            let mut readonly = redis::pipe();
            readonly.cmd("READONLY").ignore().cmd("GET").arg(key);
            let (value,): (Option<String>,) = readonly
                .query_async(&mut conn)
                .await
                .map_err(io::Error::other)?;
            value.ok_or_else(|| io::Error::other("no key yet"))
        })
        .await
        .unwrap();

        // An empty slot moves too.
        let empty = (slot + 1) % SLOTS;
        let empty_from = cluster.primary_for_slot(empty).await.unwrap();
        cluster
            .migrate_slot(empty, (empty_from + 1) % 3)
            .await
            .unwrap();
        cluster.migrate_slot(slot, from).await.unwrap();
        assert_eq!(cluster.primary_for_key(key).await.unwrap(), from);
        let value: String = ask(&cluster.nodes()[from].url(), &["GET", key])
            .await
            .unwrap();
        assert_eq!(value, value_of(key));
        cluster.wait_until_healthy().await.unwrap();
    }

    #[tokio::test]
    async fn a_killed_primary_is_replaced_and_rejoins_as_a_replica() {
        let mut cluster = RedisCluster::start().await.unwrap();
        let key = key_in(SHARDS[1]);
        let started = Instant::now();
        cluster.kill(1).await.unwrap();
        assert_eq!(cluster.nodes()[1].pid(), None);
        cluster.wait_until_healthy().await.unwrap();
        tracing::info!("killed primary replaced in {:?}", started.elapsed());
        assert_eq!(cluster.primary_for_key(&key).await.unwrap(), 4);
        assert_eq!(set_get(&cluster.nodes()[4].url(), &key).await.unwrap(), "v");
        let started = Instant::now();
        cluster.restart(1).await.unwrap();
        cluster.wait_until_healthy().await.unwrap();
        tracing::info!("restarted node rejoined in {:?}", started.elapsed());
        assert_eq!(cluster.replica_of(4).await.unwrap(), 1);
        assert_eq!(cluster.nodes()[1].role().await.unwrap(), Role::Replica);
    }
}
