//! A Redis Cluster of `redis-server` processes on loopback: three
//! primaries, one replica each, joined by the kit itself.

use std::io;
use std::time::{Duration, Instant};

use redis::Value;

use super::command::{Role, ask, free_port, info_field, poll_ready, role, url_of};
use super::process::server_major;
use super::replicated::PRIMARY_FLAGS;
use super::{RedisProcess, TcpProxy, TestServer};
use multilock::wire::SLOTS;

mod migration;
mod partition;

pub use migration::SlotMigration;

/// How long a start, a failover or a return to health may take.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// The slots of the three primaries, split as `redis-cli --cluster create` does.
const SHARDS: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// The hash slot of `key` as Redis computes it: CRC16 (XMODEM) of the key,
/// or of its hash tag (what lies between the first `{` and the next `}`,
/// when not empty), modulo 16384.
///
/// ```no_run
/// use multilock_testkit::key_slot;
///
/// assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
/// ```
pub fn key_slot(key: impl AsRef<[u8]>) -> u16 {
    multilock::wire::key_slot(key.as_ref())
}

/// One node of a [`RedisCluster`]: a [`RedisProcess`] and its cluster node id.
///
/// ```no_run
/// # fn f(c: &multilock_testkit::RedisCluster) {
/// let (url, id, pid) = (c.nodes()[0].url(), c.nodes()[0].id(), c.nodes()[0].pid());
/// # }
/// ```
#[derive(Debug)]
pub struct ClusterNode {
    process: RedisProcess,
    id: String,
    paused: bool,
    /// Cut off the bus ([`RedisCluster::isolate`]).
    isolated: bool,
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
        self.process.is_running() && !self.paused && !self.isolated
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
/// `ADDSLOTS`, `REPLICATE`) rather than with `redis-cli --cluster
/// create`: no second binary to find next to `$MULTILOCK_REDIS_SERVER`, no
/// fixed one-second waits, and the replica of each primary known in advance.
///
/// ```no_run
/// use multilock_testkit::RedisCluster;
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
    /// Each node's bus proxy, when started with them.
    bus: Vec<TcpProxy>,
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
        RedisCluster::start_with(false).await
    }

    async fn start_with(bus_proxies: bool) -> io::Result<RedisCluster> {
        let starts = (0..6).map(|_| RedisProcess::start_with_args(node_args));
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            bus: Vec::new(),
        };
        for (index, process) in futures::future::try_join_all(starts)
            .await?
            .into_iter()
            .enumerate()
        {
            let url = process.url();
            if bus_proxies {
                let proxy = partition::proxy_bus(&process).await?;
                partition::announce_proxy(&url, index, &proxy).await?;
                cluster.bus.push(proxy);
            }
            let id = ask(&url, &["CLUSTER", "MYID"]).await?;
            let (paused, isolated) = (false, false);
            cluster.nodes.push(ClusterNode {
                process,
                id,
                paused,
                isolated,
            });
        }
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
            if let Some(&(from, to)) = SHARDS.get(i) {
                // ADDSLOTS, not ADDSLOTSRANGE (7.0+): Redis 6.2 too.
                let slots: Vec<String> = (from..=to).map(|slot| slot.to_string()).collect();
                let mut args = vec!["CLUSTER", "ADDSLOTS"];
                args.extend(slots.iter().map(String::as_str));
                ask::<()>(&url, &args).await?;
            }
            if i > 0 {
                let bus = match self.bus.get(i) {
                    Some(proxy) => proxy.port(),
                    None => partition::bus_port(&url).await?,
                };
                let bus = bus.to_string();
                let port = node.port().to_string();
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
    pub async fn restart(&mut self, index: usize) -> io::Result<()> {
        let node = &mut self.nodes[index];
        node.paused = false;
        node.process.restart().await?;
        match self.bus.get(index) {
            Some(proxy) => partition::announce_proxy(&node.url(), index, proxy).await,
            None => Ok(()),
        }
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

/// A node's arguments. The cluster bus gets a free port of its own, as the
/// default (port + 10000) may be past 65535; should another program take it
/// first, the node exits and [`RedisProcess::start_with_args`] tries again.
/// Redis 6.2 has no `cluster-port`: its bus is on the default port, and a
/// node whose port leaves no room for it exits and is tried again likewise.
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
    let no_cluster_port = server_major().is_some_and(|major| major < 7);
    let args = args
        .iter()
        .filter(|arg| !(no_cluster_port && arg[0] == "--cluster-port"));
    args.flatten().map(|&a| a.to_owned()).collect()
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
mod tests;
