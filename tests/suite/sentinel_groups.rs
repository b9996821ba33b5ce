//! Sentinel nodes where replication matters: replica sync (`WAIT`) on the
//! group's primary, `lost()` when a failover loses the hold, fencing across
//! a failover, and Sentinel groups as the members of a RedLock and a
//! MultiLock. The single-node behaviour of a Sentinel node (locks, waits,
//! the switch itself) is `sentinel.rs`.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::sentinel::{SWITCH, sentinel_node, wait_until_lands_on};
use multilock::{Client, Error, Node, Unavailable};
use multilock_testkit::{GroupMember, SentinelGroup, TestServer};

/// Cuts the replicas off, so what the primary is sent next reaches none:
/// frozen (they cannot reconnect) and dropped by the primary (a frozen
/// replica's socket would still buffer the stream, and it would read it on
/// waking); `thaw_replicas` wakes them.
async fn freeze_replicas(group: &mut SentinelGroup, primary: usize) {
    for replica in (0..3).filter(|&i| i != primary) {
        group.pause(GroupMember::Data(replica)).await.unwrap();
    }
    let primary_url = group.data_nodes()[primary].url();
    let _: u64 = run(
        &primary_url,
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"),
    )
    .await
    .unwrap();
}

async fn thaw_replicas(group: &mut SentinelGroup, primary: usize) {
    for replica in (0..3).filter(|&i| i != primary) {
        group.unpause(GroupMember::Data(replica)).await.unwrap();
    }
}

/// Kills the primary while its replicas are frozen, so the last writes
/// die with it; returns the promoted replica.
async fn lossy_failover(group: &mut SentinelGroup, primary: usize) -> usize {
    group.kill(GroupMember::Data(primary)).await.unwrap();
    thaw_replicas(group, primary).await;
    group.wait_for_failover(primary).await.unwrap()
}

/// A lock with replica sync is granted only once both replicas hold it:
/// read on the replicas right after the grant, without polling.
#[tokio::test]
async fn replica_sync_waits_for_the_groups_replicas() {
    let group = SentinelGroup::start().await.unwrap();
    let node = sentinel_node(&group);
    let client = long_lease_client();
    let lock = client
        .lock(&node, "sentinel-sync")
        .unwrap()
        .with_replica_sync(2, Duration::from_secs(5))
        .unwrap();
    for round in 0..5 {
        let guard = lock.lock().await.unwrap();
        for replica in &group.data_nodes()[1..] {
            assert!(
                exists(&replica.url(), "sentinel-sync").await,
                "round {round}: granted before {} had the hold",
                replica.url()
            );
        }
        guard.unlock().await.unwrap();
    }
}

/// A failover that loses the hold (the replicas never got it) fires
/// `lost()` once a renewal reaches the new primary, long before the hold's
/// validity (30 s) would end it.
#[tokio::test]
async fn a_failover_that_loses_the_hold_fires_lost() {
    let mut group = SentinelGroup::start().await.unwrap();
    let node = sentinel_node(&group);
    let client = client_with_watchdog(Duration::from_secs(30));
    let lock = client.lock(&node, "sentinel-lost").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap(); // connected

    freeze_replicas(&mut group, 0).await;
    let guard = lock.lock().await.unwrap();
    let promoted = lossy_failover(&mut group, 0).await;
    let failed_over = Instant::now();
    assert!(!exists(&group.data_nodes()[promoted].url(), "sentinel-lost").await);
    tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("lost() fires once a renewal finds the hold gone");
    tracing::info!("lost() {:?} after the failover", failed_over.elapsed());
}

/// A failover that keeps the hold (`SENTINEL FAILOVER` waits for the
/// replica) keeps it renewed on the new primary: once the old primary is a
/// replica (its writes refused), renewals go on, `lost()` stays quiet and
/// the lease on the new primary is refreshed.
#[tokio::test]
async fn a_failover_that_keeps_the_hold_keeps_it_renewed() {
    let group = SentinelGroup::start().await.unwrap();
    let node = sentinel_node(&group);
    let client = client_with_watchdog(Duration::from_secs(3));
    let lock = client.lock(&node, "sentinel-kept").unwrap();
    let guard = lock.lock().await.unwrap();
    let promoted = group.failover().await.unwrap();
    let old_primary = group.data_nodes()[0].url();
    eventually(
        Duration::from_secs(40),
        |role: &String| format!("the old primary is still {role}"),
        || async {
            let info: String = run(&old_primary, redis::cmd("INFO").arg("replication"))
                .await
                .map_err(|e| e.to_string())?;
            match info.contains("role:slave") {
                true => Ok(()),
                false => Err("a primary".to_owned()),
            }
        },
    )
    .await;
    // Through several renewals (every second) after the demotion.
    let kept = tokio::time::timeout(Duration::from_secs(4), guard.lost()).await;
    assert!(kept.is_err(), "the hold was kept by the failover");
    let left = pttl(&group.data_nodes()[promoted].url(), "sentinel-kept").await;
    assert!(
        left > 1_500,
        "renewed on the new primary: {left} ms left of 3 s"
    );
    guard.unlock().await.unwrap();
}

/// A fenced lock's token keeps rising across a `SENTINEL FAILOVER` (the
/// counter was replicated), and the new primary serves the next grants.
#[tokio::test]
async fn fencing_tokens_rise_across_a_planned_failover() {
    let group = SentinelGroup::start().await.unwrap();
    let node = sentinel_node(&group);
    let client = long_lease_client();
    let lock = client
        .lock(&node, "sentinel-fenced")
        .unwrap()
        .with_fencing();
    let before = lock.lock().await.unwrap();
    let first = before.fencing_token().unwrap();
    before.unlock().await.unwrap();

    let promoted = group.failover().await.unwrap();
    let new_primary = group.data_nodes()[promoted].url();
    let guard = eventually(
        Duration::from_secs(20),
        |err: &String| format!("no fenced grant on the new primary: {err}"),
        || async {
            let guard = lock.lock().await.map_err(|e| e.to_string())?;
            let counter: Option<u64> = run(
                &new_primary,
                redis::cmd("GET").arg("redisson_lock_token:{sentinel-fenced}"),
            )
            .await
            .map_err(|e| e.to_string())?;
            match counter == guard.fencing_token() {
                true => Ok(guard),
                false => {
                    guard.unlock().await.map_err(|e| e.to_string())?;
                    Err(format!("granted elsewhere (counter there {counter:?})"))
                }
            }
        },
    )
    .await;
    let next = guard.fencing_token().unwrap();
    assert!(
        next > first,
        "token {next} after the failover, {first} before"
    );
    guard.unlock().await.unwrap();
}

/// A RedLock of three Sentinel groups (all monitored as "mymaster": the
/// nodes are still told apart) keeps its hold while one group loses its
/// primary with the hold, refuses a second client meanwhile, and serves it
/// once the holder lets go. A MultiLock of the same groups locks and
/// unlocks too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_red_lock_of_three_groups_survives_one_lossy_failover() {
    let mut groups = Vec::new();
    for _ in 0..3 {
        groups.push(SentinelGroup::start().await.unwrap());
    }
    let nodes: Vec<Node> = groups.iter().map(sentinel_node).collect();
    let holder = client_with_watchdog(Duration::from_secs(3));
    let red = holder.red_lock_on(&nodes, "sentinel-red").unwrap();
    red.lock().await.unwrap().unlock().await.unwrap(); // connected

    freeze_replicas(&mut groups[0], 0).await;
    let guard = red.lock().await.unwrap();
    assert_eq!(guard.nodes().len(), 3);
    lossy_failover(&mut groups[0], 0).await;

    let rival = Client::new();
    let rival_red = rival.red_lock_on(&nodes, "sentinel-red").unwrap();
    // Through several renewals (every second): the two intact groups keep
    // the majority.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        let attempt = rival_red.try_lock().await.unwrap();
        assert!(attempt.is_none(), "a second holder while the first holds");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lost = tokio::time::timeout(Duration::from_millis(10), guard.lost()).await;
    assert!(lost.is_err(), "the hold is kept by two of three groups");
    guard.unlock().await.unwrap();
    let rivals = rival_red
        .try_lock_for(Duration::from_secs(10), None)
        .await
        .unwrap()
        .expect("the lock is free once its holder let go");
    rivals.unlock().await.unwrap();

    let multi = holder.multi_lock_on(&nodes, "sentinel-multi").unwrap();
    let held = multi.lock().await.unwrap();
    assert_eq!(held.nodes().len(), 3);
    held.unlock().await.unwrap();
}

/// With passwords on the sentinels and the data nodes, a node given both
/// (the sentinels' in their URLs, the data nodes' by `password`) locks; one
/// missing either gets a typed error, and no error shows a password.
#[tokio::test]
async fn passwords_for_the_sentinels_and_the_data_nodes() {
    const PASSWORD: &str = "s3cret-pw";
    let group = SentinelGroup::start().await.unwrap();
    let with_password = |url: String| url.replace("redis://", &format!("redis://:{PASSWORD}@"));
    for data in group.data_nodes() {
        for (key, value) in [("masterauth", PASSWORD), ("requirepass", PASSWORD)] {
            let set = redis::cmd("CONFIG").arg("SET").arg(key).arg(value).clone();
            let _: () = run(&data.url(), &set).await.unwrap();
        }
    }
    for sentinel in group.sentinel_urls() {
        let commands = [
            redis::cmd("SENTINEL")
                .arg("SET")
                .arg(group.master_name())
                .arg("auth-pass")
                .arg(PASSWORD)
                .clone(),
            redis::cmd("SENTINEL")
                .arg("CONFIG")
                .arg("SET")
                .arg("sentinel-pass")
                .arg(PASSWORD)
                .clone(),
            // Sentinels take no `requirepass` at runtime; the default
            // user's password is the same thing.
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg("default")
                .arg("on")
                .arg("resetpass")
                .arg(format!(">{PASSWORD}"))
                .clone(),
        ];
        for command in &commands {
            let _: () = run(&sentinel, command).await.unwrap();
        }
    }
    let sentinels: Vec<String> = group
        .sentinel_urls()
        .into_iter()
        .map(with_password)
        .collect();
    let primary = with_password(group.data_nodes()[0].url());
    let build = |sentinels: Vec<String>, password: Option<&str>| {
        let builder = Node::sentinel(group.master_name(), sentinels)
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1));
        match password {
            Some(password) => builder.password(password).build().unwrap(),
            None => builder.build().unwrap(),
        }
    };
    let client = long_lease_client();

    let node = build(sentinels.clone(), Some(PASSWORD));
    let guard = client
        .lock(&node, "sentinel-auth")
        .unwrap()
        .lock()
        .await
        .unwrap();
    assert!(exists(&primary, "sentinel-auth").await);
    guard.unlock().await.unwrap();

    let no_data_password = build(sentinels, None);
    let lock = client.lock(&no_data_password, "sentinel-auth").unwrap();
    let err = lock.try_lock().await.unwrap_err();
    assert!(
        err.is_permanent(),
        "a refused password is for good: {err:?}"
    );
    let no_sentinel_password = build(group.sentinel_urls(), Some(PASSWORD));
    let lock = client.lock(&no_sentinel_password, "sentinel-auth").unwrap();
    let err2 = lock.try_lock().await.unwrap_err();
    assert!(
        matches!(
            err2,
            Error::NodeUnavailable {
                reason: Unavailable::NoPrimary,
                ..
            }
        ),
        "{err2:?}"
    );
    for shown in [format!("{err} {err:?}"), format!("{err2} {err2:?}")] {
        assert!(!shown.contains(PASSWORD), "{shown}");
    }
}

/// A node first used on a runtime that then shut down (taking the node's
/// poller with it) still follows a failover when used on another: the
/// poller starts again there.
#[test]
fn a_node_used_from_a_second_runtime_still_follows_failovers() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let (group, node) = runtime().block_on(async {
        let group = SentinelGroup::start().await.unwrap();
        let node = sentinel_node(&group);
        let lock = long_lease_client()
            .lock(&node, "sentinel-runtimes")
            .unwrap();
        lock.lock().await.unwrap().unlock().await.unwrap();
        (group, node)
    });
    runtime().block_on(async {
        let lock = long_lease_client()
            .lock(&node, "sentinel-runtimes")
            .unwrap();
        lock.lock().await.unwrap().unlock().await.unwrap();
        let promoted = group.failover().await.unwrap();
        let new_primary = group.data_nodes()[promoted].url();
        wait_until_lands_on(&lock, &new_primary, SWITCH).await;
    });
}
