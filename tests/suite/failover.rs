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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use multilock::testkit::{FencedStore, RedisContainer, ReplicatedPair, Side, TestServer};
use multilock::{Client, Error, Node};

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

/// A RedLock over three fresh containers held by `client` on exactly the
/// first two (the third was paused while it acquired, and is clean again).
async fn bare_majority_holder(
    servers: &mut [RedisContainer],
    client: &Client,
    lease: Duration,
) -> multilock::Guard {
    let red = client.red_lock_on(&nodes_of(servers), "jobs").unwrap();
    // C is dead while the holder acquires, so it holds A and B only (a
    // slow C would grant late, and the guard would adopt it), then C comes
    // back empty.
    servers[2].kill().await.unwrap();
    let guard = red
        .try_lock_for(Duration::from_secs(3), Some(lease))
        .await
        .unwrap()
        .expect("two of three grant");
    servers[2].restart().await.unwrap();
    let expected: Vec<String> = servers[..2].iter().map(addr).collect();
    assert_eq!(guard.nodes(), expected);
    guard
}

/// (d) The restart limit of every Redlock: the holder has A and B, B comes
/// back empty, a second client takes B and C. Two holders.
#[tokio::test]
async fn red_lock_restart_without_persistence_makes_two_holders() {
    let mut servers = containers(3).await;
    let first = client();
    let held = bare_majority_holder(&mut servers, &first, LONG_LEASE).await;

    servers[1].restart().await.unwrap();
    let second = client();
    let also_held = second
        .red_lock_on(&nodes_of(&servers), "jobs")
        .unwrap()
        .try_lock_for(Duration::from_secs(3), Some(LONG_LEASE))
        .await
        .unwrap()
        .expect("B (empty) and C grant");
    assert_eq!(also_held.nodes().len(), 2);
    assert!(Instant::now() < held.valid_until().unwrap(), "two holders");
    also_held.unlock().await.unwrap();
    drop(held);
    for server in servers {
        server.rm().await.unwrap();
    }
}

/// (d) The remedy: a node kept down for longer than the longest lease
/// before it returns. The holder has A and B; A freezes, so the only
/// majority left to a second client is B (restarted empty) with C. B comes
/// back only after the first holder's validity, so the second client
/// acquires B and C only then.
#[tokio::test]
async fn red_lock_restart_delayed_past_the_lease_keeps_one_holder() {
    const LEASE: Duration = Duration::from_secs(3);
    let mut servers = containers(3).await;
    let first = client();
    let held = bare_majority_holder(&mut servers, &first, LEASE).await;
    let valid_until = held.valid_until().unwrap();
    let b_and_c: Vec<String> = servers[1..].iter().map(addr).collect();

    let second = client();
    let red = second.red_lock_on(&nodes_of(&servers), "jobs").unwrap();
    servers[0].pause().await.unwrap();
    servers[1].kill().await.unwrap();
    let killed_at = Instant::now();
    let mut restarted = servers.remove(1);
    let restart = tokio::spawn(async move {
        tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
        // B cannot grant anything before its restart begins.
        let begun = Instant::now();
        restarted.restart().await.unwrap();
        (restarted, begun)
    });

    let acquired_at = loop {
        match red
            .try_lock_for(Duration::from_millis(500), Some(LEASE))
            .await
        {
            Ok(Some(guard)) => {
                let at = Instant::now();
                assert_eq!(guard.nodes(), b_and_c, "the restarted B and C");
                let _ = guard.unlock().await;
                break at;
            }
            Ok(None) | Err(Error::NoQuorum(_)) => {}
            Err(err) => panic!("{err}"),
        }
        assert!(
            killed_at.elapsed() < LEASE * 4,
            "the second client never acquired"
        );
    };
    let (restarted, restart_begun) = restart.await.unwrap();
    assert!(
        acquired_at >= restart_begun.max(valid_until),
        "acquired before B's delayed return or the first holder's validity ended"
    );
    servers[0].unpause().await.unwrap();
    drop(held);
    servers.insert(1, restarted);
    for server in servers {
        server.rm().await.unwrap();
    }
}

/// Five two-sided masters; the holder reaches them through side A, the
/// other client through side B.
struct CutOff {
    servers: Vec<RedisContainer>,
}

impl CutOff {
    async fn start() -> CutOff {
        init_tracing();
        let servers = RedisContainer::start_many_two_sided(5)
            .await
            .unwrap_or_else(|err| panic!("cannot start 5 Redis containers: {err}"));
        CutOff { servers }
    }

    fn nodes(&self, side: Side) -> Vec<Node> {
        self.servers
            .iter()
            .map(|s| node_at(&s.url_from(side), NODE_TIMEOUT))
            .collect()
    }

    /// Cuts the holder's side of the first three servers; returns the
    /// latest instant their copies of `key` expire (read from the other
    /// side). A renewal the holder sent before the cut was delivered or
    /// dropped by the time the cut is made; one that still landed after
    /// the read would only make the key live longer than the value
    /// returned, which the callers take as a lower bound.
    async fn cut_holder_from_majority(&mut self, key: &str) -> Instant {
        for server in &mut self.servers[..3] {
            server.partition_side(Side::A).await.unwrap();
        }
        let mut latest = Instant::now();
        for server in &self.servers[..3] {
            let read_at = Instant::now();
            let pttl: i64 = run(&server.url_from(Side::B), redis::cmd("PTTL").arg(key))
                .await
                .unwrap();
            assert!(pttl > 0, "the holder's key must be there, with a TTL");
            latest = latest.max(read_at + Duration::from_millis(pttl as u64));
        }
        latest
    }

    /// Tries from side B until acquired; the instant it was.
    async fn acquire_from_other_side(&self, limit: Duration) -> Instant {
        let other = client();
        let red = other.red_lock_on(&self.nodes(Side::B), "ledger").unwrap();
        let started = Instant::now();
        loop {
            match red
                .try_lock_for(Duration::from_millis(500), Some(LONG_LEASE))
                .await
            {
                Ok(Some(guard)) => {
                    let at = Instant::now();
                    guard.unlock().await.unwrap();
                    return at;
                }
                Ok(None) | Err(Error::NoQuorum(_)) => {}
                Err(err) => panic!("{err}"),
            }
            assert!(started.elapsed() < limit, "the other side never acquired");
        }
    }

    async fn rm(self) {
        for server in self.servers {
            server.rm().await.unwrap();
        }
    }
}

/// Spawns a watcher that owns `guard` and records when `lost()` fired.
fn watch_lost(guard: multilock::Guard) -> tokio::task::JoinHandle<(Instant, multilock::Guard)> {
    tokio::spawn(async move {
        guard.lost().await;
        (Instant::now(), guard)
    })
}

/// (e) with a fixed lease: cut off three of five masters, the holder's
/// `lost()` fires when its lease is over, and the other side acquires
/// only after the holder's keys expired there.
#[tokio::test]
async fn red_lock_holder_cut_from_the_majority_with_a_lease_is_told_first() {
    const LEASE: Duration = Duration::from_secs(3);
    let mut cut = CutOff::start().await;
    let holder = client();
    let guard = holder
        .red_lock_on(&cut.nodes(Side::A), "ledger")
        .unwrap()
        .try_lock_for(Duration::from_secs(2), Some(LEASE))
        .await
        .unwrap()
        .expect("free");
    let valid_until = guard.valid_until().unwrap();
    let lost = watch_lost(guard);

    let expiry = cut.cut_holder_from_majority("ledger").await;
    let acquired_at = cut.acquire_from_other_side(LEASE * 4).await;
    let (lost_at, guard) = tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("lost() never fired")
        .unwrap();

    assert!(
        acquired_at >= valid_until,
        "acquired before the validity ended"
    );
    assert!(
        acquired_at + Duration::from_millis(50) >= expiry,
        "acquired before the holder's keys expired"
    );
    assert!(
        lost_at <= acquired_at,
        "the holder was told {:?} after the other client acquired",
        lost_at - acquired_at
    );
    drop(guard);
    cut.rm().await;
}

/// (e) under the watchdog: cut off three of five masters, renewal there
/// fails; the holder's `lost()` must fire before another client can hold
/// the lock, that is, no later than its keys expire on the cut-off
/// masters.
#[tokio::test]
async fn red_lock_holder_cut_from_the_majority_under_the_watchdog_is_told_first() {
    const WATCHDOG: Duration = Duration::from_millis(1500);
    let mut cut = CutOff::start().await;
    let holder = client_with_watchdog(WATCHDOG);
    let red = holder.red_lock_on(&cut.nodes(Side::A), "ledger").unwrap();
    // Connections made first: the per-node timeout is a tenth of the 1.5 s
    // watchdog, less than a first connection to a container may take.
    red.lock().await.unwrap().unlock().await.unwrap();
    let guard = red.lock().await.unwrap();
    // Every node holds (a node slower than the others is adopted late).
    eventually(
        PATIENCE,
        |held: &Vec<String>| format!("the holder holds only {held:?}"),
        || async {
            let held = guard.nodes();
            if held.len() == 5 { Ok(()) } else { Err(held) }
        },
    )
    .await;
    let lost = watch_lost(guard);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let partitioned_at = Instant::now();
    let expiry = cut.cut_holder_from_majority("ledger").await;
    let acquired_at = cut.acquire_from_other_side(WATCHDOG * 6).await;
    assert!(
        acquired_at + Duration::from_millis(50) >= expiry,
        "acquired before the holder's keys expired"
    );
    assert!(
        acquired_at - partitioned_at < WATCHDOG + Duration::from_secs(3),
        "the majority side should get the lock once the keys expired"
    );
    // Give a late lost() a moment, to say how late it was.
    let told = tokio::time::timeout(Duration::from_secs(3), lost).await;
    let (lost_at, guard) = match told {
        Ok(joined) => joined.unwrap(),
        Err(_) => panic!(
            "two holders: the other client acquired {:?} after the partition, and the \
             cut-off holder's lost() had still not fired 3 s later",
            acquired_at - partitioned_at
        ),
    };
    assert!(
        lost_at <= acquired_at,
        "two holders for {:?}: the cut-off holder was told after the other client acquired",
        lost_at - acquired_at
    );
    drop(guard);
    cut.rm().await;
}

/// (f) A holder stalls (GC, swap) past its lease; meanwhile another client
/// takes the lock and writes. The stale holder's late write carries an
/// older fencing token and the store rejects it.
#[tokio::test]
async fn fencing_rejects_the_late_write_of_a_holder_that_stalled_past_its_lease() {
    const LEASE: Duration = Duration::from_secs(1);
    let servers = containers(4).await;
    let (lock_servers, store) = servers.split_at(3);
    let store = FencedStore::new(store[0].url(), "doc");

    let first = client();
    let stale = first
        .red_lock_on(&nodes_of(lock_servers), "doc")
        .unwrap()
        .with_fencing()
        .try_lock_for(Duration::from_secs(2), Some(LEASE))
        .await
        .unwrap()
        .expect("free");
    let stale_token = stale.fencing_token().expect("fenced");

    // The stall: the holder does nothing for longer than its lease.
    tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
    assert!(Instant::now() > stale.valid_until().unwrap());

    let second = client();
    let current = second
        .red_lock_on(&nodes_of(lock_servers), "doc")
        .unwrap()
        .with_fencing()
        .try_lock_for(Duration::from_secs(2), Some(LONG_LEASE))
        .await
        .unwrap()
        .expect("the stalled holder's lease is over");
    let current_token = current.fencing_token().unwrap();
    assert!(current_token > stale_token);
    assert!(
        store
            .write(current_token, "written by the current holder")
            .await
            .unwrap()
    );

    // The stalled holder wakes up, believes it still holds, and writes.
    assert!(
        !store
            .write(stale_token, "written by the stale holder")
            .await
            .unwrap(),
        "the store must reject the older token"
    );
    assert_eq!(
        store.read().await.unwrap().as_deref(),
        Some("written by the current holder")
    );

    current.unlock().await.unwrap();
    drop(stale);
    for server in servers {
        server.rm().await.unwrap();
    }
}

/// One scenario written once against [`TestServer`], run on both backends:
/// a RedLock over three servers survives one killed and comes back whole
/// after the restart.
async fn red_lock_through_a_kill_and_restart<S: TestServer>() {
    let mut servers = S::start_many(3).await.expect("start servers");
    let nodes: Vec<Node> = servers
        .iter()
        .map(|s| node_at(&s.url(), NODE_TIMEOUT))
        .collect();
    let red = client().red_lock_on(&nodes, "either").unwrap();
    let lease = Some(Duration::from_secs(5));
    servers[0].kill().await.unwrap();
    assert!(!servers[0].is_running());
    let guard = red
        .try_lock_for(Duration::from_secs(3), lease)
        .await
        .unwrap()
        .expect("two of three");
    assert_eq!(guard.nodes().len(), 2);
    guard.unlock().await.unwrap();
    servers[0].restart().await.unwrap();
    assert!(servers[0].is_running());
    // The node that refused is skipped until its probe finds it back (the
    // probes back off to 2 s); then it grants again, in the round or just
    // after it (a late grant the guard adopts).
    let guard = eventually(
        Duration::from_secs(10),
        |held: &usize| format!("the restarted node never came back: {held} nodes"),
        || async {
            let guard = red
                .try_lock_for(Duration::from_secs(3), lease)
                .await
                .unwrap()
                .expect("a majority");
            tokio::time::sleep(Duration::from_millis(100)).await;
            let held = guard.nodes().len();
            if held == 3 { Ok(guard) } else { Err(held) }
        },
    )
    .await;
    guard.unlock().await.unwrap();
    for server in servers {
        server.rm().await.unwrap();
    }
}

#[tokio::test]
async fn the_same_scenario_runs_on_processes() {
    red_lock_through_a_kill_and_restart::<multilock::testkit::RedisProcess>().await;
}

#[tokio::test]
async fn the_same_scenario_runs_on_containers() {
    init_tracing();
    red_lock_through_a_kill_and_restart::<RedisContainer>().await;
}
