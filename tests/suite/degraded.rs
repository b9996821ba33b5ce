//! Degraded mode: a minority of masters frozen, black-holed or dead costs a
//! RedLock little. A node that timed out is skipped until it answers again,
//! a round returns at quorum, late grants are adopted or rolled back,
//! nothing piles up on a frozen node's connection, `lost()` follows the
//! quorum, and errors name every node.

use std::time::{Duration, Instant};

use crate::common::*;
use multilock::{Error, FailureCause, Health, Node, RedLock, Unavailable};
use multilock_testkit::{RedisProcess, TestServer};

const NAME: &str = "degraded";

fn nodes(servers: &[RedisProcess]) -> Vec<Node> {
    servers.iter().map(node).collect()
}

/// The servers' nodes, with `timeout` to connect and for each reply.
fn nodes_at(servers: &[RedisProcess], timeout: Duration) -> Vec<Node> {
    servers.iter().map(|s| node_at(&s.url(), timeout)).collect()
}

/// A RedLock of `long_lease_client()` whose per-node timeout is `timeout`.
fn red_lock(nodes: &[Node], timeout: Duration) -> RedLock {
    long_lease_client()
        .red_lock_on(nodes, NAME)
        .unwrap()
        .with_node_timeout(timeout)
        .unwrap()
}

/// One lock+unlock under another name: connections made, scripts loaded.
async fn warm(nodes: &[Node]) {
    let warm = long_lease_client().red_lock_on(nodes, "warm-up").unwrap();
    warm.lock().await.unwrap().unlock().await.unwrap();
}

/// The first round pays the frozen node's timeout and makes it suspect;
/// the next rounds skip it at no cost; once it resumes (and its probe sees
/// it), it is used again.
#[tokio::test]
async fn a_frozen_node_is_skipped_and_used_again_after_it_resumes() {
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    warm(&nodes).await;
    let red = red_lock(&nodes, Duration::from_millis(500));
    servers[4].pause().await.unwrap();
    let first = red.lock_with_lease(LONG_LEASE).await.unwrap();
    first.unlock().await.unwrap();
    // Its request is overdue soon after the round returned without it.
    eventually(
        PATIENCE,
        |health: &Health| format!("the frozen node is {health:?}"),
        || async {
            match nodes[4].health() {
                Health::Suspect { .. } => Ok(()),
                health => Err(health),
            }
        },
    )
    .await;
    let started = Instant::now();
    for _ in 0..20 {
        let guard = red.lock_with_lease(LONG_LEASE).await.unwrap();
        assert!(!guard.nodes().contains(&addr(&servers[4])));
        guard.unlock().await.unwrap();
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(500 * 2),
        "20 rounds skipped the frozen node instead of paying its 500 ms timeout each: {took:?}"
    );
    servers[4].unpause().await.unwrap();
    wait_healthy(&nodes[4]).await;
    let guard = red.lock_with_lease(LONG_LEASE).await.unwrap();
    eventually(
        PATIENCE,
        |held: &Vec<String>| format!("the resumed node is not used again: {held:?}"),
        || async {
            let held = guard.nodes();
            if held.contains(&addr(&servers[4])) {
                Ok(())
            } else {
                Err(held)
            }
        },
    )
    .await;
    guard.unlock().await.unwrap();
    for s in &servers {
        wait_absent(&s.url(), NAME, PATIENCE, "released everywhere").await;
    }
}

/// A frozen node that the quorum needs (a MultiLock's) is cut off at the
/// lock's per-node timeout, not its connection's much longer response
/// timeout: the round ends, names it as timed out, and makes it suspect.
#[tokio::test]
async fn the_node_timeout_cuts_off_a_frozen_node_the_quorum_needs() {
    let mut servers = servers(3).await;
    let nodes = nodes_at(&servers, Duration::from_secs(20));
    warm(&nodes).await;
    let client = long_lease_client();
    let locks = nodes
        .iter()
        .map(|node| client.lock(node, NAME).unwrap())
        .collect();
    let multi = client
        .multi_lock(locks)
        .unwrap()
        .with_node_timeout(Duration::from_millis(300))
        .unwrap();
    servers[2].pause().await.unwrap();
    let started = Instant::now();
    let outcome = multi.try_lock_for(Duration::ZERO, Some(LONG_LEASE)).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the round waited for the frozen node's 20 s response timeout: {took:?}"
    );
    let Err(Error::NoQuorum(q)) = outcome else {
        panic!("expected NoQuorum, got {outcome:?}");
    };
    let frozen = q
        .failures
        .iter()
        .find(|f| f.node == addr(&servers[2]))
        .unwrap_or_else(|| panic!("the frozen node is named: {q}"));
    assert!(
        matches!(
            frozen.cause,
            FailureCause::Failed(Error::NodeUnavailable {
                reason: Unavailable::Timeout,
                ..
            })
        ),
        "{q}"
    );
    assert!(
        matches!(nodes[2].health(), Health::Suspect { .. }),
        "{:?}",
        nodes[2].health()
    );
    servers[2].unpause().await.unwrap();
    for s in &servers {
        wait_absent(&s.url(), NAME, PATIENCE, "the grants rolled back").await;
    }
}

/// A node that answers after the round returned (slower than the others,
/// within its timeout): its grant is adopted by the guard, and released
/// with it. The lease is a minute: only the release can clear the key.
#[tokio::test]
async fn a_late_grant_is_adopted_and_released_with_the_guard() {
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    warm(&nodes).await;
    let red = red_lock(&nodes, Duration::from_secs(3));
    servers[4].pause().await.unwrap();
    let acquiring = tokio::spawn(async move { red.lock_with_lease(LONG_LEASE).await });
    // The four live nodes grant, and the round returns without node 4.
    let guard = tokio::time::timeout(Duration::from_secs(2), acquiring)
        .await
        .expect("the round returned at quorum, not after node 4's 3 s timeout")
        .unwrap()
        .unwrap();
    assert!(!guard.nodes().contains(&addr(&servers[4])));
    servers[4].unpause().await.unwrap();
    eventually(
        PATIENCE,
        |held: &Vec<String>| format!("the late grant was not adopted: {held:?}"),
        || async {
            let held = guard.nodes();
            if held.contains(&addr(&servers[4])) {
                Ok(())
            } else {
                Err(held)
            }
        },
    )
    .await;
    assert!(exists(&servers[4].url(), NAME).await);
    guard.unlock().await.unwrap();
    for s in &servers {
        wait_absent(
            &s.url(),
            NAME,
            PATIENCE,
            "released with the guard, late part included",
        )
        .await;
    }
}

/// The same late grant, for a guard already released when it arrives: it
/// is rolled back, not left behind for its minute-long lease.
#[tokio::test]
async fn a_late_grant_for_a_released_guard_is_rolled_back() {
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    warm(&nodes).await;
    let red = red_lock(&nodes, Duration::from_secs(3));
    servers[4].pause().await.unwrap();
    let guard = red.lock_with_lease(LONG_LEASE).await.unwrap();
    guard.unlock().await.unwrap();
    servers[4].unpause().await.unwrap();
    // Node 4 now applies the acquire queued on its connection.
    for s in &servers {
        wait_absent(&s.url(), NAME, PATIENCE, "the late grant was rolled back").await;
    }
}

/// 1,000 acquires while a node is frozen: the node costs one timeout, and
/// its connection does not fill up with requests that would all be
/// answered (a flood of late grants) when it thaws.
#[tokio::test]
async fn nothing_piles_up_on_a_frozen_node() {
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    warm(&nodes).await;
    let before = command_calls(&servers[4].url()).await;
    let red = red_lock(&nodes, Duration::from_millis(300));
    servers[4].pause().await.unwrap();
    let started = Instant::now();
    for _ in 0..1000 {
        red.lock_with_lease(LONG_LEASE)
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
    }
    let took = started.elapsed();
    servers[4].unpause().await.unwrap();
    wait_healthy(&nodes[4]).await;
    let sent = delta(&before, &command_calls(&servers[4].url()).await);
    let scripts = sent.get("evalsha").copied().unwrap_or(0);
    // A handful of acquires reach it before it is overdue (each rolled back
    // when it thaws), not one per round.
    assert!(
        scripts <= 40,
        "the frozen node received {scripts} script calls for 1,000 acquires: {sent:?}"
    );
    assert!(
        took < Duration::from_secs(60),
        "1,000 acquires took {took:?}"
    );
    for s in &servers {
        wait_absent(&s.url(), NAME, PATIENCE, "no key left").await;
    }
}

/// Under the watchdog, `lost()` fires within a renewal period once a quorum
/// of nodes refuses (here: killed), not a watchdog timeout later.
#[tokio::test]
async fn lost_follows_the_quorum_within_a_renewal_period() {
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    // Renewed every 3 s; the TTL alone would take 9 s to run out.
    let watchdog = Duration::from_secs(9);
    let red = client_with_watchdog(watchdog)
        .red_lock_on(&nodes, NAME)
        .unwrap();
    let guard = red.lock().await.unwrap();
    for s in &mut servers[..3] {
        s.kill().await.unwrap();
    }
    let killed = Instant::now();
    tokio::time::timeout(watchdog, guard.lost())
        .await
        .expect("lost() fires once a quorum refuses");
    let after = killed.elapsed();
    assert!(
        after < watchdog * 2 / 3,
        "lost() fired after {after:?}: within a renewal period (3 s) and the node timeout, not the 9 s TTL"
    );
}

/// A node slower than the others, but within its response timeout, proves
/// its hold: `lost()` does not fire.
#[tokio::test]
async fn a_slow_node_does_not_trip_lost() {
    let servers = futures::future::try_join_all((0..3).map(|_| {
        RedisProcess::start_with_args(|_| vec!["--enable-debug-command".into(), "yes".into()])
    }))
    .await
    .unwrap();
    let nodes = nodes_at(&servers, Duration::from_secs(2));
    let red = client_with_watchdog(Duration::from_millis(900))
        .red_lock_on(&nodes, NAME)
        .unwrap();
    let guard = red.lock().await.unwrap();
    // Two of the three nodes stall 250 ms in every 400 ms, for 3 s: many
    // renewals (every 300 ms) answer late, none time out.
    let stall = |url: String| async move {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut conn = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap();
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(0.25)
                .query_async::<()>(&mut conn)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    };
    let stalls = futures::future::join(stall(servers[0].url()), stall(servers[1].url()));
    tokio::select! {
        _ = stalls => {}
        _ = guard.lost() => panic!("lost() fired while the nodes were only slow"),
    }
    guard.unlock().await.unwrap();
}

/// A multi-node lock whose lease ran out is not held: its unlock says
/// `NotHeld`, as a single-node lock's would, not `NoQuorum`.
#[tokio::test]
async fn an_expired_red_lock_unlocks_as_not_held() {
    let servers = servers(3).await;
    let nodes = nodes(&servers);
    let red = client().red_lock_on(&nodes, NAME).unwrap();
    let guard = red
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::timeout(PATIENCE, guard.lost())
        .await
        .expect("the lease runs out");
    for s in &servers {
        wait_absent(&s.url(), NAME, PATIENCE, "the lease ran out").await;
    }
    match guard.unlock().await {
        Err(Error::NotHeld { lock, nodes }) => {
            assert_eq!(lock, NAME);
            for s in &servers {
                assert!(nodes.contains(&addr(s)), "{nodes:?}");
            }
        }
        other => panic!("expected NotHeld, got {other:?}"),
    }
}

/// With a majority dead, the error names every node: those that answered
/// with their answer, and the dead ones with their error.
#[tokio::test]
async fn no_quorum_names_every_node() {
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    for s in &mut servers[..3] {
        s.kill().await.unwrap();
    }
    let red = red_lock(&nodes, Duration::from_millis(300));
    let err = red
        .try_lock_for(Duration::from_millis(500), Some(LONG_LEASE))
        .await
        .unwrap_err();
    let Error::NoQuorum(q) = err else {
        panic!("expected NoQuorum, got {err:?}");
    };
    let shown = q.to_string();
    for s in &servers {
        assert!(shown.contains(&addr(s)), "{} is named: {shown}", addr(s));
    }
    assert_eq!(q.succeeded_on.len() + q.failures.len(), 5, "{q}");
    for failure in &q.failures {
        if let FailureCause::Failed(err) = &failure.cause {
            assert!(
                matches!(
                    err,
                    Error::NodeUnavailable {
                        reason: Unavailable::Refused | Unavailable::Suspect,
                        ..
                    }
                ),
                "{err:?}"
            );
        }
    }
}

/// A node freezes while the lock is held: the unlock returns once a quorum
/// released, not after the frozen node's 2 s timeout, and the frozen node's
/// key is released when it thaws (a minute-long lease: only the release
/// clears it in time).
#[tokio::test]
async fn unlock_returns_at_quorum_and_the_rest_follows() {
    let mut servers = servers(5).await;
    let nodes = nodes_at(&servers, Duration::from_secs(2));
    let red = long_lease_client().red_lock_on(&nodes, NAME).unwrap();
    let guard = red.lock_with_lease(LONG_LEASE).await.unwrap();
    eventually(
        PATIENCE,
        |held: &Vec<String>| format!("not every node holds: {held:?}"),
        || async {
            let held = guard.nodes();
            if held.len() == 5 { Ok(()) } else { Err(held) }
        },
    )
    .await;
    servers[4].pause().await.unwrap();
    let started = Instant::now();
    guard.unlock().await.unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "the unlock waited for the frozen node: {took:?}"
    );
    assert!(!exists(&servers[0].url(), NAME).await);
    servers[4].unpause().await.unwrap();
    wait_absent(&servers[4].url(), NAME, PATIENCE, "released once it thawed").await;
}

/// A waiter subscribes on every node before its next round, and waits for
/// each subscription to be confirmed, but not on a suspect node: a frozen
/// node would hold every wait for the per-node timeout (here 2 s) and
/// contenders would take turns at that pace. The holder releases 100 ms
/// after the waiter started; the waiter is woken by the healthy nodes.
#[tokio::test]
async fn a_waiter_does_not_wait_for_a_suspect_nodes_subscription() {
    let mut servers = servers(3).await;
    let nodes = nodes_at(&servers, Duration::from_secs(2));
    warm(&nodes).await;
    let red = red_lock(&nodes, Duration::from_secs(2));
    servers[2].pause().await.unwrap();
    let holder = red.lock_with_lease(LONG_LEASE).await.unwrap();
    eventually(
        PATIENCE,
        |health: &Health| format!("the frozen node is {health:?}"),
        || async {
            match nodes[2].health() {
                Health::Suspect { .. } => Ok(()),
                health => Err(health),
            }
        },
    )
    .await;
    let started = Instant::now();
    let waiter = tokio::spawn({
        let red = red.clone();
        async move {
            let guard = red.lock_with_lease(LONG_LEASE).await.unwrap();
            let took = started.elapsed();
            guard.unlock().await.unwrap();
            took
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    holder.unlock().await.unwrap();
    let took = waiter.await.unwrap();
    assert!(
        took < Duration::from_secs(1),
        "the waiter got the lock {took:?} after it started waiting, 100 ms before the release"
    );
    servers[2].unpause().await.unwrap();
    wait_healthy(&nodes[2]).await;
    for s in &servers {
        wait_absent(&s.url(), NAME, PATIENCE, "released everywhere").await;
    }
}
