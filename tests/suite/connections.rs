//! The connections requests share: the two-command budget of an
//! uncontended lock+unlock, the shared multiplexed connections, and a pool
//! of one serving shared and exclusive requests.

use std::time::Duration;

use crate::common::*;
use multilock_testkit::TestServer;

/// An uncontended lock+unlock is exactly two script calls on the wire:
/// no PING on checkout, nothing else.
#[tokio::test]
async fn lock_and_unlock_cost_two_script_calls() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "budget").unwrap();
    // Warm up: connections made, scripts loaded.
    lock.lock().await.unwrap().unlock().await.unwrap();

    let before = command_calls(&server.url()).await;
    for _ in 0..10 {
        lock.lock().await.unwrap().unlock().await.unwrap();
    }
    let after = command_calls(&server.url()).await;
    let mut delta = delta(&before, &after);
    // Our own INFO call shows up once.
    delta.remove("info");
    assert_eq!(
        delta.remove("evalsha"),
        Some(20),
        "two EVALSHA per lock+unlock"
    );
    // commandstats also counts the commands the scripts run; each must be
    // exactly what the two scripts do, so none of them came over the wire
    // on its own. Acquire, as Redisson's: EXISTS (the lock, and the
    // request's latch: a rollback's tombstone?), HINCRBY, PEXPIRE. Release:
    // GET (the latch), HGET, DEL (the lock, and the previous release's
    // latch, which Redisson's client deletes with a command of its own),
    // PUBLISH, SET (the latch).
    for (inner, per_cycle) in [
        ("exists", 1),
        ("hincrby", 1),
        ("pexpire", 1),
        ("get", 1),
        ("hget", 1),
        ("del", 1),
        ("publish", 1),
        ("set", 1),
    ] {
        assert_eq!(delta.remove(inner), Some(10 * per_cycle), "{inner}");
    }
    assert!(delta.is_empty(), "nothing else on the wire: {delta:?}");
}

/// Connections to `url` other than the one asking.
async fn connections(url: &str) -> usize {
    let list: String = run(url, redis::cmd("CLIENT").arg("LIST")).await.unwrap();
    list.lines().count() - 1
}

/// Concurrent requests pipeline on shared connections, and a lock's
/// requests keep to one of them: by default a node's 64 tasks on 64 locks
/// share one command connection (the fewest reads and writes for the
/// server), and a node built with `shared_connections(2)` opens a second
/// and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_the_configured_connections() {
    for shared in [None, Some(2)] {
        let server = server().await;
        let url = server.url();
        let mut builder = multilock::Node::builder(&url).response_timeout(Duration::from_secs(2));
        if let Some(shared) = shared {
            builder = builder.shared_connections(shared);
        }
        let node = builder.build().unwrap();
        let client = client();
        let warm = client.lock(&node, "shared:warm").unwrap();
        for _ in 0..3 {
            warm.lock().await.unwrap().unlock().await.unwrap();
        }
        assert_eq!(connections(&url).await, 1, "one lock, one connection");

        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let lock = client.lock(&node, format!("shared:{i}")).unwrap();
                tokio::spawn(async move {
                    for _ in 0..20 {
                        let guard = lock.lock_with_lease(Duration::from_secs(10)).await.unwrap();
                        guard.unlock().await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(
            connections(&url).await,
            shared.unwrap_or(1),
            "command connections with shared_connections({shared:?})"
        );
    }
}

/// A node at `url` with a pool of one command connection.
fn pool_of_one(url: &str) -> multilock::Node {
    multilock::Node::builder(url)
        .pool_size(1)
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// The first requests to a node with a pool of one connection, 64 at once:
/// one makes the shared connection and the others wait for it, not for a
/// place in the pool (which a shared connection never gives back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_requests_at_once_wait_for_the_shared_connection() {
    let server = server().await;
    let node = pool_of_one(&server.url());
    let client = client();
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let lock = client.lock(&node, format!("cold:{i}")).unwrap();
            tokio::spawn(async move {
                let guard = lock.lock_with_lease(Duration::from_secs(10)).await?;
                guard.unlock().await
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "no request waited out the response timeout"
    );
    assert_eq!(connections(&server.url()).await, 1);
}

/// A pool of one connection serves shared requests and one that needs its
/// connection to itself (a replica-sync `WAIT`) in turn: the shared
/// connection goes back to the pool for it, and shared requests get one
/// again after.
#[tokio::test]
async fn a_pool_of_one_serves_shared_and_exclusive_requests() {
    let server = server().await;
    let node = pool_of_one(&server.url());
    let lock = client().lock(&node, "pool-of-one").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    // A lone server has no replica: the WAIT runs, gets none, and the grant
    // is released.
    let synced = lock
        .with_replica_sync(1, Duration::from_millis(50))
        .unwrap();
    let started = std::time::Instant::now();
    match synced.lock().await {
        Err(multilock::Error::ReplicaSync {
            acknowledged: 0, ..
        }) => {}
        other => panic!("expected a replica-sync refusal, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the exclusive request did not wait for the pool"
    );
    lock.lock().await.unwrap().unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}
