//! Waiters ride through a failover, as Redisson's do. For every lock kind
//! (reentrant, fair, read, write) and every node kind (a standalone server
//! restarted in place, a Sentinel group's primary killed or failed over, a
//! Cluster shard's primary killed or failed over): waiters in `lock()`
//! and in `try_lock_for(30 s)`, behind holders with 8 s leases, are all
//! granted after the holders' release, one at a time where the kind is
//! exclusive, and none returns an error. Each scenario runs [`ROUNDS`]
//! times in a row on one deployment. Holds of every kind, replicated
//! before their primary is killed, are renewed on the new primary.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use multilock::{Client, Guard, Lock, Node};
use tokio::task::JoinHandle;

use crate::common::*;
use multilock_testkit::{TestServer, wait_replicated};

/// Runs of each scenario, in a row.
const ROUNDS: usize = 10;
/// The holders' lease: longer than a failover takes here, so the waiters
/// are granted by the holders' release, not by their leases running out.
const HOLDER_LEASE: Duration = Duration::from_secs(8);
/// The bounded waiters' wait.
const WAIT: Duration = Duration::from_secs(30);
/// Waiters per kind and way of waiting.
const WAITERS: usize = 2;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Reentrant,
    Fair,
    /// Readers waiting behind a writer.
    Read,
    /// A writer waiting behind a reader.
    Write,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Reentrant, Kind::Fair, Kind::Read, Kind::Write];

    /// The holder's lock and the waiters' lock of `name` on `node`.
    fn locks(self, holders: &Client, waiters: &Client, node: &Node, name: &str) -> (Lock, Lock) {
        match self {
            Kind::Reentrant => (
                holders.lock(node, name).unwrap(),
                waiters.lock(node, name).unwrap(),
            ),
            Kind::Fair => (
                holders.fair_lock(node, name).unwrap(),
                waiters.fair_lock(node, name).unwrap(),
            ),
            Kind::Read => (
                holders.read_write_lock(node, name).unwrap().write().clone(),
                waiters.read_write_lock(node, name).unwrap().read().clone(),
            ),
            Kind::Write => (
                holders.read_write_lock(node, name).unwrap().read().clone(),
                waiters.read_write_lock(node, name).unwrap().write().clone(),
            ),
        }
    }

    /// Waiters of this kind may hold together.
    fn shared(self) -> bool {
        matches!(self, Kind::Read)
    }

    /// Whether the waiters of `name` wait on the server at `url`: the
    /// fair queue holds them all, or a connection listens on the lock's
    /// channel (`sharded`: a Cluster's sharded pub/sub).
    async fn waiting(self, url: &str, name: &str, sharded: bool) -> Result<(), String> {
        if let Kind::Fair = self {
            let queue = format!("redisson_lock_queue:{{{name}}}");
            let queued: usize = run(url, redis::cmd("LLEN").arg(&queue)).await.unwrap();
            return match queued == 2 * WAITERS {
                true => Ok(()),
                false => Err(format!("{queued} waiters queued on {name}")),
            };
        }
        let channel = match self {
            Kind::Reentrant => format!("redisson_lock__channel:{{{name}}}"),
            _ => format!("redisson_rwlock:{{{name}}}"),
        };
        let sharded = sharded && has_sharded_pubsub(url).await;
        let numsub = if sharded { "SHARDNUMSUB" } else { "NUMSUB" };
        let (_, listeners): (String, u64) =
            run(url, redis::cmd("PUBSUB").arg(numsub).arg(&channel))
                .await
                .unwrap();
        match listeners > 0 {
            true => Ok(()),
            false => Err(format!("nobody listens on {channel}")),
        }
    }
}

/// Holders of one name per kind, and the waiters behind them.
struct Scene {
    names: Vec<(Kind, String)>,
    holders: Vec<Guard>,
    waiters: Vec<JoinHandle<Result<(), String>>>,
}

impl Scene {
    /// Takes `names` (one per kind, in [`Kind::ALL`]'s order) with 8 s
    /// leases, and starts the waiters behind them.
    async fn stage(node: &Node, names: [String; 4]) -> Scene {
        let (holder_client, waiter_client) = (Client::new(), client());
        let mut scene = Scene {
            names: Kind::ALL.into_iter().zip(names).collect(),
            holders: Vec::new(),
            waiters: Vec::new(),
        };
        for (kind, name) in &scene.names {
            let (holder, waiter) = kind.locks(&holder_client, &waiter_client, node, name);
            scene
                .holders
                .push(holder.lock_with_lease(HOLDER_LEASE).await.unwrap());
            let inside = Arc::new(AtomicUsize::new(0));
            for bounded in [false, true] {
                for _ in 0..WAITERS {
                    let what = format!("{kind:?} waiter of {name} (bounded: {bounded})");
                    let (lock, inside, kind) = (waiter.clone(), inside.clone(), *kind);
                    scene.waiters.push(tokio::spawn(async move {
                        let granted = match bounded {
                            false => lock.lock().await.map(Some),
                            true => lock.try_lock_for(WAIT, None).await,
                        };
                        let guard = granted
                            .map_err(|err| format!("{what}: {err}"))?
                            .ok_or_else(|| format!("{what}: not granted within {WAIT:?}"))?;
                        let beside = inside.fetch_add(1, Ordering::SeqCst);
                        // Held a moment, so a second holder would overlap.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        guard
                            .unlock()
                            .await
                            .map_err(|err| format!("{what}: unlock: {err}"))?;
                        match beside == 0 || kind.shared() {
                            true => Ok(()),
                            false => Err(format!("{what}: granted beside {beside} holders")),
                        }
                    }));
                }
            }
        }
        scene
    }

    /// Polls until every kind's waiters wait on one of the servers at
    /// `urls`: the primary, or for a Cluster also its replica, which serves
    /// `SSUBSCRIBE` and hears the primary's `SPUBLISH`: a subscription that
    /// followed a demoted primary stays there, and is still woken. A
    /// precondition, not the oracle (every waiter's grant after the fault
    /// is).
    async fn waiting(&self, urls: &[String], sharded: bool) {
        eventually(
            PATIENCE,
            |missing: &String| format!("the waiters are not waiting: {missing}"),
            || async {
                for (kind, name) in &self.names {
                    let mut missing = Vec::new();
                    for url in urls {
                        match kind.waiting(url, name, sharded).await {
                            Ok(()) => break,
                            Err(seen) => missing.push(format!("{seen} ({url})")),
                        }
                    }
                    if missing.len() == urls.len() {
                        return Err(missing.join("; "));
                    }
                }
                Ok(())
            },
        )
        .await;
    }

    /// Releases the holders (a hold the fault lost is not held: any
    /// outcome), then asserts that every waiter was granted, with no error.
    async fn finish(self, round: usize) {
        for holder in self.holders {
            if let Err(err) = holder.unlock().await {
                tracing::info!("round {round}: a holder's unlock: {err}");
            }
        }
        let mut failures = Vec::new();
        for waiter in self.waiters {
            match tokio::time::timeout(2 * WAIT, waiter).await {
                Ok(outcome) => failures.extend(outcome.unwrap().err()),
                Err(_) => failures.push(format!("a waiter still waits after {:?}", 2 * WAIT)),
            }
        }
        assert!(failures.is_empty(), "round {round}: {failures:#?}");
    }
}

/// Asserts that `replicas` replicas of the primary at `url` have every
/// write it took so far (the holds of `name` among them).
async fn replicated(url: &str, name: &str, replicas: u64) {
    let acknowledged = wait_replicated(url, name, replicas).await.unwrap();
    assert_eq!(acknowledged, replicas, "the holds reached the replicas");
}

/// Holds of every kind (reentrant, fair, a reader, a writer), renewed by
/// the watchdog.
struct Holds {
    held: Vec<(String, Guard)>,
}

impl Holds {
    async fn take(client: &Client, node: &Node, names: [String; 4]) -> Holds {
        let mut held = Vec::new();
        for (kind, name) in Kind::ALL.into_iter().zip(names) {
            let (_, lock) = kind.locks(client, client, node, &name);
            held.push((name, lock.lock().await.unwrap()));
        }
        Holds { held }
    }

    /// Polls until every hold was renewed on the server at `url` since
    /// `killed` (the old primary's death), while its guard stayed valid:
    /// its TTL there is above what a renewal before `killed` would leave.
    async fn renewed_on(&self, url: &str, killed: std::time::Instant) {
        for (name, guard) in &self.held {
            eventually(
                Duration::from_secs(20),
                |seen: &String| format!("{name} not renewed on {url}: {seen}"),
                || async {
                    let left = pttl(url, name).await;
                    let before_kill = HOLDS_WATCHDOG.saturating_sub(killed.elapsed());
                    let renewed = left > before_kill.as_millis() as i64 + 500;
                    match (guard.valid_until(), renewed) {
                        (None, _) => Err(format!("lost, {left} ms left")),
                        (Some(_), true) => Ok(()),
                        (Some(_), false) => {
                            Err(format!("{left} ms left, {before_kill:?} unrenewed"))
                        }
                    }
                },
            )
            .await;
        }
    }

    async fn unlock(self) {
        for (_, guard) in self.held {
            guard.unlock().await.unwrap();
        }
    }
}

/// The watchdog of [`Holds`]: longer than a failover takes here, so a hold
/// replicated before its primary died outlives the switch.
const HOLDS_WATCHDOG: Duration = Duration::from_secs(10);

/// Names for `round`, one per kind.
fn names(scenario: &str, round: usize) -> [String; 4] {
    Kind::ALL.map(|kind| format!("ride-{scenario}-{kind:?}-{round}"))
}

/// A standalone server restarted in place (the same port, empty) while
/// the waiters wait: the holders' keys are gone with it, the waiters are
/// granted once it is back.
#[tokio::test]
async fn waiters_ride_through_a_standalone_restart() {
    let mut server = server().await;
    let node = node_at(&server.url(), Duration::from_secs(2));
    for round in 0..ROUNDS {
        let scene = Scene::stage(&node, names("restart", round)).await;
        scene.waiting(&[server.url()], false).await;
        server.restart().await.unwrap();
        scene.finish(round).await;
    }
}

#[cfg(feature = "sentinel")]
mod sentinel {
    use super::*;
    use crate::sentinel::sentinel_node;
    use multilock_testkit::{GroupMember, SentinelGroup};

    /// How the primary goes away.
    #[derive(Clone, Copy)]
    enum Fault {
        Kill,
        Failover,
    }

    async fn rounds(fault: Fault) {
        init_tracing();
        let mut group = SentinelGroup::start().await.unwrap();
        let node = sentinel_node(&group);
        for round in 0..ROUNDS {
            let primary = group.primary().await.unwrap();
            let url = group.data_nodes()[primary].url();
            let scene = Scene::stage(&node, names("sentinel", round)).await;
            scene.waiting(std::slice::from_ref(&url), false).await;
            replicated(&url, &scene.names[0].1, 2).await;
            match fault {
                Fault::Kill => {
                    group.kill(GroupMember::Data(primary)).await.unwrap();
                    group.wait_for_failover(primary).await.unwrap();
                }
                Fault::Failover => {
                    group.failover().await.unwrap();
                }
            }
            scene.finish(round).await;
            if let Fault::Kill = fault {
                // The old primary back, as a replica of the new one.
                group.restart(GroupMember::Data(primary)).await.unwrap();
                let new = group.primary().await.unwrap();
                let port = group.data_nodes()[new].port();
                let replicaof = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(port).clone();
                run::<()>(&group.data_nodes()[primary].url(), &replicaof)
                    .await
                    .unwrap();
            }
            group.wait_until_healthy().await.unwrap();
        }
    }

    /// Holds of every kind, replicated, through a `kill -9` of their
    /// primary: renewed on the new one, valid, and released there.
    #[tokio::test]
    async fn holds_are_renewed_on_the_new_primary_after_a_kill() {
        init_tracing();
        let mut group = SentinelGroup::start().await.unwrap();
        let node = sentinel_node(&group);
        let client = client_with_watchdog(HOLDS_WATCHDOG);
        let holds = Holds::take(&client, &node, names("held-sentinel", 0)).await;
        let primary = group.primary().await.unwrap();
        let url = group.data_nodes()[primary].url();
        replicated(&url, &holds.held[0].0, 2).await;
        let killed = std::time::Instant::now();
        group.kill(GroupMember::Data(primary)).await.unwrap();
        let new = group.wait_for_failover(primary).await.unwrap();
        holds
            .renewed_on(&group.data_nodes()[new].url(), killed)
            .await;
        holds.unlock().await;
    }

    /// `kill -9` of the group's primary while the waiters wait.
    #[tokio::test]
    async fn waiters_ride_through_a_sentinel_primary_killed() {
        rounds(Fault::Kill).await;
    }

    /// `SENTINEL FAILOVER` while the waiters wait.
    #[tokio::test]
    async fn waiters_ride_through_a_sentinel_failover() {
        rounds(Fault::Failover).await;
    }
}

#[cfg(feature = "cluster")]
mod cluster {
    use super::*;
    use crate::cluster::{cluster, cluster_node};
    use multilock_testkit::RedisCluster;

    #[derive(Clone, Copy)]
    enum Fault {
        Kill,
        Failover,
    }

    /// Names for `round`, one per kind, all on the shard of the first.
    async fn names_on_one_shard(cluster: &RedisCluster, round: usize) -> ([String; 4], usize) {
        let [first, ..] = names("cluster", round);
        let shard = cluster.primary_for_key(&first).await.unwrap();
        let mut names = Vec::new();
        for kind in Kind::ALL {
            for i in 0.. {
                let name = format!("ride-cluster-{kind:?}-{round}-{i}");
                if cluster.primary_for_key(&name).await.unwrap() == shard {
                    names.push(name);
                    break;
                }
            }
        }
        (names.try_into().unwrap(), shard)
    }

    async fn rounds(fault: Fault) {
        let mut cluster = cluster().await;
        let node = cluster_node(&cluster);
        for round in 0..ROUNDS {
            let (names, primary) = names_on_one_shard(&cluster, round).await;
            let url = cluster.nodes()[primary].url();
            let scene = Scene::stage(&node, names).await;
            let replica = cluster.replica_of(primary).await.unwrap();
            let shard = [url.clone(), cluster.nodes()[replica].url()];
            scene.waiting(&shard, true).await;
            replicated(&url, &scene.names[0].1, 1).await;
            match fault {
                Fault::Kill => cluster.kill(primary).await.unwrap(),
                Fault::Failover => cluster.failover(replica).await.unwrap(),
            }
            scene.finish(round).await;
            if let Fault::Kill = fault {
                // Back as the new primary's replica.
                cluster.restart(primary).await.unwrap();
            }
            cluster.wait_until_healthy().await.unwrap();
        }
    }

    /// Holds of every kind, replicated, through a `kill -9` of their
    /// shard's primary: renewed on the new one, valid, and released there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn holds_are_renewed_on_the_new_primary_after_a_kill() {
        let mut cluster = cluster().await;
        let node = cluster_node(&cluster);
        let client = client_with_watchdog(HOLDS_WATCHDOG);
        let (names, primary) = names_on_one_shard(&cluster, 0).await;
        let first = names[0].clone();
        let holds = Holds::take(&client, &node, names).await;
        let url = cluster.nodes()[primary].url();
        replicated(&url, &holds.held[0].0, 1).await;
        let killed = std::time::Instant::now();
        cluster.kill(primary).await.unwrap();
        cluster.wait_until_healthy().await.unwrap();
        let new = cluster.primary_for_key(&first).await.unwrap();
        assert_ne!(new, primary);
        holds.renewed_on(&cluster.nodes()[new].url(), killed).await;
        holds.unlock().await;
    }

    /// `kill -9` of the waiters' shard's primary.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_ride_through_a_cluster_primary_killed() {
        rounds(Fault::Kill).await;
    }

    /// `CLUSTER FAILOVER` of the waiters' shard.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_ride_through_a_cluster_failover() {
        rounds(Fault::Failover).await;
    }
}
