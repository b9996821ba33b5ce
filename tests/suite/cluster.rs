//! A node that is a Redis Cluster (`Node::cluster`), on a real cluster of
//! processes (3 primaries, 3 replicas): locking as on a plain node, on names
//! of every shard, with sharded pub/sub.

use std::collections::HashMap;
use std::time::Duration;

use multilock::{Error, Node, Owner, ShardedPubSub};
use multilock_testkit::{
    Delay, Direction, RedisCluster, RedisProcess, TcpProxy, TestServer, key_slot,
};

use crate::common::*;

/// The node's connect and reply timeouts.
pub(crate) const NODE_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) async fn cluster() -> RedisCluster {
    init_tracing();
    RedisCluster::start()
        .await
        .unwrap_or_else(|err| panic!("cannot start a cluster: {err}"))
}

/// A node of `cluster`, seeded with its first node only.
pub(crate) fn cluster_node(cluster: &RedisCluster) -> Node {
    Node::cluster([cluster.seed_urls()[0].clone()])
        .connect_timeout(NODE_TIMEOUT)
        .response_timeout(NODE_TIMEOUT)
        .build()
        .unwrap()
}

/// A lock name served by each of the 3 primaries at the start.
pub(crate) async fn name_per_shard(cluster: &RedisCluster) -> Vec<String> {
    let mut names = Vec::new();
    for shard in 0..3 {
        let name = (0..)
            .map(|i| format!("orders:{i}"))
            .find(|n| (shard * 5461..(shard + 1) * 5461).contains(&usize::from(key_slot(n))))
            .unwrap();
        assert_eq!(cluster.primary_for_key(&name).await.unwrap(), shard);
        names.push(name);
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_reenter_and_wake_waiters_on_every_shard() {
    let cluster = cluster().await;
    let node = cluster_node(&cluster);
    let client = client();
    for name in name_per_shard(&cluster).await {
        // One owner for both acquires: the second re-enters the first.
        let lock = client
            .lock(&node, &name)
            .unwrap()
            .with_owner(Owner::new("job").unwrap());
        let guard = lock.lock_with_lease(LONG_LEASE).await.unwrap();
        let primary = cluster.primary_for_key(&name).await.unwrap();
        assert!(
            exists(&cluster.nodes()[primary].url(), &name).await,
            "{name} on its primary"
        );
        let again = lock.lock_with_lease(LONG_LEASE).await.unwrap();
        assert_eq!(lock.hold_count().await.unwrap(), 2);
        drop(again);
        // A waiter of another owner is woken by the release, long before
        // the lease would free it.
        let rival = client.lock(&node, &name).unwrap();
        let waiter = tokio::spawn(async move { rival.lock_with_lease(LONG_LEASE).await });
        wait_for_subscribers(&cluster, &name).await;
        guard.unlock().await.unwrap();
        let granted = tokio::time::timeout(PATIENCE, waiter).await;
        let rival_guard = granted.expect("the waiter was woken").unwrap().unwrap();
        rival_guard.unlock().await.unwrap();
    }
}

/// Until a client holds a shard subscription to `name`'s channel on its
/// primary (a classic one on Redis 6.2).
pub(crate) async fn wait_for_subscribers(cluster: &RedisCluster, name: &str) {
    let url = cluster.nodes()[cluster.primary_for_key(name).await.unwrap()].url();
    let channel = format!("redisson_lock__channel:{{{name}}}");
    let count = match has_sharded_pubsub(&url).await {
        true => "SHARDNUMSUB",
        false => "NUMSUB",
    };
    eventually(
        PATIENCE,
        |n: &i64| format!("{n} subscribers ({count}) on {channel}"),
        || async {
            let reply: Vec<redis::Value> = run(&url, redis::cmd("PUBSUB").arg(count).arg(&channel))
                .await
                .map_err(|_| 0)?;
            match reply.get(1) {
                Some(redis::Value::Int(n)) if *n > 0 => Ok(()),
                _ => Err(0),
            }
        },
    )
    .await;
}

/// One cluster behind two `Node` handles (seeded at different nodes) is
/// one RedLock master, not two: refused once both have named it, and at
/// every round after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cluster_under_two_handles_is_not_two_masters() {
    let cluster = cluster().await;
    let servers = servers(1).await;
    let seeds = cluster.seed_urls();
    let other_seed = Node::cluster([seeds[seeds.len() - 1].clone()])
        .connect_timeout(NODE_TIMEOUT)
        .response_timeout(NODE_TIMEOUT)
        .build()
        .unwrap();
    let nodes = vec![cluster_node(&cluster), other_seed, node(&servers[0])];
    let red = long_lease_client().red_lock_on(&nodes, "aliased").unwrap();
    for round in 0..3 {
        // The first rounds connect; from then on the cluster is known.
        let refused = eventually(
            PATIENCE,
            |outcome: &String| format!("round {round}: never refused: {outcome}"),
            || async {
                match red.try_lock().await {
                    Err(Error::InvalidArgument(msg)) => Ok(msg),
                    Ok(Some(guard)) => {
                        guard.unlock().await.unwrap();
                        Err("granted".to_owned())
                    }
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        assert!(refused.contains("one server"), "{refused}");
    }
}

#[tokio::test]
async fn a_name_whose_keys_span_slots_is_refused_when_built() {
    let node = Node::cluster(["redis://127.0.0.1:1"]).build().unwrap();
    let client = client();
    let err = client.lock(&node, "a{b").unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(client.lock(&node, "a{b}c").is_ok());
    assert!(client.lock(&node, "plain").is_ok());
    // A plain node takes any name, as Redisson does.
    let plain = Node::new("redis://127.0.0.1:1").unwrap();
    assert!(client.lock(&plain, "a{b").is_ok());
    assert!(
        Node::cluster(Vec::<String>::new()).build().is_err(),
        "no seed"
    );
}

/// A Cluster node whose seed is a standalone server (cluster support off),
/// or refuses its password, is a mistake no wait mends: `lock()` and a
/// long `try_lock_for` end at once with a permanent error naming the node,
/// as on a plain node with the same mistake. (On 88e8a7e both kept
/// retrying `NoShard` every 100 ms, forever.)
#[tokio::test]
async fn a_cluster_node_seeded_with_a_standalone_server_fails_for_good() {
    let server = server().await;
    let guarded = RedisProcess::start_with_args(|_| vec!["--requirepass".into(), "right".into()])
        .await
        .unwrap();
    let wrong_password = format!("redis://:wrong@127.0.0.1:{}", guarded.port());
    for seed in [server.url(), wrong_password] {
        let node = Node::cluster([seed.clone()])
            .connect_timeout(NODE_TIMEOUT)
            .response_timeout(NODE_TIMEOUT)
            .build()
            .unwrap();
        let lock = client().lock(&node, "misconfigured").unwrap();
        let err = tokio::time::timeout(Duration::from_secs(10), lock.lock())
            .await
            .unwrap_or_else(|_| panic!("{seed}: lock() ended its wait"))
            .unwrap_err();
        assert!(err.is_permanent(), "{seed}: {err:?}");
        assert!(err.to_string().contains("cluster/"), "{err}");
        assert!(!format!("{err} {err:?}").contains("wrong"), "{err:?}");
        let bounded = tokio::time::timeout(
            Duration::from_secs(10),
            lock.try_lock_for(Duration::from_secs(60), None),
        )
        .await
        .unwrap_or_else(|_| panic!("{seed}: try_lock_for() ended its 60 s wait"));
        assert!(
            matches!(&bounded, Err(err) if err.is_permanent()),
            "{bounded:?}"
        );
        let red = client().red_lock_on(&[node], "misconfigured").unwrap();
        let err = tokio::time::timeout(Duration::from_secs(10), red.lock())
            .await
            .unwrap_or_else(|_| panic!("{seed}: a RedLock's lock() ended its wait"))
            .unwrap_err();
        assert!(err.is_permanent(), "{seed}: {err:?}");
    }
}

/// A Cluster node seeded with one bad seed (a standalone server) and one of
/// the cluster's: while the whole cluster is down, the bad seed's refusal is
/// not the verdict (the silent seed may be back in a moment), and waits go
/// on until it is. (Found by audit: a node built meanwhile ended `lock()`
/// with the bad seed's permanent error.)
#[tokio::test]
async fn a_cluster_down_for_a_moment_beside_a_bad_seed_is_waited_out() {
    let standalone = server().await;
    let mut cluster = cluster().await;
    let seeds = [standalone.url(), cluster.seed_urls()[0].clone()];
    let build = || {
        Node::cluster(seeds.clone())
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .build()
            .unwrap()
    };
    // Healthy: the bad seed is harmless, the lock works.
    let red = client().red_lock_on(&[build()], "bad-seed").unwrap();
    red.lock().await.unwrap().unlock().await.unwrap();
    // The whole cluster goes down for a moment.
    for i in 0..6 {
        cluster.kill(i).await.unwrap();
    }
    let fresh_red = client().red_lock_on(&[build()], "bad-seed").unwrap();
    // `cluster|slots` (Redis 7+), or all of CLUSTER on 6.2, which has no
    // per-subcommand stats (the bad seed is asked for nothing else).
    let slots_asked = |calls: HashMap<String, u64>| {
        let slots = calls.get("cluster|slots").or_else(|| calls.get("cluster"));
        slots.copied().unwrap_or(0)
    };
    let asked_before = slots_asked(command_calls(&standalone.url()).await);
    let fresh_waiter = tokio::spawn(async move { fresh_red.lock().await.map(drop) });
    let known_waiter = tokio::spawn(async move { red.lock().await.map(drop) });
    // The fresh node's refreshes ask the bad seed, again and again.
    eventually(
        Duration::from_secs(10),
        |asked: &u64| format!("the bad seed was asked for the slot map {asked} times"),
        || async {
            let asked = slots_asked(command_calls(&standalone.url()).await) - asked_before;
            if asked >= 3 { Ok(()) } else { Err(asked) }
        },
    )
    .await;
    assert!(!fresh_waiter.is_finished(), "{:?}", fresh_waiter.await);
    assert!(!known_waiter.is_finished(), "{:?}", known_waiter.await);
    for i in 0..6 {
        cluster.restart(i).await.unwrap();
    }
    cluster.wait_until_healthy().await.unwrap();
    for waiter in [fresh_waiter, known_waiter] {
        let outcome = tokio::time::timeout(Duration::from_secs(20), waiter).await;
        assert!(matches!(outcome, Ok(Ok(Ok(())))), "{outcome:?}");
    }
}

/// A Cluster has one database: a seed URL naming another is refused when
/// the node is built (a shard would refuse its `SELECT` on every
/// connection). (On 88e8a7e it was built, and `lock()` never returned.)
#[test]
fn a_cluster_seed_with_a_database_number_is_refused_when_built() {
    let err = Node::cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001/2"])
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(msg) if msg.contains("database")),
        "{err:?}"
    );
    let err = Node::cluster(["redis://:s3cret@127.0.0.1:7001/1"])
        .build()
        .unwrap_err();
    assert!(!format!("{err} {err:?}").contains("s3cret"), "{err:?}");
    for url in ["redis://127.0.0.1:7000/0", "redis://127.0.0.1:7000"] {
        assert!(Node::cluster([url]).build().is_ok(), "{url}");
    }
}

/// Holds on every shard, renewed by one client's watchdog: its batches go
/// one slot each (a script spanning slots would be refused with CROSSSLOT,
/// and every hold of that batch would expire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_renews_holds_on_every_shard() {
    const RENEWED: Duration = Duration::from_secs(2);
    let cluster = cluster().await;
    let node = cluster_node(&cluster);
    let client = client_with_watchdog(RENEWED);
    let names = name_per_shard(&cluster).await;
    let mut guards = Vec::new();
    for name in &names {
        guards.push(client.lock(&node, name).unwrap().lock().await.unwrap());
    }
    // Through more than three leases: without renewal the keys expire and
    // `lost()` fires.
    {
        let lost = futures::future::select_all(guards.iter().map(|g| Box::pin(g.lost())));
        let kept = tokio::time::timeout(3 * RENEWED + RENEWED / 2, lost).await;
        assert!(kept.is_err(), "a hold was lost: its renewal failed");
    }
    for name in &names {
        let primary = cluster.primary_for_key(name).await.unwrap();
        let url = cluster.nodes()[primary].url();
        let left: i64 = run(&url, redis::cmd("PTTL").arg(name)).await.unwrap();
        assert!(left > 0, "{name} renewed: PTTL {left}");
    }
    for guard in guards {
        guard.unlock().await.unwrap();
    }
}

/// `ShardedPubSub`: Auto (on Redis 7+) and On publish with `SPUBLISH` and
/// wait with `SSUBSCRIBE`; Off keeps the classic, cluster-wide kind, as
/// Auto does on Redis 6.2 (where On is not tried). Each way, a waiter is
/// woken by the release (the holder's lease is long).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pubsub_mode_publishes_its_way_and_wakes_waiters() {
    let cluster = cluster().await;
    let client = client();
    let has_sharded = has_sharded_pubsub(&cluster.seed_urls()[0]).await;
    for (mode, sharded) in [
        (ShardedPubSub::Auto, has_sharded),
        (ShardedPubSub::On, true),
        (ShardedPubSub::Off, false),
    ] {
        if sharded && !has_sharded {
            continue;
        }
        let node = Node::cluster(cluster.seed_urls())
            .sharded_pubsub(mode)
            .connect_timeout(NODE_TIMEOUT)
            .response_timeout(NODE_TIMEOUT)
            .build()
            .unwrap();
        let name = format!("modes:{mode:?}");
        let url = cluster.nodes()[cluster.primary_for_key(&name).await.unwrap()].url();
        let before = command_calls(&url).await;
        let guard = client
            .lock(&node, &name)
            .unwrap()
            .lock_with_lease(LONG_LEASE)
            .await
            .unwrap();
        let rival = client.lock(&node, &name).unwrap();
        let waiter = tokio::spawn(async move { rival.lock_with_lease(LONG_LEASE).await });
        let channel = format!("redisson_lock__channel:{{{name}}}");
        eventually(
            PATIENCE,
            |n: &i64| format!("{mode:?}: {n} subscribers of {channel}"),
            || async {
                let count = if sharded { "SHARDNUMSUB" } else { "NUMSUB" };
                let listed: Vec<redis::Value> =
                    run(&url, redis::cmd("PUBSUB").arg(count).arg(&channel))
                        .await
                        .map_err(|_| -1)?;
                match listed.get(1) {
                    Some(redis::Value::Int(n)) if *n > 0 => Ok(()),
                    Some(redis::Value::Int(n)) => Err(*n),
                    _ => Err(-1),
                }
            },
        )
        .await;
        guard.unlock().await.unwrap();
        let woken = tokio::time::timeout(PATIENCE, waiter).await;
        let won = woken.expect("the waiter was woken").unwrap().unwrap();
        won.unlock().await.unwrap();
        let after = command_calls(&url).await;
        let delta = |cmd: &str| after.get(cmd).unwrap_or(&0) - before.get(cmd).unwrap_or(&0);
        match sharded {
            true => assert!(delta("spublish") >= 2 && delta("publish") == 0, "{mode:?}"),
            false => assert!(delta("publish") >= 2 && delta("spublish") == 0, "{mode:?}"),
        }
    }
}

/// `ShardedPubSub::On` where the servers have no sharded pub/sub (Redis
/// 6.2): a clear, permanent error at the first request, and nothing
/// written. Without it the lock would be granted, and its release's
/// `SPUBLISH` would fail after the script's `DEL`: an unlock reported
/// failed that released, and waiters that never hear of it. On Redis 7+
/// there is nothing to refuse (On is checked by the test above); CI runs
/// the `cluster::` tests on Redis 6.2 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_pubsub_on_is_refused_by_servers_without_it() {
    let cluster = cluster().await;
    if has_sharded_pubsub(&cluster.seed_urls()[0]).await {
        return;
    }
    let node = Node::cluster(cluster.seed_urls())
        .sharded_pubsub(ShardedPubSub::On)
        .connect_timeout(NODE_TIMEOUT)
        .response_timeout(NODE_TIMEOUT)
        .build()
        .unwrap();
    let name = "modes:refused";
    let lock = client().lock(&node, name).unwrap();
    let waited = tokio::time::timeout(PATIENCE, lock.lock_with_lease(LONG_LEASE))
        .await
        .expect("a permanent error ends the wait at once");
    let err = waited.expect_err("On needs Redis 7");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.is_permanent(), "{err}");
    assert!(err.to_string().contains("Redis 7"), "{err}");
    let primary = cluster.primary_for_key(name).await.unwrap();
    assert!(!exists(&cluster.nodes()[primary].url(), name).await);
}

/// Connections the cluster's nodes accepted so far (`INFO stats`).
async fn connections_accepted(cluster: &RedisCluster) -> u64 {
    let mut total = 0;
    for node in cluster.nodes() {
        let accepted = info_field(&node.url(), "stats", "total_connections_received").await;
        total += accepted.parse::<u64>().unwrap();
    }
    total
}

/// The slot map is asked for about once a second, of every node known:
/// an idle client keeps one connection to each for that, rather than
/// opening one per node per poll (9 polls × 6 nodes in 10 s before). The
/// replicas among the seeds are slow to reach (a proxy, 150 ms each way):
/// the primaries decide each vote before a connection to a replica is
/// open, and that connection is kept all the same (before, it was dropped
/// with the vote and opened again on every poll, as under CI's load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_client_polls_the_map_on_connections_it_keeps() {
    let cluster = cluster().await;
    let slow = Delay::fixed(Duration::from_millis(150));
    let mut proxies = Vec::new();
    for replica in &cluster.nodes()[3..] {
        let proxy = TcpProxy::start(replica.port()).await.unwrap();
        proxy.set_delay(Direction::Both, slow);
        proxies.push(proxy);
    }
    let mut seeds = cluster.seed_urls()[..3].to_vec();
    seeds.extend(proxies.iter().map(TcpProxy::url));
    let node = Node::cluster(seeds).build().unwrap();
    let client = client();
    let lock = client.lock(&node, "idle").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    // Two polls, so that every connection a poll keeps is open.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before = connections_accepted(&cluster).await;
    tokio::time::sleep(Duration::from_secs(5)).await; // about 5 polls
    // The count's own connections (one per node) are the only new ones.
    let opened = connections_accepted(&cluster).await - before - 6;
    assert!(
        opened <= 2,
        "{opened} connections opened by an idle client in 5 s"
    );
}
