//! A Cluster node (`Node::cluster`) where more than one server matters:
//! clusters as the members of a RedLock and a MultiLock, replica sync
//! (`WAIT`) on a lock's shard, fencing tokens across a `CLUSTER FAILOVER`,
//! and sharded pub/sub shared with clients that are not ours (Redisson's
//! `SSUBSCRIBE` / `SPUBLISH` on `redisson_lock__channel:{name}`), and
//! `lost()` when a failover loses the hold (the replica never got it).
//!
//! The Sentinel equivalents are `sentinel_groups.rs`; failovers under held
//! locks are `cluster_failover.rs`, slot migrations `cluster_migration.rs`.

use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use multilock::{Client, Error, Node};
use multilock_testkit::RedisCluster;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::cluster::{cluster, cluster_node, name_per_shard, wait_for_subscribers};
use crate::cluster_failover::{on_replica, owned};
use crate::common::*;

/// The URL of the primary serving `name` now.
async fn primary_url(cluster: &RedisCluster, name: &str) -> String {
    cluster.nodes()[cluster.primary_for_key(name).await.unwrap()].url()
}

/// A RedLock over three clusters holds on each (the key on each cluster's
/// primary for the name), excludes a rival client until released, then
/// serves it; a MultiLock of the same clusters does the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_of_three_clusters() {
    let (a, b, c) = futures::join!(cluster(), cluster(), cluster());
    let clusters = [a, b, c];
    let nodes: Vec<Node> = clusters.iter().map(cluster_node).collect();
    let holder = long_lease_client();
    let rival = Client::new();
    for (kind, name) in [("red", "cluster-red"), ("multi", "cluster-multi")] {
        let (held, rivals) = match kind {
            "red" => (
                holder.red_lock_on(&nodes, name).unwrap().lock().await,
                rival.red_lock_on(&nodes, name).unwrap().try_lock().await,
            ),
            _ => (
                holder.multi_lock_on(&nodes, name).unwrap().lock().await,
                rival.multi_lock_on(&nodes, name).unwrap().try_lock().await,
            ),
        };
        let guard = held.unwrap();
        assert_eq!(guard.nodes().len(), 3, "{kind}: held on every cluster");
        for cluster in &clusters {
            let url = primary_url(cluster, name).await;
            assert!(exists(&url, name).await, "{kind}: {name} on {url}");
        }
        assert!(rivals.unwrap().is_none(), "{kind}: a rival got a held lock");
        guard.unlock().await.unwrap();
        for cluster in &clusters {
            let url = primary_url(cluster, name).await;
            assert!(!exists(&url, name).await, "{kind}: released on {url}");
        }
        let rivals = match kind {
            "red" => rival.red_lock_on(&nodes, name).unwrap().try_lock().await,
            _ => rival.multi_lock_on(&nodes, name).unwrap().try_lock().await,
        };
        let rivals = rivals.unwrap().expect("free once its holder let go");
        assert_eq!(rivals.nodes().len(), 3);
        rivals.unlock().await.unwrap();
    }
}

/// Calls of `WAIT` so far at `url`.
async fn wait_calls(url: &str) -> u64 {
    command_calls(url).await.get("wait").copied().unwrap_or(0)
}

/// With replica sync, each grant on a cluster node is acknowledged by the
/// replica of the name's primary (`WAIT` on the primary) before it is
/// returned: the key is there right after, read without polling. With that
/// replica frozen, the acquire fails with `ReplicaSync` and leaves the lock
/// free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_sync_on_a_cluster() {
    let mut cluster = cluster().await;
    let node = cluster_node(&cluster);
    let client = long_lease_client();
    for name in name_per_shard(&cluster).await {
        let primary = cluster.primary_for_key(&name).await.unwrap();
        let primary_url = cluster.nodes()[primary].url();
        let replica = cluster.nodes()[cluster.replica_of(primary).await.unwrap()].url();
        let lock = client
            .lock(&node, &name)
            .unwrap()
            .with_replica_sync(1, Duration::from_secs(1))
            .unwrap();
        let waits = wait_calls(&primary_url).await;
        for round in 0..3 {
            let guard = lock.lock().await.unwrap();
            assert!(
                on_replica(&replica, &name).await,
                "round {round}: granted before {replica} had {name}"
            );
            guard.unlock().await.unwrap();
        }
        let sent = wait_calls(&primary_url).await - waits;
        assert_eq!(sent, 3, "one WAIT per grant on {primary_url}");
    }

    let name = "cluster-sync-frozen";
    let primary = cluster.primary_for_key(name).await.unwrap();
    let replica = cluster.replica_of(primary).await.unwrap();
    let lock = client
        .lock(&node, name)
        .unwrap()
        .with_replica_sync(1, Duration::from_secs(1))
        .unwrap();
    cluster.pause(replica).await.unwrap();
    let refused = lock.try_lock().await;
    cluster.unpause(replica).await.unwrap();
    let err = refused.unwrap_err();
    assert!(
        matches!(
            err,
            Error::ReplicaSync {
                acknowledged: 0,
                ..
            }
        ),
        "{err:?}"
    );
    let url = cluster.nodes()[primary].url();
    assert!(!exists(&url, name).await, "the unsynced grant was released");
    cluster.wait_until_healthy().await.unwrap();
}

/// A fenced lock's token keeps rising across a `CLUSTER FAILOVER` of its
/// shard (the counter was replicated), and the new primary serves the next
/// grant: the counter there is the new token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_rise_across_a_cluster_failover() {
    let cluster = cluster().await;
    let node = cluster_node(&cluster);
    let client = long_lease_client();
    let name = "cluster-fenced";
    let token_key = format!("redisson_lock_token:{{{name}}}");
    let lock = client.lock(&node, name).unwrap().with_fencing();
    let mut first = 0;
    for _ in 0..3 {
        let before = lock.lock().await.unwrap();
        let token = before.fencing_token().unwrap();
        assert!(token > first, "token {token} after {first}");
        first = token;
        before.unlock().await.unwrap();
    }

    let primary = cluster.primary_for_key(name).await.unwrap();
    let replica = cluster.replica_of(primary).await.unwrap();
    cluster.failover(replica).await.unwrap();
    cluster.wait_until_healthy().await.unwrap();
    let new_primary = cluster.nodes()[replica].url();
    let guard = lock.lock().await.unwrap();
    let next = guard.fencing_token().unwrap();
    assert!(
        next > first,
        "token {next} after the failover, {first} before"
    );
    let counter: Option<u64> = run(&new_primary, redis::cmd("GET").arg(&token_key))
        .await
        .unwrap();
    assert_eq!(counter, Some(next), "granted on the new primary");
    assert!(exists(&new_primary, name).await);
    guard.unlock().await.unwrap();
}

/// The messages a plain RESP2 connection to `url` hears once it has sent
/// `SSUBSCRIBE channel`, as a Java client's would, each as its parts
/// (`["ssubscribe", channel, "1"]` first). It reads on a thread of its
/// own, which ends once the receiver is dropped.
fn ssubscribe_raw(url: &str, channel: &str) -> UnboundedReceiver<Vec<String>> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let client = redis::Client::open(url).unwrap();
    let command = redis::cmd("SSUBSCRIBE").arg(channel).get_packed_command();
    std::thread::spawn(move || {
        let mut conn = client.get_connection().unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        conn.send_packed_command(&command).unwrap();
        while !tx.is_closed() {
            let parts = match conn.recv_response() {
                Ok(redis::Value::Array(parts)) => parts,
                Ok(other) => panic!("not a pub/sub message: {other:?}"),
                Err(err) if err.is_timeout() => continue,
                Err(err) => panic!("the raw subscription broke: {err}"),
            };
            let text = |part: redis::Value| match part {
                redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                redis::Value::Int(n) => n.to_string(),
                other => format!("{other:?}"),
            };
            if tx.send(parts.into_iter().map(text).collect()).is_err() {
                break;
            }
        }
    });
    rx
}

/// Our sharded pub/sub and hash are Redisson's: Redisson's acquire, sent
/// raw, is refused while we hold; a foreign `SSUBSCRIBE` of the lock's
/// channel on its primary hears our release (`0`); and a foreign release
/// (the hash deleted, then `SPUBLISH` of `0`) wakes our waiter, long before
/// the foreign hold's minute would have run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_ssubscribe_client_hears_our_release() {
    let cluster = cluster().await;
    let node = cluster_node(&cluster);
    let client = client();
    let names = name_per_shard(&cluster).await;

    let name = &names[0];
    let channel = format!("redisson_lock__channel:{{{name}}}");
    let lock = client.lock(&node, name).unwrap();
    let guard = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    // Redisson's own acquire, sent as a Redisson client sends it, is
    // refused while we hold: it answers the lock's TTL, not nil (granted).
    let mut redisson = raw(&primary_url(&cluster, name).await).await;
    let refused: Option<i64> =
        multilock_testkit::redisson::acquire(name, "6f0c9a5e-redisson:1", LONG_LEASE)
            .invoke_async(&mut redisson)
            .await
            .unwrap();
    assert!(
        refused.is_some_and(|ttl| ttl > 0),
        "Redisson granted over our hold: {refused:?}"
    );
    let mut heard = ssubscribe_raw(&primary_url(&cluster, name).await, &channel);
    let confirmed = tokio::time::timeout(PATIENCE, heard.recv()).await;
    let confirmed = confirmed.expect("SSUBSCRIBE confirmed").unwrap();
    assert_eq!(confirmed, ["ssubscribe", channel.as_str(), "1"]);
    guard.unlock().await.unwrap();
    let message = tokio::time::timeout(PATIENCE, heard.recv()).await;
    let message = message.expect("the release was heard").unwrap();
    assert_eq!(message, ["smessage", channel.as_str(), "0"]);
    drop(heard);

    let name = &names[1];
    let channel = format!("redisson_lock__channel:{{{name}}}");
    let url = primary_url(&cluster, name).await;
    let foreign_field = "6f0c9a5e-redisson:1";
    let _: () = run(&url, redis::cmd("HSET").arg(name).arg(foreign_field).arg(1))
        .await
        .unwrap();
    let set: bool = run(&url, redis::cmd("PEXPIRE").arg(name).arg(60_000))
        .await
        .unwrap();
    assert!(set);
    let tried = script_calls(&url).await;
    // An explicit owner: the waiter reads its own hold count once granted.
    let lock = owned(&client, &node, name, "waiter");
    let waiter = tokio::spawn(async move {
        let guard = lock.lock_with_lease(LONG_LEASE).await?;
        let count = lock.hold_count().await?;
        Ok::<_, Error>((guard, count))
    });
    wait_for_subscribers(&cluster, name).await;
    eventually(
        PATIENCE,
        |calls: &u64| format!("{calls} lock requests at {url}: the waiter never tried"),
        || async {
            let calls = script_calls(&url).await - tried;
            if calls > 0 { Ok(()) } else { Err(calls) }
        },
    )
    .await;
    assert!(!waiter.is_finished(), "granted over a foreign hold");
    let _: u64 = run(&url, redis::cmd("DEL").arg(name)).await.unwrap();
    let receivers: u64 = run(&url, redis::cmd("SPUBLISH").arg(&channel).arg("0"))
        .await
        .unwrap();
    assert!(receivers >= 1, "our waiter listens on {channel}");
    let granted = tokio::time::timeout(PATIENCE, waiter).await;
    let (guard, count) = granted
        .expect("the foreign release woke the waiter")
        .unwrap()
        .unwrap();
    assert_eq!(count, 1);
    let fields: Vec<String> = run(&url, redis::cmd("HKEYS").arg(name)).await.unwrap();
    assert_eq!(fields.len(), 1, "{fields:?}");
    assert_ne!(fields[0], foreign_field);
    guard.unlock().await.unwrap();
    assert!(!exists(&url, name).await);
}

/// The next item of `stream` that `wanted` accepts, if one comes within
/// `limit`.
async fn next_within<S: Stream + Unpin>(
    stream: &mut S,
    limit: Duration,
    wanted: impl Fn(&S::Item) -> bool,
) -> Option<S::Item> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let item = tokio::time::timeout_at(deadline, stream.next())
            .await
            .ok()??;
        if wanted(&item) {
            return Some(item);
        }
    }
}

/// A killed primary whose replica never got the hold: the replica is
/// frozen and its link cut (`CLIENT KILL TYPE replica` on the primary: a
/// frozen replica's socket alone would still buffer the stream, and it
/// would read the hold on waking) before the grant, then the primary is
/// killed and the replica, woken, takes over without the key. `lost()`
/// fires; the watchdog's renewal reaches the new primary, finds the hold
/// gone, writes nothing and stops renewing it; a rival is granted at once
/// while the lost guard still lives, and the lost guard's unlock
/// (`NotHeld`) leaves the rival's hold alone.
///
/// The watchdog timeout (10 s) outlasts the failover (about 2.5 s) by far:
/// a hold that had reached the replica would still live there when it is
/// looked for, so its absence shows it was lost, not that it expired (with
/// a 2 s lease it would have expired either way, and the test could not
/// tell). It also means `lost()` fires from the renewals the dead primary
/// leaves unanswered or from the one that finds the hold gone, never from
/// a lease running out.
///
/// How it fails: a hold that reached the replica after all (the link cut
/// after the grant instead of before) is found on the new primary and keeps
/// the rival out; a renewal that recreated a missing hold (`HSET` or
/// `HINCRBY` where it should only `PEXPIRE` an existing field) writes the
/// key on the new primary (MONITOR shows the script's write, `EXISTS` the
/// key), is renewed again every tick and keeps the rival out; a watchdog
/// that took the answer "gone" for a failed renewal (the hold merely
/// unproven) renews it again a period later; one that never follows the
/// failover never renews on the new primary; and a lost guard whose unlock
/// released the field anyway would end the rival's hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lossy_cluster_failover_fires_lost() {
    const WATCHDOG_TIMEOUT: Duration = Duration::from_secs(10);
    let renewal_period = WATCHDOG_TIMEOUT / 3;
    let mut cluster = cluster().await;
    let node = cluster_node(&cluster);
    let client = client_with_watchdog(WATCHDOG_TIMEOUT);
    // Not on node 0, the node's seed.
    let name = name_per_shard(&cluster).await.swap_remove(1);
    let primary = cluster.primary_for_key(&name).await.unwrap();
    let replica = cluster.replica_of(primary).await.unwrap();
    let primary_url = cluster.nodes()[primary].url();
    let replica_url = cluster.nodes()[replica].url();
    let holder = owned(&client, &node, &name, "holder");
    holder.lock().await.unwrap().unlock().await.unwrap(); // connected

    // Cut the replica off, then take the lock: the hold reaches no replica.
    cluster.pause(replica).await.unwrap();
    let cut: u64 = run(
        &primary_url,
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"),
    )
    .await
    .unwrap();
    assert_eq!(cut, 1, "the primary dropped its replica's link");
    let guard = holder.lock().await.unwrap();
    let acquired = Instant::now();
    assert!(exists(&primary_url, &name).await, "held on the primary");
    cluster.kill(primary).await.unwrap();
    let killed = Instant::now();
    cluster.unpause(replica).await.unwrap();
    let mut watched = monitor(&replica_url).await;
    // The new primary is looked at as soon as the cluster is healthy again,
    // while `lost()` is awaited alongside.
    let (healthy, lost) = futures::join!(
        async {
            cluster.wait_until_healthy().await.unwrap();
            let healthy = killed.elapsed();
            assert_eq!(cluster.primary_for_key(&name).await.unwrap(), replica);
            assert!(
                !exists(&replica_url, &name).await,
                "the hold did not die with the primary: {name} is on the new primary {replica_url}"
            );
            let looked = acquired.elapsed();
            assert!(
                looked + Duration::from_secs(2) < WATCHDOG_TIMEOUT,
                "looked for the hold {looked:?} after the grant: too late to tell a lost hold from an expired one"
            );
            healthy
        },
        async {
            tokio::time::timeout(Duration::from_secs(20), guard.lost())
                .await
                .expect("lost() fires once the hold is gone");
            killed.elapsed()
        },
    );

    // The renewal on the new primary: its script reads the field (`HGET`),
    // finds it gone, and writes nothing.
    let renewal = next_within(&mut watched, Duration::from_secs(20), |line| {
        line.from_script && line.has_arg(&name)
    })
    .await
    .unwrap_or_else(|| panic!("no renewal of {name} reached the new primary"));
    assert_eq!(renewal.command(), "hget", "{renewal:?}");
    let renewed = killed.elapsed();
    // Through one and a half renewal periods: a hold found gone is renewed
    // no more (no script call on the name, nor a command run by one).
    let again = next_within(&mut watched, renewal_period * 3 / 2, |line| {
        let script = line.from_script || line.command().starts_with("eval");
        script && line.has_arg(&name)
    })
    .await;
    assert!(
        again.is_none(),
        "the watchdog went on with a hold found gone: {again:?}"
    );
    drop(watched);
    assert!(
        !exists(&replica_url, &name).await,
        "the renewal recreated the lost hold"
    );
    assert!(
        guard.nodes().is_empty(),
        "still held on {:?}",
        guard.nodes()
    );
    assert!(guard.valid_until().is_none());
    tracing::info!(?healthy, ?lost, ?renewed, "after the kill of the primary");

    // The lost guard still lives: a rival is granted at once.
    let rival = owned(&client, &node, &name, "rival");
    let rivals = rival
        .try_lock_for(PATIENCE, Some(LONG_LEASE))
        .await
        .unwrap()
        .expect("the lost lock is free for a rival");
    assert!(
        exists(&replica_url, &name).await,
        "granted on the new primary"
    );
    let err = guard.unlock().await.unwrap_err();
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
    assert_eq!(
        rival.hold_count().await.unwrap(),
        1,
        "the rival still holds"
    );
    assert_eq!(holder.hold_count().await.unwrap(), 0);
    rivals.unlock().await.unwrap();
    assert!(!exists(&replica_url, &name).await);
}
