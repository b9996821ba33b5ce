//! A Cluster node (`Node::cluster`) while its cluster changes under it: a
//! `CLUSTER FAILOVER` and a killed primary with a waiter waiting (the
//! holder's release reaches the new primary, the waiter's shard
//! subscription follows and wakes it), acquires in flight across both
//! (never counted twice, nothing left held).
//!
//! The steady-state behaviour of a Cluster node is `cluster.rs`; slot
//! migrations are `cluster_migration.rs`;
//! replication, fencing, external pub/sub clients and clusters as quorum
//! members are `cluster_groups.rs`.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use multilock::{Client, Lock, Node, Owner};
use multilock_testkit::{RedisCluster, key_slot};

use crate::cluster::{cluster, cluster_node, name_per_shard, wait_for_subscribers};
use crate::common::*;

/// How long a waiter may take to be granted once the holder released after
/// a change of primaries: its subscription may have to move first.
const WAKE: Duration = Duration::from_secs(10);

/// `name` on `node` for the explicit owner `owner`: holds and hold counts
/// that do not depend on which task asks.
pub(crate) fn owned(client: &Client, node: &Node, name: &str, owner: &str) -> Lock {
    client
        .lock(node, name)
        .unwrap()
        .with_owner(Owner::new(owner).unwrap())
}

/// Whether the replica at `url` has `key`: `READONLY`, then `EXISTS`, on
/// one connection (without `READONLY` a replica answers `MOVED`).
pub(crate) async fn on_replica(url: &str, key: &str) -> bool {
    let mut conn = raw(url).await;
    let mut pipe = redis::pipe();
    pipe.cmd("READONLY").ignore().cmd("EXISTS").arg(key);
    let (n,): (u64,) = tokio::time::timeout(Duration::from_secs(2), pipe.query_async(&mut conn))
        .await
        .unwrap_or_else(|_| panic!("EXISTS {key} on {url}: no reply"))
        .unwrap_or_else(|err| panic!("EXISTS {key} on {url}: {err}"));
    n == 1
}

/// A `CLUSTER FAILOVER` of the shard of a held lock while a waiter of
/// another owner waits: the holder's release goes to the new primary, the
/// waiter is woken (not by the lease: a minute), and its hold lives there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_while_a_waiter_waits() {
    let cluster = cluster().await;
    let node = cluster_node(&cluster);
    let client = client();
    let name = name_per_shard(&cluster).await.swap_remove(1);
    let primary = cluster.primary_for_key(&name).await.unwrap();
    let replica = cluster.replica_of(primary).await.unwrap();
    let holder = owned(&client, &node, &name, "holder");
    let guard = holder.lock_with_lease(LONG_LEASE).await.unwrap();
    let rival = owned(&client, &node, &name, "rival");
    let waiter = tokio::spawn({
        let rival = rival.clone();
        async move { rival.lock_with_lease(LONG_LEASE).await }
    });
    wait_for_subscribers(&cluster, &name).await;

    cluster.failover(replica).await.unwrap();
    cluster.wait_until_healthy().await.unwrap();
    assert_eq!(cluster.primary_for_key(&name).await.unwrap(), replica);
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    guard
        .unlock()
        .await
        .expect("the release reaches the new primary");
    let granted = tokio::time::timeout(WAKE, waiter)
        .await
        .expect("the waiter was woken after the failover")
        .unwrap()
        .unwrap();
    assert_eq!(rival.hold_count().await.unwrap(), 1);
    assert_eq!(holder.hold_count().await.unwrap(), 0);
    let new_primary = cluster.nodes()[replica].url();
    assert!(exists(&new_primary, &name).await, "held on the new primary");
    granted.unlock().await.unwrap();
    assert!(!exists(&new_primary, &name).await, "released there too");
}

/// A killed primary whose hold had reached its replica: once the replica
/// took over, the holder releases there and the waiter, whose subscription
/// died with the primary, is woken and granted, holding once: its wait
/// went on through the kill, with no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_while_a_waiter_waits() {
    let mut cluster = cluster().await;
    let node = cluster_node(&cluster);
    let client = client();
    let name = name_per_shard(&cluster).await.swap_remove(2);
    let primary = cluster.primary_for_key(&name).await.unwrap();
    let replica = cluster.replica_of(primary).await.unwrap();
    let replica_url = cluster.nodes()[replica].url();
    let holder = owned(&client, &node, &name, "holder");
    let guard = holder.lock_with_lease(LONG_LEASE).await.unwrap();
    // A kill loses what was not replicated: wait until it was.
    eventually(
        PATIENCE,
        |_: &()| format!("{name} never reached the replica {replica_url}"),
        || async {
            match on_replica(&replica_url, &name).await {
                true => Ok(()),
                false => Err(()),
            }
        },
    )
    .await;
    let rival = owned(&client, &node, &name, "rival");
    let waiting = rival.clone();
    let waiter = tokio::spawn(async move { waiting.lock_with_lease(LONG_LEASE).await });
    wait_for_subscribers(&cluster, &name).await;

    cluster.kill(primary).await.unwrap();
    cluster.wait_until_healthy().await.unwrap();
    assert_eq!(cluster.primary_for_key(&name).await.unwrap(), replica);
    // The node finds the new primary, where the hold is.
    eventually(
        WAKE,
        |seen: &String| format!("the holder's hold on the new primary: {seen}"),
        || async {
            match holder.hold_count().await {
                Ok(1) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    guard
        .unlock()
        .await
        .expect("the release reaches the new primary");
    let granted = tokio::time::timeout(WAKE, waiter)
        .await
        .expect("the waiter was woken after the kill")
        .unwrap()
        .expect("the wait goes on through the kill");
    assert_eq!(rival.hold_count().await.unwrap(), 1, "granted once");
    assert_eq!(holder.hold_count().await.unwrap(), 0);
    assert!(exists(&replica_url, &name).await, "held on the new primary");
    granted.unlock().await.unwrap();
    assert!(!exists(&replica_url, &name).await);
}

/// What the churning tasks of the in-flight test saw.
#[derive(Default)]
struct Churn {
    /// Grants, per task.
    grants: [AtomicU64; TASKS],
    /// Grants whose hold count was read back as 1.
    checked: AtomicU64,
    errors: AtomicU64,
    /// Grants whose owner held more than once (a request applied twice).
    miscounts: Mutex<Vec<String>>,
}

/// The lease of the churning tasks.
const CHURN_LEASE: Duration = Duration::from_secs(5);

/// How many tasks churn.
const TASKS: usize = 8;

impl Churn {
    fn grants(&self) -> Vec<u64> {
        self.grants
            .iter()
            .map(|g| g.load(Ordering::SeqCst))
            .collect()
    }

    /// Until every task has been granted again (its name is served again).
    async fn every_task_granted(&self, when: &str) {
        let before = self.grants();
        eventually(
            Duration::from_secs(30),
            |idle: &Vec<usize>| format!("{when}: tasks {idle:?} got no grant"),
            || async {
                let now = self.grants();
                let idle: Vec<usize> = (0..TASKS).filter(|&t| now[t] <= before[t]).collect();
                if idle.is_empty() { Ok(()) } else { Err(idle) }
            },
        )
        .await
    }
}

/// One churning task: acquire (a fresh owner each time, so a second
/// application of one acquire shows as a count of 2), read the count,
/// release, until `stop`; then one last acquire that must succeed.
async fn churn(base: Lock, task: usize, stop: Arc<AtomicBool>, churn: Arc<Churn>) {
    let mut attempt = 0;
    while !stop.load(Ordering::SeqCst) {
        attempt += 1;
        let owner = format!("task{task}-{attempt}");
        let lock = base.with_owner(Owner::new(&owner).unwrap());
        match lock
            .try_lock_for(Duration::from_secs(2), Some(CHURN_LEASE))
            .await
        {
            Ok(Some(guard)) => {
                churn.grants[task].fetch_add(1, Ordering::SeqCst);
                match lock.hold_count().await {
                    Ok(1) => {
                        churn.checked.fetch_add(1, Ordering::SeqCst);
                    }
                    // A kill can lose a grant the replica never got.
                    Ok(0) | Err(_) => {
                        churn.errors.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(n) => {
                        let seen = format!("{owner} holds {} {n} times", base.name());
                        churn.miscounts.lock().unwrap().push(seen);
                    }
                }
                if guard.unlock().await.is_err() {
                    churn.errors.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok(None) => {}
            Err(_) => {
                churn.errors.fetch_add(1, Ordering::SeqCst);
                // Back off while the cluster fails over.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let lock = base.with_owner(Owner::new(format!("task{task}-last")).unwrap());
    let guard = lock
        .try_lock_for(Duration::from_secs(20), Some(CHURN_LEASE))
        .await
        .unwrap_or_else(|err| panic!("task {task} after the failovers: {err}"))
        .unwrap_or_else(|| panic!("task {task}: {} never free again", base.name()));
    assert_eq!(lock.hold_count().await.unwrap(), 1, "task {task}");
    guard.unlock().await.unwrap();
}

/// `count` names, served by shards 0, 1, 2, 0, ... in turn at the start.
async fn names_across_shards(cluster: &RedisCluster, count: usize) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..count {
        let shard = i % 3;
        let name = (0..)
            .map(|n| format!("in-flight:{i}:{n}"))
            .find(|n| (shard * 5461..(shard + 1) * 5461).contains(&usize::from(key_slot(n))))
            .unwrap();
        assert_eq!(cluster.primary_for_key(&name).await.unwrap(), shard);
        names.push(name);
    }
    names
}

/// Eight tasks acquire and release (two per name, names on every shard)
/// through a `CLUSTER FAILOVER` of one shard and the kill of another's
/// primary: errors are allowed meanwhile, but no grant is ever counted
/// twice, every name is served again after each (every task granted), every
/// task can lock once more when stopped, and nothing stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_in_flight_during_a_failover_are_never_miscounted() {
    let mut cluster = cluster().await;
    let node = cluster_node(&cluster);
    let client = client();
    let names = names_across_shards(&cluster, 4).await;
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Churn::default());
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let base = client.lock(&node, &names[task % names.len()]).unwrap();
            tokio::spawn(churn(base, task, stop.clone(), stats.clone()))
        })
        .collect();
    stats.every_task_granted("before the failover").await;

    let (first, second) = (0, 1); // the shards of names[0] and names[1]
    let replica = cluster.replica_of(first).await.unwrap();
    cluster.failover(replica).await.unwrap();
    cluster.wait_until_healthy().await.unwrap();
    stats.every_task_granted("after the failover").await;
    assert_eq!(cluster.primary_for_key(&names[1]).await.unwrap(), second);
    cluster.kill(second).await.unwrap();
    cluster.wait_until_healthy().await.unwrap();
    stats.every_task_granted("after the kill").await;

    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    let miscounts = stats.miscounts.lock().unwrap().clone();
    assert!(miscounts.is_empty(), "grants counted twice: {miscounts:?}");
    let grants: u64 = stats.grants().iter().sum();
    let checked = stats.checked.load(Ordering::SeqCst);
    let errors = stats.errors.load(Ordering::SeqCst);
    tracing::info!(grants, checked, errors, "churned through the failovers");
    assert!(
        checked >= 3 * TASKS as u64,
        "only {checked} of {grants} grants checked"
    );
    for name in &names {
        let primary = cluster.primary_for_key(name).await.unwrap();
        let url = cluster.nodes()[primary].url();
        wait_absent(&url, name, PATIENCE, "every task released").await;
    }
}
