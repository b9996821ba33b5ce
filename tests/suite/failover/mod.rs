//! Failover: what each lock type promises when Redis servers die, freeze,
//! restart empty or are cut off the network, proved on real servers in
//! Docker containers (the test kit's container backend).
//!
//! | scenario | lock | outcome asserted |
//! |---|---|---|
//! | (a) primary dies before its async replica got the grant; replica promoted | single node | two holders |
//! | (a′) same, with `with_replica_sync(1, ..)` | single node | link cut: the acquire is refused, one holder; link up: the replica has the key, the second client is refused |
//! | (b) 2 of 5 masters killed / paused during contention | RedLock | never two holders, still available |
//! | (c) 1 of 3 nodes paused | MultiLock | not acquired within its budget; acquired after unpause |
//! | (d) a node of a bare-majority holder restarts empty | RedLock (3) | two holders (the known limit); with the restart delayed past the lease, one |
//! | (e) the holder is cut off 3 of 5 masters | RedLock | the holder learns it lost the lock no later than another client acquires it, and that client acquires only after the holder's keys expired |
//! | (f) a holder stalls past its lease | fenced RedLock | its late write is rejected by a fenced store |
//!
//! Needs Docker and a Redis image: `redis:7`, or with no registry access
//! `bash docker/build-local-image.sh` and
//! `MULTILOCK_REDIS_IMAGE=multilock-redis:local`. Without them the tests
//! fail with a message saying so; they never skip.

mod cut_off;
mod restarts;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use multilock::{Client, Error, Node};
use multilock_testkit::{FencedStore, RedisContainer, ReplicatedPair, Side, TestServer};

use crate::common::{
    LONG_LEASE, PATIENCE, addr, client, client_with_watchdog, eventually, exists, init_tracing,
    node_at, run,
};

/// Per-request timeouts of every node: small against the leases below.
const NODE_TIMEOUT: Duration = Duration::from_millis(300);

fn nodes_of(servers: &[RedisContainer]) -> Vec<Node> {
    servers
        .iter()
        .map(|s| node_at(&s.url(), NODE_TIMEOUT))
        .collect()
}

async fn containers(n: usize) -> Vec<RedisContainer> {
    init_tracing();
    RedisContainer::start_many(n)
        .await
        .unwrap_or_else(|err| panic!("cannot start {n} Redis containers: {err}"))
}

async fn pair() -> ReplicatedPair {
    init_tracing();
    ReplicatedPair::start()
        .await
        .unwrap_or_else(|err| panic!("cannot start a primary and its replica: {err}"))
}

/// True when a bounded request got no reply: our bound or redis-rs's own
/// response timeout ran out first.
fn timed_out<T>(outcome: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>) -> bool {
    match outcome {
        Err(_) => true,
        Ok(Err(err)) => err.is_timeout(),
        Ok(Ok(_)) => false,
    }
}

/// The kit's faults, as the scenarios below rely on them: a pause and a
/// partition make requests time out (not fail at once), a heal resumes the
/// very connections that were open, a restart comes back empty at the same
/// address.
#[tokio::test]
async fn container_faults_look_to_clients_as_documented() {
    let mut servers = containers(1).await;
    let server = &mut servers[0];
    let url = server.url();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let set = redis::cmd("SET").arg("k").arg("v").clone();
    set.query_async::<()>(&mut conn).await.unwrap();
    let get = redis::cmd("GET").arg("k").clone();

    server.pause().await.unwrap();
    let frozen = tokio::time::timeout(
        Duration::from_millis(500),
        get.query_async::<String>(&mut conn),
    );
    assert!(timed_out(frozen.await), "a paused server must not answer");
    server.unpause().await.unwrap();
    assert_eq!(get.query_async::<String>(&mut conn).await.unwrap(), "v");

    server.partition().await.unwrap();
    let started = Instant::now();
    let cut = tokio::time::timeout(Duration::from_secs(1), get.query_async::<String>(&mut conn));
    assert!(timed_out(cut.await), "a partitioned server must not answer");
    let fresh = tokio::time::timeout(
        Duration::from_secs(1),
        redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection(),
    )
    .await;
    match fresh {
        Err(_) => {}
        Ok(Err(err)) => assert!(
            !err.is_connection_refusal(),
            "a partition drops packets, it does not refuse: {err}"
        ),
        Ok(Ok(_)) => panic!("connected to a partitioned server"),
    }
    assert!(started.elapsed() >= Duration::from_millis(900));
    server.heal().await.unwrap();
    assert_eq!(
        get.query_async::<String>(&mut conn).await.unwrap(),
        "v",
        "the connection open before the partition works again, data intact"
    );

    server.kill().await.unwrap();
    assert!(run::<String>(&url, &get).await.is_err());
    server.restart().await.unwrap();
    assert_eq!(server.url(), url, "same address after a restart");
    assert_eq!(
        run::<Option<String>>(&url, &get).await.unwrap(),
        None,
        "empty after a restart"
    );
    servers.pop().unwrap().rm().await.unwrap();
}

/// (a) The failure MultiLock and RedLock exist for: the grant is on the
/// primary only, the primary dies, the replica is promoted without it, and
/// a second client gets the same lock while the first one's lease runs.
#[tokio::test]
async fn async_replica_failover_hands_the_lock_to_a_second_holder() {
    let mut pair = pair().await;
    pair.cut_link().await.unwrap();

    let first = client();
    let on_primary = node_at(&pair.primary.url(), NODE_TIMEOUT);
    let held = first
        .lock(&on_primary, "orders")
        .unwrap()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    assert!(exists(&pair.primary.url(), "orders").await);
    assert!(
        !exists(&pair.replica.url(), "orders").await,
        "the cut link kept the grant off the replica"
    );

    pair.primary.kill().await.unwrap();
    pair.promote().await.unwrap();

    let second = client();
    let on_replica = node_at(&pair.replica.url(), NODE_TIMEOUT);
    let also_held = second
        .lock(&on_replica, "orders")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .expect("the promoted replica never saw the first grant");

    // Two holders: the first lease still runs and nothing told its holder.
    let now = Instant::now();
    assert!(now < held.valid_until().expect("fixed lease"));
    assert!(
        held.lost().now_or_never().is_none(),
        "the first holder was not told"
    );
    also_held.unlock().await.unwrap();
    drop(held); // its release goes to the dead primary, in the background
    pair.rm().await.unwrap();
}

/// (a′) With replica sync, a grant the replica did not acknowledge is
/// released and refused, so the failover above cannot make two holders.
#[tokio::test]
async fn replica_sync_refuses_a_grant_the_replica_did_not_get() {
    let mut pair = pair().await;
    pair.cut_link().await.unwrap();

    let first = client();
    let on_primary = node_at(&pair.primary.url(), NODE_TIMEOUT);
    let synced = first
        .lock(&on_primary, "orders")
        .unwrap()
        .with_replica_sync(1, Duration::from_millis(200))
        .unwrap();
    let started = Instant::now();
    let refused = synced
        .try_lock_for(Duration::ZERO, Some(LONG_LEASE))
        .await
        .expect_err("no replica acknowledged the grant");
    assert!(
        matches!(
            refused,
            Error::ReplicaSync {
                required: 1,
                acknowledged: 0,
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        !exists(&pair.primary.url(), "orders").await,
        "the refused grant was released"
    );

    pair.primary.kill().await.unwrap();
    pair.promote().await.unwrap();
    let second = client();
    let only = second
        .lock(&node_at(&pair.replica.url(), NODE_TIMEOUT), "orders")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .expect("free on the promoted replica");
    // One holder: the first client holds nothing.
    only.unlock().await.unwrap();
    pair.rm().await.unwrap();
}

/// (a′) With the link up, replica sync puts the grant on the replica
/// before the holder gets it: after the failover the lock is still taken.
#[tokio::test]
async fn replica_sync_with_the_link_up_survives_the_failover() {
    let mut pair = pair().await;
    let first = client();
    let held = first
        .lock(&node_at(&pair.primary.url(), NODE_TIMEOUT), "orders")
        .unwrap()
        .with_replica_sync(1, Duration::from_secs(2))
        .unwrap()
        .try_lock_for(Duration::ZERO, Some(LONG_LEASE))
        .await
        .unwrap()
        .expect("free, and the replica acknowledges");
    assert!(
        exists(&pair.replica.url(), "orders").await,
        "acknowledged means on the replica"
    );

    pair.primary.kill().await.unwrap();
    pair.promote().await.unwrap();
    let second = client()
        .lock(&node_at(&pair.replica.url(), NODE_TIMEOUT), "orders")
        .unwrap();
    assert!(second.try_lock().await.unwrap().is_none());
    assert!(
        second
            .try_lock_for(Duration::from_millis(500), None)
            .await
            .unwrap()
            .is_none(),
        "still the first client's after the failover"
    );
    drop(held);
    pair.rm().await.unwrap();
}

/// (b) Three clients, two tasks each, contend for a RedLock over five
/// masters while one master is killed and another paused. A flag set
/// inside the critical section and a read-then-write counter catch any
/// overlap; the lock stays available on the remaining three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn red_lock_keeps_one_holder_while_two_of_five_masters_fail() {
    const CLIENTS: usize = 3;
    const TASKS_PER_CLIENT: usize = 2;
    const LEASE: Duration = Duration::from_secs(3);
    const RUN: Duration = Duration::from_secs(10);

    let mut servers = containers(5).await;
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let counter = Arc::new(AtomicU64::new(0));
    let entries = Arc::new(AtomicU64::new(0));
    let entries_after_faults = Arc::new(AtomicU64::new(0));
    let empty_after_faults = Arc::new(AtomicU64::new(0));
    let faults_done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();

    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = client();
        let red = client.red_lock_on(&nodes_of(&servers), "ledger").unwrap();
        for _ in 0..TASKS_PER_CLIENT {
            let red = red.clone();
            let (inside, overlaps, counter, entries) = (
                inside.clone(),
                overlaps.clone(),
                counter.clone(),
                entries.clone(),
            );
            let (entries_after_faults, empty_after_faults, faults_done) = (
                entries_after_faults.clone(),
                empty_after_faults.clone(),
                faults_done.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while started.elapsed() < RUN {
                    let guard = match red.try_lock_for(Duration::from_secs(1), Some(LEASE)).await {
                        Ok(Some(guard)) => guard,
                        Ok(None) | Err(Error::NoQuorum(_)) => {
                            if faults_done.load(Ordering::SeqCst) {
                                empty_after_faults.fetch_add(1, Ordering::SeqCst);
                            }
                            continue;
                        }
                        Err(err) => panic!("unexpected error: {err}"),
                    };
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let value = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    counter.store(value + 1, Ordering::SeqCst);
                    entries.fetch_add(1, Ordering::SeqCst);
                    if faults_done.load(Ordering::SeqCst) {
                        entries_after_faults.fetch_add(1, Ordering::SeqCst);
                    }
                    assert!(
                        Instant::now() < guard.valid_until().unwrap(),
                        "the critical section outlived the lock's validity"
                    );
                    inside.store(false, Ordering::SeqCst);
                    // A quorum of the live nodes releases; the dead and the
                    // paused one may fail.
                    let _ = guard.unlock().await;
                }
            }));
        }
    }

    tokio::time::sleep(Duration::from_millis(1500)).await;
    servers[0].kill().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    servers[1].pause().await.unwrap();
    faults_done.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }

    let entries = entries.load(Ordering::SeqCst);
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(
        counter.load(Ordering::SeqCst),
        entries,
        "an overlap lost an increment"
    );
    assert!(entries > 10, "too little progress: {entries} entries");
    // The exclusion checks above covered the time with both faults in
    // place: the three remaining masters kept granting.
    let after_faults = entries_after_faults.load(Ordering::SeqCst);
    assert!(
        after_faults > 0,
        "no critical section with two masters down ({entries} in all; {} waits \
         came back empty since)",
        empty_after_faults.load(Ordering::SeqCst)
    );
    // With the contention over, the three must grant at once.
    let available = client()
        .red_lock_on(&nodes_of(&servers), "ledger")
        .unwrap()
        .try_lock_for(Duration::from_secs(5), Some(LEASE))
        .await
        .unwrap()
        .expect("three of five masters keep the lock available");
    assert_eq!(available.nodes().len(), 3);
    available.unlock().await.unwrap();
    servers[1].unpause().await.unwrap();
    for server in servers {
        server.rm().await.unwrap();
    }
}

/// (c) A MultiLock needs every node: one paused node makes the bounded
/// wait end empty-handed (or with the node's error) within its budget, and
/// the lock is available again once the node is back.
#[tokio::test]
async fn multi_lock_waits_out_its_budget_while_a_node_is_paused() {
    let mut servers = containers(3).await;
    let client = client();
    let multi = client
        .multi_lock_on(&nodes_of(&servers), "accounts")
        .unwrap();
    // Connections made first, so the acquires really reach the paused node.
    multi
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    servers[1].pause().await.unwrap();

    // Leases of a minute: what the paused node grants late can only be
    // gone by the time the lock is asked for again through its rollback.
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let outcome = multi.try_lock_for(wait, Some(LONG_LEASE)).await;
    let elapsed = started.elapsed();
    assert!(
        matches!(outcome, Ok(None) | Err(Error::NoQuorum(_))),
        "{outcome:?}"
    );
    // A round begun just before the deadline may take one per-node timeout
    // (500 ms) to fail and one more to roll back.
    assert!(
        elapsed < wait + Duration::from_millis(1500),
        "gave up after {elapsed:?}, budget {wait:?}"
    );

    servers[1].unpause().await.unwrap();
    // Another client: a grant left behind by the first one would re-enter
    // for its own owner, and hide.
    let guard = crate::common::client()
        .multi_lock_on(&nodes_of(&servers), "accounts")
        .unwrap()
        .try_lock_for(PATIENCE, Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("every node is back, and the late grants there were rolled back");
    assert_eq!(guard.nodes().len(), 3);
    guard.unlock().await.unwrap();
    for server in servers {
        server.rm().await.unwrap();
    }
}
