//! Scoped locking (`run_locked`) and the cap on renewal (`max_hold`): work
//! runs under the lock and is stopped when the lock is lost; a holder stuck
//! for good cannot keep a lock forever.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use multilock::{AnyLock, Client, DistributedLock, Error};
use multilock_testkit::TestServer;

/// On every lock type: the work runs under the lock, with the fencing
/// token, and the lock is released after it.
#[tokio::test]
async fn run_locked_runs_the_work_under_the_lock_and_releases() {
    async fn exercise<L: DistributedLock>(lock: L, fenced: bool) {
        let inside = lock.clone();
        let (token, held) = lock
            .run_locked(
                |token| async move { (token, inside.is_held_by_current_owner().await.unwrap()) },
            )
            .await
            .unwrap();
        assert!(held, "{}: held while the work ran", lock.name());
        assert_eq!(token.is_some(), fenced, "{}", lock.name());
        assert!(
            !lock.is_locked().await.unwrap(),
            "{}: released after",
            lock.name()
        );
    }
    let servers = servers(3).await;
    let nodes: Vec<multilock::Node> = servers.iter().map(node).collect();
    let client = long_lease_client();
    exercise(client.lock(&nodes[0], "single").unwrap(), false).await;
    exercise(
        client.lock(&nodes[0], "fenced").unwrap().with_fencing(),
        true,
    )
    .await;
    exercise(client.multi_lock_on(&nodes, "multi").unwrap(), false).await;
    exercise(
        client.red_lock_on(&nodes, "red").unwrap().with_fencing(),
        true,
    )
    .await;
}

/// On every lock type, the bounded call: the work runs under the lock and
/// its output comes back in `Some`; while another owner holds the lock,
/// the call ends after its wait with `None`, and the work never runs.
#[tokio::test]
async fn run_locked_for_runs_the_work_or_ends_after_its_wait() {
    async fn exercise<L: DistributedLock>(lock: L) {
        let wait = Duration::from_millis(300);
        let output = lock.run_locked_for(wait, None, |_| async { 7 }).await;
        assert_eq!(output.unwrap(), Some(7), "{}: free, so run", lock.name());
        let rival = lock.with_owner(multilock::Owner::new("rival").unwrap());
        let held = rival.lock().await.unwrap();
        let ran = Arc::new(AtomicU64::new(0));
        let counter = ran.clone();
        let started = Instant::now();
        let output = lock
            .run_locked_for(wait, None, |_| async move {
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .await;
        assert_eq!(output.unwrap(), None, "{}: held by a rival", lock.name());
        assert!(
            started.elapsed() >= wait,
            "{}: ended before its wait",
            lock.name()
        );
        assert_eq!(
            ran.load(Ordering::SeqCst),
            0,
            "{}: the work ran",
            lock.name()
        );
        held.unlock().await.unwrap();
        assert!(
            !lock.is_locked().await.unwrap(),
            "{}: left held",
            lock.name()
        );
    }
    let servers = servers(3).await;
    let nodes: Vec<multilock::Node> = servers.iter().map(node).collect();
    let client = long_lease_client();
    exercise(client.lock(&nodes[0], "bounded-single").unwrap()).await;
    exercise(client.multi_lock_on(&nodes, "bounded-multi").unwrap()).await;
    exercise(client.red_lock_on(&nodes, "bounded-red").unwrap()).await;
    // Chosen at run time, through `AnyLock`.
    let single: AnyLock = client.lock(&nodes[0], "bounded-any").unwrap().into();
    exercise(single).await;
    let red: AnyLock = client.red_lock_on(&nodes, "bounded-any").unwrap().into();
    exercise(red).await;
}

/// The lock is taken away while the work runs: the work is dropped at its
/// next await point and the call says the lock was lost.
#[tokio::test]
async fn run_locked_drops_the_work_when_the_lock_is_lost() {
    let server = server().await;
    let node = node(&server);
    let lock = client().lock(&node, "scoped").unwrap(); // renewed every 333 ms
    let steps = Arc::new(AtomicU64::new(0));
    let counted = steps.clone();
    let running = tokio::spawn(async move {
        lock.run_locked(|_| async move {
            loop {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    });
    eventually(
        PATIENCE,
        |n: &u64| format!("the work has not started ({n} steps)"),
        || async {
            let n = steps.load(Ordering::SeqCst);
            if n > 0 { Ok(()) } else { Err(n) }
        },
    )
    .await;
    // An operator takes the lock away.
    assert!(
        Client::new()
            .lock(&node, "scoped")
            .unwrap()
            .force_unlock()
            .await
            .unwrap()
    );
    let taken_at = Instant::now();
    let outcome = tokio::time::timeout(PATIENCE, running)
        .await
        .expect("the work was stopped")
        .unwrap();
    assert!(
        matches!(&outcome, Err(Error::LockLost { lock }) if lock == "scoped"),
        "{outcome:?}"
    );
    assert!(
        taken_at.elapsed() < WATCHDOG * 2,
        "stopped within a renewal period or so"
    );
    let stopped_at = steps.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        steps.load(Ordering::SeqCst),
        stopped_at,
        "the work no longer runs"
    );
}

/// A hold under the watchdog is renewed for at most its maximum hold time;
/// then it expires with its last lease and `lost()` fires.
#[tokio::test]
async fn the_watchdog_stops_renewing_at_the_maximum_hold_time() {
    let server = server().await;
    let node = node(&server);
    let client = Client::builder()
        .watchdog_timeout(Duration::from_secs(1))
        .max_hold(Duration::from_millis(1500))
        .build()
        .unwrap();
    let capped = client.lock(&node, "capped").unwrap();
    let free = client
        .lock(&node, "uncapped")
        .unwrap()
        .with_max_hold(multilock::MAX_LEASE)
        .unwrap();
    let started = Instant::now();
    let capped_guard = capped.lock().await.unwrap();
    let free_guard = free.lock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), capped_guard.lost())
        .await
        .expect("lost() fires once renewal stopped and the lease ran out");
    let after = started.elapsed();
    assert!(
        after >= Duration::from_millis(1500),
        "renewed up to the cap first: {after:?}"
    );
    wait_absent(&server.url(), "capped", PATIENCE, "expired after the cap").await;
    // The lock with its own (longer) cap is still renewed.
    assert!(
        tokio::time::timeout(Duration::ZERO, free_guard.lost())
            .await
            .is_err()
    );
    assert!(exists(&server.url(), "uncapped").await);
    assert!(matches!(
        capped_guard.unlock().await,
        Err(Error::NotHeld { .. })
    ));
    free_guard.unlock().await.unwrap();
}
