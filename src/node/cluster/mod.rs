//! A node that is a Redis Cluster: each lock's requests go to the primary
//! of its name's hash slot, as the cluster's slot map says, followed across
//! failovers and slot migrations.
//!
//! Every key of one lock shares the slot of `{name}` (Redisson's naming),
//! so one script never spans shards; a name whose braces would split its
//! keys (`a{b`) is refused when the lock is built. Each shard is served by
//! a standalone node of its own (pool, health, `run_id`), made when the
//! slot map first names it; the map comes from a vote of the known shards
//! and the seeds (`vote`: the highest config epoch wins each slot), about
//! once a second and at once on a `MOVED`, a `READONLY` or a lost
//! connection.
//!
//! Why not redis-rs's cluster connection for commands: it retries a
//! request whose connection dropped (`RetryMethod::Reconnect`), after which
//! the new primary may apply an acquire the old one had already applied
//! and replicated, and the owner would hold the lock twice while counting
//! one hold. Here only the answers that prove a request did not run are
//! retried: `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN` and `READONLY`. A
//! request whose connection broke is an unknown outcome, settled by the
//! lock's rollback as on any node. The subscription does use redis-rs's
//! cluster connection, on its own (see `subscriber`).
//!
//! A cluster counts as **one** member of a MultiLock or RedLock: its
//! failovers are asynchronous and can lose the last writes, like a
//! Sentinel group's. Its `generation` (what fencing repairs after) moves
//! whenever a slot changes hands or a shard's server restarts.

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use redis::{ConnectionAddr, ConnectionInfo};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use tokio::sync::watch;

mod slots;
mod vote;

pub(crate) use slots::key_slot;
use slots::{SLOTS, SlotRange, split_addr};
use vote::{Ballot, Voters};

use super::identity::ServerIdentity;
use super::poller::Poller;
use super::{Node, ShardSettings};
use crate::error::{Error, Result, Unavailable};

/// No primary serves the slot (as far as the map knows).
const UNSERVED: u16 = u16::MAX;

/// The first Redis major version with sharded pub/sub.
const SHARDED_PUBSUB_SINCE: u32 = 7;

/// Whether a Cluster node's releases and waiters use sharded pub/sub
/// (`SPUBLISH` / `SSUBSCRIBE`, Redis 7+) or the classic, cluster-wide kind:
/// Redisson's `shardedSubscriptionMode`, whose default (`Auto`) Redisson
/// 3.22+ resolves to sharded on Redis 7. Every client of one lock name must
/// use the same kind, or releases reach nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ShardedPubSub {
    /// Sharded when the cluster's servers are Redis 7 or later, as learned
    /// at the first contact (Redisson's default).
    #[default]
    Auto,
    /// Always sharded. Servers before Redis 7 refuse it: every request
    /// on the node then fails with a permanent [`Error::InvalidArgument`]
    /// naming the version, before anything is sent.
    On,
    /// Never: `PUBLISH` / `SUBSCRIBE`, broadcast to every node.
    Off,
}

/// Where a Cluster node's shards are, and the server identity of the node
/// as a whole.
pub(crate) struct ClusterMap {
    /// The node's name: `cluster/<lowest seed host:port>`.
    name: String,
    seeds: Vec<ConnectionInfo>,
    /// How to connect to a shard: everything but the address.
    template: ConnectionInfo,
    tls: bool,
    settings: ShardSettings,
    shard_node: ShardNode,
    view: RwLock<View>,
    /// One refresh at a time; `refreshes` counts those done, so a caller
    /// that waited for another's takes its result.
    refreshing: tokio::sync::Mutex<()>,
    refreshes: AtomicU64,
    voters: Voters,
    /// Bumped when a slot changes hands: the subscription moves, and
    /// waiters re-check.
    epoch: AtomicU64,
    switched: watch::Sender<u64>,
    /// The node's identity: its generation moves on every change of hands
    /// and every shard's restart.
    identity: Arc<ServerIdentity>,
    mode: ShardedPubSub,
    sharded: Arc<AtomicBool>,
    /// Whether Auto was resolved (by a server's version).
    resolved: AtomicBool,
    poller: Poller,
    me: Weak<ClusterMap>,
}

#[derive(Default)]
struct View {
    /// For each slot, the index in `shards` of its primary, or [`UNSERVED`].
    owners: Vec<u16>,
    shards: Vec<Shard>,
}

#[derive(Clone)]
struct Shard {
    addr: String,
    /// The cluster node id (`CLUSTER MYID`); empty when only a `MOVED`
    /// named it so far.
    id: String,
    node: Node,
}

/// Makes the node of a new shard: its address, its target, its identity,
/// the settings. Given by the builder, which knows how a target becomes a
/// node's connections; the map then never names the connector's dispatcher
/// (`target`), which names the map.
pub(crate) type ShardNode =
    fn(String, Arc<ShardTarget>, Arc<ServerIdentity>, &ShardSettings) -> Node;

/// What a shard's connections go to, and the map to tell when they find
/// it moved.
pub(crate) struct ShardTarget {
    pub(crate) client: redis::Client,
    map: Weak<ClusterMap>,
}

impl ShardTarget {
    /// A shard of no map, for tests of the target alone.
    #[cfg(test)]
    pub(crate) fn detached(client: redis::Client) -> ShardTarget {
        ShardTarget {
            client,
            map: Weak::new(),
        }
    }

    /// The map of the cluster this shard is part of, while it is used.
    pub(crate) fn map(&self) -> Option<Arc<ClusterMap>> {
        self.map.upgrade()
    }

    pub(crate) fn maybe_moved(&self) {
        if let Some(map) = self.map.upgrade() {
            map.check_soon();
        }
    }
}

impl ClusterMap {
    pub(crate) fn new(
        seeds: Vec<ConnectionInfo>,
        mode: ShardedPubSub,
        settings: ShardSettings,
        shard_node: ShardNode,
    ) -> Arc<ClusterMap> {
        let lowest = seeds.iter().map(super::addr_of).min().unwrap_or_default();
        let name = format!("cluster/{lowest}");
        let template = seeds[0].clone();
        let tls = matches!(template.addr(), ConnectionAddr::TcpTls { .. });
        Arc::new_cyclic(|me| ClusterMap {
            identity: Arc::new(ServerIdentity::new(name.clone())),
            name,
            seeds,
            template,
            tls,
            settings,
            shard_node,
            view: RwLock::new(View::default()),
            refreshing: tokio::sync::Mutex::new(()),
            refreshes: AtomicU64::new(0),
            voters: Voters::default(),
            epoch: AtomicU64::new(0),
            switched: watch::channel(0).0,
            mode,
            sharded: Arc::new(AtomicBool::new(mode != ShardedPubSub::Off)),
            resolved: AtomicBool::new(mode != ShardedPubSub::Auto),
            poller: Poller::new(),
            me: me.clone(),
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// A certificate authority (PEM) the shards' TLS may be signed by.
    #[cfg(feature = "tls")]
    pub(crate) fn tls_root_cert(&self) -> Option<&[u8]> {
        self.settings.tls_root_cert.as_deref()
    }

    pub(crate) fn identity(&self) -> Arc<ServerIdentity> {
        self.identity.clone()
    }

    /// Whether releases publish with `SPUBLISH` (shared with every lock's
    /// keys, see `protocol::Publish`).
    pub(crate) fn sharded_flag(&self) -> Arc<AtomicBool> {
        self.sharded.clone()
    }

    pub(crate) fn is_sharded(&self) -> bool {
        self.sharded.load(Ordering::Relaxed)
    }

    /// Which change of hands this is: the subscription made at another
    /// moves.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub(crate) fn switches(&self) -> watch::Receiver<u64> {
        self.switched.subscribe()
    }

    /// Asks for the slot map now, then fast for a while.
    /// (The poller starts here too, if it stopped with the runtime it ran
    /// on: every sign of a change comes through here.)
    pub(crate) fn check_soon(&self) {
        self.start_poller();
        self.poller.check_soon();
    }

    /// Who votes on the map: the shards known, then the seeds.
    pub(crate) fn contact_points(&self) -> Vec<ConnectionInfo> {
        let mut points = self.subscription_points();
        points.extend(self.seeds.iter().cloned());
        points
    }

    /// Where the subscription's cluster connection starts, and takes its
    /// own slot map from (redis-rs's, from the first node that answers):
    /// the shards the vote chose, healthy first, so that neither a frozen
    /// one nor a stale primary among the seeds is asked; the seeds only
    /// while the map knows no shard.
    pub(crate) fn subscription_points(&self) -> Vec<ConnectionInfo> {
        let view = self.view.read().unwrap();
        let mut known: Vec<&Shard> = view.shards.iter().collect();
        known.sort_by_key(|s| !s.node.is_healthy());
        let points: Vec<ConnectionInfo> = known.iter().map(|s| self.shard_info(&s.addr)).collect();
        match points.is_empty() {
            true => self.seeds.clone(),
            false => points,
        }
    }

    /// The shards' nodes, as the map knows them now.
    pub(crate) fn shard_nodes(&self) -> Vec<Node> {
        let view = self.view.read().unwrap();
        view.shards.iter().map(|s| s.node.clone()).collect()
    }

    /// The node serving `slot` as far as the map knows, without I/O.
    pub(crate) fn known_shard(&self, slot: u16) -> Option<Node> {
        let view = self.view.read().unwrap();
        let owner = *view.owners.get(usize::from(slot))?;
        view.shards.get(usize::from(owner)).map(|s| s.node.clone())
    }

    /// The node serving `slot`, asking for the map first when it names none.
    pub(crate) async fn shard(&self, slot: u16) -> Result<Node> {
        if let Some(node) = self.known_shard(slot) {
            return Ok(node);
        }
        self.start_poller();
        self.refresh().await?;
        self.known_shard(slot).ok_or_else(|| self.no_shard(None))
    }

    /// Until the map names a primary for every slot, and Auto is resolved.
    pub(crate) async fn ensure_loaded(&self) -> Result<()> {
        self.start_poller();
        let loaded = self.view.read().unwrap().owners.len() == SLOTS;
        if loaded && self.resolved.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.refresh().await
    }

    fn no_shard(&self, source: Option<redis::RedisError>) -> Error {
        Error::NodeUnavailable {
            node: self.name.clone(),
            reason: Unavailable::NoShard,
            source,
        }
    }

    fn start_poller(&self) {
        let Some(me) = self.me.upgrade() else { return };
        self.poller.start(&me, |map: Arc<ClusterMap>| async move {
            if let Err(err) = map.vote(true).await {
                tracing::debug!(node = %map.name, error = %err, "no cluster node gave the slot map");
            }
        });
    }

    /// A `MOVED` reply: `slot` is served by `addr` now. Takes effect at
    /// once (the map is asked for again in the background).
    pub(crate) fn moved(&self, slot: u16, addr: &str) -> Option<Node> {
        let (host, port) = split_addr(addr)?;
        self.check_soon();
        let mut view = self.view.write().unwrap();
        if view.owners.len() != SLOTS {
            view.owners = vec![UNSERVED; SLOTS];
        }
        let index = self.shard_index(&mut view, &host, port, None);
        let previous = std::mem::replace(&mut view.owners[usize::from(slot)], index as u16);
        let node = view.shards[index].node.clone();
        drop(view);
        if previous != index as u16 {
            self.changed_hands();
        }
        Some(node)
    }

    /// The node at `addr`, made if the map does not know it: an `ASK`
    /// reply's target, asked once.
    pub(crate) fn node_at(&self, addr: &str) -> Option<Node> {
        let (host, port) = split_addr(addr)?;
        let mut view = self.view.write().unwrap();
        let index = self.shard_index(&mut view, &host, port, None);
        Some(view.shards[index].node.clone())
    }

    /// Asks every known shard and seed at once for its view of the slot
    /// map, and applies the vote (see `vote`) once more than half of the
    /// primaries it names have answered, or every node asked has, or the
    /// timeout is up. When no view came: a permanent error if every node
    /// refused for good (a seed with cluster support off, a wrong password:
    /// no wait mends it), else [`Unavailable::NoShard`] (one did not
    /// answer, and may be the cluster's, back in a moment; or the cluster
    /// is settling).
    ///
    /// Boxed, as a pool's connect is (see `pool`): the vote's future is
    /// deep, every acquire on a Cluster node may await it, and callers'
    /// `Send` checks walked it to the compiler's recursion limit.
    pub(crate) fn refresh(&self) -> BoxFuture<'_, Result<()>> {
        self.vote(false).boxed()
    }

    /// [`ClusterMap::refresh`]; with `drain_late` (the poller), the nodes
    /// the vote did not wait for are then heard out, once the map is
    /// applied and the refresh's lock let go: their connections, still
    /// opening when the majority decided, are kept for the next poll
    /// rather than dropped and opened again every time.
    async fn vote(&self, drain_late: bool) -> Result<()> {
        let before = self.refreshes.load(Ordering::Acquire);
        let refreshing = self.refreshing.lock().await;
        if self.refreshes.load(Ordering::Acquire) != before {
            return Ok(()); // another caller's refresh just ended
        }
        let limit = self.settings.connect_timeout + self.settings.response_timeout;
        let mut asked = HashSet::new();
        let mut asks: FuturesUnordered<_> = self
            .contact_points()
            .into_iter()
            .filter(|info| asked.insert(super::addr_of(info)))
            .map(|info| tokio::time::timeout(limit, self.voters.ask(info, &self.settings)))
            .collect();
        self.voters.keep_only(&asked);
        let mut ballot = Ballot::default();
        let mut last_error = None;
        let mut refused_for_good = None;
        // Anything but a refusal for good, silence too: a seed that is down
        // may be the cluster's, back in a moment.
        let mut otherwise = false;
        while let Some(answer) = asks.next().await {
            match answer {
                Ok(Ok(answer)) if !answer.ranges.is_empty() => {
                    ballot.add(answer);
                    if ballot.decided() {
                        break;
                    }
                }
                Ok(Ok(_)) | Err(_) => otherwise = true,
                Ok(Err(err)) => {
                    let classified = Error::from_redis(&self.name, err.clone());
                    if classified.is_permanent() {
                        refused_for_good = Some(classified);
                    } else {
                        otherwise = true;
                        last_error = Some(err);
                    }
                }
            }
        }
        let ranges = ballot.tally();
        let outcome = if let Some(refusal) = self.unsupported_mode(ballot.version()) {
            // Not applied: every request asks again, and hears why.
            Err(refusal)
        } else if !ranges.is_empty() {
            self.apply(&ranges, ballot.version());
            self.refreshes.fetch_add(1, Ordering::AcqRel);
            Ok(())
        } else {
            match refused_for_good {
                Some(err) if !otherwise => Err(err),
                _ => Err(self.no_shard(last_error)),
            }
        };
        drop(refreshing);
        if drain_late {
            while asks.next().await.is_some() {}
        }
        outcome
    }

    /// Why the servers cannot serve this node's pub/sub mode, if they
    /// cannot: `On` where the oldest server that answered (`version`, its
    /// major) has no sharded pub/sub. A permanent error, before anything is
    /// sent: a release's `SPUBLISH` would fail after its script's `DEL`.
    fn unsupported_mode(&self, version: Option<u32>) -> Option<Error> {
        if self.mode != ShardedPubSub::On {
            return None;
        }
        let major = version.filter(|major| *major < SHARDED_PUBSUB_SINCE)?;
        Some(Error::invalid(format!(
            "{}: ShardedPubSub::On needs Redis {SHARDED_PUBSUB_SINCE} or later (SPUBLISH, \
             SSUBSCRIBE); the cluster runs Redis {major}: use Auto or Off",
            self.name
        )))
    }

    fn apply(&self, ranges: &[SlotRange], version: Option<u32>) {
        if self.mode == ShardedPubSub::Auto
            && let Some(major) = version
        {
            self.sharded
                .store(major >= SHARDED_PUBSUB_SINCE, Ordering::Relaxed);
            self.resolved.store(true, Ordering::Relaxed);
        }
        let mut view = self.view.write().unwrap();
        // Who served each slot before, by address: a failover moves a
        // slot to another server, a restart in place is its `run_id`'s.
        let old_owners = view.owners.clone();
        let old_addrs: Vec<String> = view.shards.iter().map(|s| s.addr.clone()).collect();
        let old_addr = |slot: usize| {
            let index = *old_owners.get(slot)?;
            old_addrs.get(usize::from(index)).map(String::as_str)
        };
        let mut owners = vec![UNSERVED; SLOTS];
        for range in ranges {
            let index = self.shard_index(&mut view, &range.host, range.port, Some(&range.id));
            for slot in range.first..=range.last.min(SLOTS as u16 - 1) {
                owners[usize::from(slot)] = index as u16;
            }
        }
        // Shards that serve nothing any more go (their connections close
        // with the last request on them); indexes are remapped.
        let serving: Vec<bool> = (0..view.shards.len())
            .map(|i| owners.contains(&(i as u16)))
            .collect();
        let mut remap = vec![UNSERVED; view.shards.len()];
        let mut kept = Vec::new();
        for (i, shard) in std::mem::take(&mut view.shards).into_iter().enumerate() {
            if serving[i] {
                remap[i] = kept.len() as u16;
                kept.push(shard);
            }
        }
        for owner in owners.iter_mut().filter(|o| **o != UNSERVED) {
            *owner = remap[usize::from(*owner)];
        }
        view.owners = owners;
        view.shards = kept;
        let changed = old_owners.len() == SLOTS
            && (0..SLOTS).any(|slot| {
                let now = owner(&view, slot).map(|s| s.addr.as_str());
                now.is_some() && now != old_addr(slot)
            });
        // The identity of the cluster as a whole, for the check that a
        // RedLock's nodes are independent: the node serving slot 0.
        if let Some(shard) = owner(&view, 0).filter(|s| !s.id.is_empty()) {
            self.identity.name_run_id(&shard.id);
        }
        drop(view);
        if changed {
            self.changed_hands();
        }
    }

    /// A slot changed hands: the new primary may lack the last writes of
    /// the old (fencing repairs), and the subscription moves.
    fn changed_hands(&self) {
        tracing::info!(node = %self.name, "a slot changed hands");
        self.identity.bump_generation();
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        self.switched.send_replace(epoch);
        crate::metrics::primary_switched(&self.name);
    }

    /// The index of the shard at `host:port`, made if new; `id` names it
    /// (an entry a `MOVED` made has none yet).
    fn shard_index(&self, view: &mut View, host: &str, port: u16, id: Option<&str>) -> usize {
        let addr = format!("{host}:{port}");
        if let Some(i) = view.shards.iter().position(|s| s.addr == addr) {
            if let Some(id) = id {
                id.clone_into(&mut view.shards[i].id);
            }
            return i;
        }
        let info = self.shard_info(&addr);
        // Opening a client does no I/O and cannot fail for a TCP address
        // (a root certificate was checked when the node was built).
        let client = super::open_client(info, self.settings.tls_root_cert.as_deref())
            .expect("a TCP connection info");
        let target = Arc::new(ShardTarget {
            client,
            map: self.me.clone(),
        });
        let server = Arc::new(ServerIdentity::within(addr.clone(), self.identity.clone()));
        let node = (self.shard_node)(addr.clone(), target, server, &self.settings);
        view.shards.push(Shard {
            addr,
            id: id.unwrap_or_default().to_owned(),
            node,
        });
        view.shards.len() - 1
    }

    fn shard_info(&self, addr: &str) -> ConnectionInfo {
        let (host, port) = split_addr(addr).unwrap_or_default();
        let addr = match self.tls {
            false => ConnectionAddr::Tcp(host, port),
            true => match self.template.addr() {
                ConnectionAddr::TcpTls {
                    insecure,
                    tls_params,
                    ..
                } => ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: *insecure,
                    tls_params: tls_params.clone(),
                },
                _ => ConnectionAddr::Tcp(host, port),
            },
        };
        self.template.clone().set_addr(addr)
    }
}

#[cfg(test)]
impl ClusterMap {
    /// How the shards are connected to, but for the address.
    pub(crate) fn template(&self) -> &ConnectionInfo {
        &self.template
    }
}

/// The shard serving `slot`, if any.
fn owner(view: &View, slot: usize) -> Option<&Shard> {
    let owner = *view.owners.get(slot)?;
    view.shards.get(usize::from(owner))
}

/// A Cluster node's part of a `NodeBuilder`.
#[derive(Clone, Default)]
pub(crate) struct ClusterSource {
    pub(crate) seed_urls: Vec<String>,
    pub(crate) sharded: ShardedPubSub,
}

impl std::fmt::Debug for ClusterSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self
            .seed_urls
            .iter()
            .map(|u| super::redact_url(u))
            .collect();
        f.debug_struct("ClusterSource")
            .field("seed_urls", &urls)
            .field("sharded", &self.sharded)
            .finish()
    }
}

impl ClusterSource {
    /// Validates the settings; the node's name and its map (the builder
    /// makes it the node's target). `shard_node` makes a shard's node.
    pub(crate) fn map(
        &self,
        settings: ShardSettings,
        shard_node: ShardNode,
    ) -> Result<(String, Arc<ClusterMap>)> {
        if self.seed_urls.is_empty() {
            return Err(Error::invalid("a Cluster node needs at least one seed URL"));
        }
        let seeds = self
            .seed_urls
            .iter()
            .map(|url| {
                let info = super::connection_info(url)?;
                Ok(info.set_tcp_settings(super::tcp_settings(settings.nodelay)))
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some(seed) = seeds
            .iter()
            .position(|info| info.redis_settings().db() != 0)
        {
            return Err(Error::invalid(format!(
                "a Cluster has one database (0): seed {} names another",
                super::redact_url(&self.seed_urls[seed])
            )));
        }
        let map = ClusterMap::new(seeds, self.sharded, settings, shard_node);
        Ok((map.name().to_owned(), map))
    }
}
