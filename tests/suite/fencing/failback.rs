//! Failbacks on the deployments people run: a primary demoted, resynced
//! from a replica that missed its last seal, and promoted back is the same
//! process (its `run_id` unchanged) with a stale counter. Its new
//! replication ID tells: no client takes its counter as a witness, and a
//! repair read for the data before writes nothing after it.

#[cfg(any(feature = "cluster", feature = "sentinel"))]
use std::time::Duration;

use super::{counter, mark, replicaof, vouched, wait_synced};
#[cfg(any(feature = "cluster", feature = "sentinel"))]
use super::{counter_at, fenced, fenced_grant, try_counter};
#[cfg(feature = "cluster")]
use crate::cluster::{cluster, cluster_node};
use crate::common::*;
#[cfg(any(feature = "cluster", feature = "sentinel"))]
use multilock_testkit::TcpProxy;
#[cfg(feature = "sentinel")]
use multilock_testkit::{GroupMember, SentinelGroup};
use multilock_testkit::{TestServer, protocol};

/// Drops the primary at `url`'s links to its replicas (they reconnect
/// once they can).
#[cfg(any(feature = "cluster", feature = "sentinel"))]
async fn cut_replica_links(url: &str) {
    let kill = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .clone();
    let _: i64 = run(url, &kill).await.unwrap();
}

#[cfg(feature = "cluster")]
/// `key` read on the Cluster node at `url`, a replica too (`READONLY`).
async fn get_any(url: &str, key: &str) -> Option<u64> {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = redis::cmd("READONLY").query_async(&mut conn).await.unwrap();
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// The repair's guard on the wire: a repair names the data it read its
/// witnesses for, `<run_id>:<master_replid>`. After a failback (the same
/// process, a new replication ID) its write is refused; with the mark of
/// the data now, it is applied. (A guard that named the `run_id` alone let
/// a repair read before a failback vouch below a token sealed, and lost,
/// in between.)
#[tokio::test]
async fn a_repair_read_before_a_failback_writes_nothing() {
    let (server, other) = (server().await, server().await);
    let url = server.url();
    let (_, sealed, _): (i64, i64, u8) = eval(&url, protocol::raise_token("wire", 7)).await;
    assert_eq!(sealed, 7);
    let before = mark(&url).await;
    replicaof(&server, Some(&other)).await;
    wait_synced(&server, "wire", None).await;
    replicaof(&server, None).await;
    let after = mark(&url).await;
    assert_eq!(
        before.split(':').next(),
        after.split(':').next(),
        "same run"
    );
    assert_ne!(before, after, "a new replication ID");
    let read: String = eval(&url, protocol::server_mark("wire")).await;
    assert_eq!(read, after, "the mark a repair reads");

    let refused: (i64, i64, u8) = eval(&url, protocol::repair_token("wire", 9, &before)).await;
    assert_eq!(
        refused,
        (-2, 0, 0),
        "meant for the data before the failback"
    );
    assert_eq!(counter(&server, "wire").await, None, "nothing written");
    let applied: (i64, i64, u8) = eval(&url, protocol::repair_token("wire", 9, &after)).await;
    assert_eq!(applied, (-1, 9, 0), "meant for the data now");
    assert!(vouched(&url, "wire").await, "the repair vouched for it");
}

/// A Cluster node of a RedLock whose name's shard failed over: the new
/// primary's counter came with a vouch for the old primary's data, so it
/// is no witness, and the client repairs it in the background, with no
/// grant to prompt it. (The repair named the run it wrote for by the
/// node's `run_id`, which for a Cluster node is no shard's: refused on
/// every try, the node was never repaired.)
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_is_repaired_after_its_shard_failed_over() {
    const NAME: &str = "cluster-repair";
    let cluster = cluster().await;
    let servers = servers(2).await;
    let nodes = vec![cluster_node(&cluster), node(&servers[0]), node(&servers[1])];
    let red = fenced(&client(), &nodes, NAME);
    let token = fenced_grant(&red, PATIENCE, "all up").await;
    let primary = cluster
        .primary_for_key(protocol::token_key(NAME))
        .await
        .unwrap();
    let replica = cluster.replica_of(primary).await.unwrap();
    let url = cluster.nodes()[replica].url();
    cluster.failover(replica).await.unwrap();
    eventually(
        2 * PATIENCE,
        |seen: &(Option<u64>, bool)| {
            format!("the new primary's counter (of {token}), vouched: {seen:?}")
        },
        || async {
            let counter: Option<u64> = run(&url, redis::cmd("GET").arg(protocol::token_key(NAME)))
                .await
                .unwrap();
            let vouched = vouched(&url, NAME).await;
            if vouched && counter >= Some(token) {
                Ok(())
            } else {
                Err((counter, vouched))
            }
        },
    )
    .await;
    drop(red);
}

/// The failback through a real Sentinel group, node 0 of a RedLock of
/// three: the replicas are paused while the primary P takes a seal (they
/// miss it), then P is paused and the sentinels promote replica 1
/// (replica 2 has priority 0). P, resumed, is demoted and resyncs from
/// replica 1 (the stale counter, with the vouch P wrote); a `SENTINEL
/// FAILOVER` promotes P again. Node 1 dies: a new client must not take
/// P's stale counter as a witness.
#[cfg(feature = "sentinel")]
#[tokio::test]
async fn a_sentinel_failback_hands_out_no_token_twice() {
    const NAME: &str = "sentinel-failback";
    let mut group = SentinelGroup::start().await.unwrap();
    assert_eq!(group.primary().await.unwrap(), 0);
    let replica_priority = redis::cmd("CONFIG")
        .arg("SET")
        .arg("replica-priority")
        .arg(0)
        .clone();
    run::<()>(&group.data_nodes()[2].url(), &replica_priority)
        .await
        .unwrap();
    let mut others = servers(2).await;
    let proxy = TcpProxy::start(others[1].port()).await.unwrap();
    let sentinel_node = multilock::Node::sentinel(group.master_name(), group.sentinel_urls())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let nodes = vec![
        sentinel_node,
        node(&others[0]),
        node_at(&proxy.url(), Duration::from_millis(500)),
    ];
    let first = fenced(&client(), &nodes, NAME);
    let before = fenced_grant(&first, PATIENCE, "all up").await;
    for replica in [1, 2] {
        wait_synced(&group.data_nodes()[replica], NAME, Some(before)).await;
    }
    // The replicas miss the next seal: paused, their links cut.
    group.pause(GroupMember::Data(1)).await.unwrap();
    group.pause(GroupMember::Data(2)).await.unwrap();
    cut_replica_links(&group.data_nodes()[0].url()).await;
    proxy.black_hole();
    let sealed = fenced_grant(&first, PATIENCE, "node 2 cut off").await;
    assert_eq!(counter_at(&group.data_nodes()[0], NAME).await, sealed);
    let p_run = run_id(&group.data_nodes()[0].url()).await;

    // P is cut off; the sentinels promote replica 1.
    group.pause(GroupMember::Data(0)).await.unwrap();
    group.unpause(GroupMember::Data(1)).await.unwrap();
    group.unpause(GroupMember::Data(2)).await.unwrap();
    assert_eq!(group.wait_for_failover(0).await.unwrap(), 1);
    group.unpause(GroupMember::Data(0)).await.unwrap();
    // P is demoted and resyncs from replica 1: the stale counter. The
    // sentinels demote it with `CLIENT KILL TYPE normal`: a read they cut
    // is asked again.
    eventually(
        Duration::from_secs(60),
        |seen: &String| format!("P not resynced: {seen}"),
        || async {
            let url = group.data_nodes()[0].url();
            let read = async {
                let link = try_info_field(&url, "replication", "master_link_status").await?;
                Ok::<_, redis::RedisError>((link, try_counter(&url, NAME).await?))
            };
            match read.await {
                Ok((link, seen)) if link == "up" && seen == Some(before) => Ok(()),
                Ok((link, seen)) => Err(format!("link {link}, counter {seen:?}")),
                Err(err) => Err(format!("not read: {err}")),
            }
        },
    )
    .await;
    // Failback. The sentinels refuse while they have not yet seen P's
    // link up (they ask a replica every 10 s): asked again until done.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let back = loop {
        match group.failover().await {
            Ok(back) => break back,
            Err(err) if tokio::time::Instant::now() < deadline => {
                tracing::info!("failback not yet: {err}");
            }
            Err(err) => panic!("no failback within 90 s: {err}"),
        }
    };
    assert_eq!(back, 0, "P promoted back");
    assert_eq!(
        run_id(&group.data_nodes()[0].url()).await,
        p_run,
        "same process"
    );
    assert_eq!(counter(&group.data_nodes()[0], NAME).await, Some(before));

    others[0].kill().await.unwrap();
    proxy.restore();
    let newcomer = fenced(&client(), &nodes, NAME);
    let token = fenced_grant(&newcomer, 3 * PATIENCE, "node 1 dead, P failed back").await;
    assert!(token > sealed, "token {token} handed out after {sealed}");
    drop(first);
}

/// The failback on a Redis Cluster, node 0 of a RedLock of three: the
/// shard's replica misses a seal and takes over (`CLUSTER FAILOVER
/// TAKEOVER`, the primary paused); the old primary, resumed, becomes its
/// replica (the stale counter, with its own vouch), and a `CLUSTER
/// FAILOVER` makes it primary again. Node 1 dies: a new client must not
/// take its stale counter as a witness.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failback_hands_out_no_token_twice() {
    const NAME: &str = "cluster-failback";
    let mut cluster = cluster().await;
    let key = protocol::token_key(NAME);
    let p = cluster.primary_for_key(&key).await.unwrap();
    let r = cluster.replica_of(p).await.unwrap();
    let mut others = servers(2).await;
    let proxy = TcpProxy::start(others[1].port()).await.unwrap();
    let nodes = vec![
        cluster_node(&cluster),
        node(&others[0]),
        node_at(&proxy.url(), Duration::from_millis(500)),
    ];
    let first = fenced(&client(), &nodes, NAME);
    let before = fenced_grant(&first, PATIENCE, "all up").await;
    let (p_url, r_url) = (cluster.nodes()[p].url(), cluster.nodes()[r].url());
    eventually(
        PATIENCE,
        |seen: &Option<u64>| format!("the replica's counter is {seen:?}"),
        || async {
            let seen = get_any(&r_url, &key).await;
            if seen == Some(before) {
                Ok(())
            } else {
                Err(seen)
            }
        },
    )
    .await;
    // The replica misses the next seal: paused, its link cut.
    cluster.pause(r).await.unwrap();
    cut_replica_links(&p_url).await;
    proxy.black_hole();
    let sealed = fenced_grant(&first, PATIENCE, "node 2 cut off").await;
    let p_run = run_id(&p_url).await;

    // The replica takes over while the primary is paused.
    cluster.pause(p).await.unwrap();
    cluster.unpause(r).await.unwrap();
    let takeover = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("TAKEOVER")
        .clone();
    run::<()>(&r_url, &takeover).await.unwrap();
    eventually(
        Duration::from_secs(20),
        |role: &String| format!("the replica is still {role}"),
        || async {
            let role = info_field(&r_url, "replication", "role").await;
            if role == "master" { Ok(()) } else { Err(role) }
        },
    )
    .await;
    // The old primary rejoins as its replica: the stale counter.
    cluster.unpause(p).await.unwrap();
    eventually(
        Duration::from_secs(60),
        |seen: &String| format!("the old primary not resynced: {seen}"),
        || async {
            let link = info_field(&p_url, "replication", "master_link_status").await;
            let seen = get_any(&p_url, &key).await;
            if link == "up" && seen == Some(before) {
                Ok(())
            } else {
                Err(format!("link {link}, counter {seen:?}"))
            }
        },
    )
    .await;
    // Failback.
    cluster.failover(p).await.unwrap();
    assert_eq!(run_id(&p_url).await, p_run, "same process");

    others[0].kill().await.unwrap();
    proxy.restore();
    let newcomer = fenced(&client(), &nodes, NAME);
    let token = fenced_grant(&newcomer, 3 * PATIENCE, "node 1 dead, P failed back").await;
    assert!(token > sealed, "token {token} handed out after {sealed}");
    drop(first);
}
