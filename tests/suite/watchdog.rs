//! Renewal: the watchdog keeps a lock alive, a fixed lease expires, no
//! renewal outlives an unlock, and `lost()` fires when the lock is taken away.

use std::time::{Duration, Instant};

use crate::common::*;
use multilock::testkit::TestServer;

#[tokio::test]
async fn watchdog_keeps_the_lock_past_three_timeouts() {
    let server = server().await;
    let node = node(&server);
    let client = client(); // watchdog timeout 1 s
    let lock = client.lock(&node, "kept").unwrap();
    let guard = lock.lock().await.unwrap();
    tokio::time::sleep(WATCHDOG * 3 + Duration::from_millis(500)).await;
    assert!(
        lock.is_locked().await.unwrap(),
        "renewed past 3x the watchdog timeout"
    );
    let ttl = lock.remaining_ttl().await.unwrap().unwrap();
    assert!(
        ttl <= WATCHDOG,
        "the lease is the watchdog timeout, got {ttl:?}"
    );
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn fixed_lease_expires_without_renewal() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "leased").unwrap();
    let guard = lock
        .lock_with_lease(Duration::from_millis(700))
        .await
        .unwrap();
    let deadline = guard.valid_until().expect("a fixed lease has an end");
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() fires when the lease ends");
    assert!(Instant::now() >= deadline);
    wait_absent(&server.url(), "leased", PATIENCE, "expired").await;
    let err = guard.unlock().await.unwrap_err();
    assert!(matches!(err, multilock::Error::NotHeld { .. }), "{err}");
}

/// After unlock the key is gone and no PEXPIRE for it reaches the server:
/// watched through MONITOR, which also shows commands run by scripts.
#[tokio::test]
async fn no_renewal_after_unlock() {
    let server = server().await;
    let node = node(&server);
    let client = client_with_watchdog(Duration::from_millis(300));
    let lock = client.lock(&node, "stopped").unwrap();
    // Keep another lock held so the node's timer keeps ticking.
    let other = client.lock(&node, "ticking").unwrap().lock().await.unwrap();
    let guard = lock.lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await; // at least one renewal

    let monitor = redis::Client::open(server.url())
        .unwrap()
        .get_async_monitor()
        .await
        .unwrap();
    let mut lines = monitor.into_on_message::<String>();
    guard.unlock().await.unwrap();
    assert!(!exists(&server.url(), "stopped").await);
    let watch_until = tokio::time::Instant::now() + Duration::from_millis(1000);
    let mut renewals_of_other = 0;
    let mut released = false;
    use futures::StreamExt;
    while let Ok(Some(line)) = tokio::time::timeout_at(watch_until, lines.next()).await {
        if line.contains("\"pexpire\" \"stopped\"") || line.contains("\"PEXPIRE\" \"stopped\"") {
            panic!("a renewal of the unlocked lock reached the server: {line}");
        }
        if line.contains("\"del\" \"stopped\"") {
            released = true;
        }
        if line.contains("\"pexpire\" \"ticking\"") {
            renewals_of_other += 1;
        }
    }
    let _ = released;
    assert!(
        renewals_of_other >= 2,
        "the other lock kept being renewed meanwhile ({renewals_of_other})"
    );
    other.unlock().await.unwrap();
}

#[tokio::test]
async fn lost_fires_after_a_force_unlock_elsewhere() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "taken-away").unwrap();
    let guard = lock.lock().await.unwrap();
    // Another client (an operator) force-unlocks.
    let admin = multilock::Client::new();
    assert!(
        admin
            .lock(&node, "taken-away")
            .unwrap()
            .force_unlock()
            .await
            .unwrap()
    );
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() fires");
    assert!(
        started.elapsed() <= WATCHDOG + Duration::from_secs(1),
        "noticed within a renewal period or so"
    );
    assert!(matches!(
        guard.unlock().await,
        Err(multilock::Error::NotHeld { .. })
    ));
}

#[tokio::test]
async fn lost_does_not_fire_while_held() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let guard = client.lock(&node, "steady").unwrap().lock().await.unwrap();
    let fired = tokio::time::timeout(WATCHDOG * 2, guard.lost()).await;
    assert!(
        fired.is_err(),
        "lost() must not fire while renewals succeed"
    );
    guard.unlock().await.unwrap();
}

/// Many locks on one node are renewed by one batched call per tick.
#[tokio::test]
async fn renewals_are_batched_per_node() {
    let server = server().await;
    let node = node(&server);
    let client = client_with_watchdog(Duration::from_millis(600));
    let mut guards = Vec::new();
    for i in 0..200 {
        guards.push(
            client
                .lock(&node, format!("batch:{i}"))
                .unwrap()
                .lock()
                .await
                .unwrap(),
        );
    }
    // One tick first: it loads the renewal script (NOSCRIPT, SCRIPT LOAD).
    // Done once the 200 acquires' PEXPIREs are followed by 200 renewals.
    let url = server.url();
    eventually(
        PATIENCE,
        |pexpire| format!("no renewal tick yet: {pexpire} PEXPIRE calls"),
        || async {
            let pexpire = command_calls(&url)
                .await
                .get("pexpire")
                .copied()
                .unwrap_or(0);
            if pexpire >= 400 { Ok(()) } else { Err(pexpire) }
        },
    )
    .await;
    let before = command_calls(&url).await;
    tokio::time::sleep(Duration::from_millis(1000)).await; // ~5 ticks of 200 ms
    let after = command_calls(&url).await;
    let calls = delta(&before, &after);
    let evalsha = calls.get("evalsha").copied().unwrap_or(0);
    let pexpire = calls.get("pexpire").copied().unwrap_or(0);
    assert!(evalsha >= 2, "the timer ticked ({evalsha} renewal calls)");
    assert_eq!(
        pexpire,
        200 * evalsha,
        "each renewal call renews all 200 locks"
    );
    for guard in guards {
        guard.unlock().await.unwrap();
    }
}

/// A holder that cannot reach its node any more is told once the last
/// confirmed TTL has run out: it cannot know the key still exists.
#[tokio::test]
async fn lost_fires_when_the_node_stops_answering() {
    let mut server = server().await;
    let node = node(&server);
    let client = client();
    let guard = client
        .lock(&node, "unreachable")
        .unwrap()
        .lock()
        .await
        .unwrap();
    server.pause().await.unwrap();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() fires while the node is unreachable");
    assert!(
        started.elapsed() <= WATCHDOG + Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    server.unpause().await.unwrap();
    drop(guard);
}

/// A hold found gone is over: its guard's unlock does not touch a later
/// hold that the same owner took meanwhile, which stays renewed.
#[tokio::test]
async fn a_lost_guard_leaves_a_later_hold_of_its_owner_alone() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let owner = multilock::Owner::new("worker").unwrap();
    let lock = client.lock(&node, "again").unwrap().with_owner(owner);
    let old = lock.lock().await.unwrap();
    assert!(
        multilock::Client::new()
            .lock(&node, "again")
            .unwrap()
            .force_unlock()
            .await
            .unwrap()
    );
    tokio::time::timeout(Duration::from_secs(5), old.lost())
        .await
        .expect("lost");
    let new = lock.lock().await.unwrap();
    assert!(matches!(
        old.unlock().await,
        Err(multilock::Error::NotHeld { .. })
    ));
    assert_eq!(
        lock.hold_count().await.unwrap(),
        1,
        "the later hold is untouched"
    );
    tokio::time::sleep(WATCHDOG * 2).await;
    assert!(lock.is_locked().await.unwrap(), "and still renewed");
    new.unlock().await.unwrap();
}

/// A guard whose fixed lease has surely run out sends no release: its owner
/// took the lock again since, and that later hold must survive the stale
/// guard's unlock (or drop).
#[tokio::test]
async fn an_expired_lease_guard_leaves_a_later_hold_alone() {
    let server = server().await;
    let node = node(&server);
    let lock = client()
        .lock(&node, "stale-lease")
        .unwrap()
        .with_owner(multilock::Owner::new("worker").unwrap());
    let stale = lock
        .lock_with_lease(Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let current = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        lock.hold_count().await.unwrap(),
        1,
        "a fresh hold, not a re-entry"
    );
    assert!(matches!(
        stale.unlock().await,
        Err(multilock::Error::NotHeld { .. })
    ));
    assert_eq!(
        lock.hold_count().await.unwrap(),
        1,
        "the later hold survives"
    );
    current.unlock().await.unwrap();
    assert!(!exists(&server.url(), "stale-lease").await);
}
