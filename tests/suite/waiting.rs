//! Waiting and cancellation: pub/sub wake-ups, bounded waits, and futures
//! dropped at any point leaving nothing held.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::*;
use multilock::Client;
use multilock_testkit::{TestServer, protocol};

/// The holder holds for a minute: a waiter not woken by the unlock message
/// would sleep out the holder's TTL, far past the bound below.
#[tokio::test]
async fn a_waiter_gets_the_lock_promptly_after_release_and_not_before() {
    let server = server().await;
    let node = node(&server);
    let lock = client().lock(&node, "handoff").unwrap();
    let holder = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let other = Client::new().lock(&node, "handoff").unwrap();
    let waiter = tokio::spawn(async move {
        let guard = other.lock().await.unwrap();
        let at = Instant::now();
        guard.unlock().await.unwrap();
        at
    });
    wait_for_listeners(&server.url(), "handoff", 1).await;
    // The holder keeps it a while: the subscribed waiter waits.
    tokio::time::sleep(WATCHDOG * 2).await;
    assert!(
        !waiter.is_finished(),
        "no grant while the holder keeps the lock"
    );
    let released = Instant::now();
    holder.unlock().await.unwrap();
    let granted = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("woken by the release, not by the holder's 60 s lease")
        .unwrap();
    let handoff = granted - released;
    assert!(
        handoff < Duration::from_secs(3),
        "woken by pub/sub, not by the TTL: {handoff:?}"
    );
}

/// The holder holds for a minute and each waiter for 5 s: waiters not
/// woken by the releases would sleep out those TTLs one after another,
/// far past their 20 s wait.
#[tokio::test]
async fn many_waiters_all_get_their_turn() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "queue").unwrap();
    let holder = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let waiters: Vec<_> = (0..50)
        .map(|_| {
            let lock = lock.clone();
            tokio::spawn(async move {
                let guard = lock
                    .try_lock_for(Duration::from_secs(20), Some(Duration::from_secs(5)))
                    .await
                    .unwrap();
                guard
                    .expect("every waiter gets the lock in time")
                    .unlock()
                    .await
                    .unwrap();
            })
        })
        .collect();
    wait_for_listeners(&server.url(), "queue", 1).await;
    holder.unlock().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test]
async fn try_lock_for_gives_up_after_its_wait() {
    let server = server().await;
    let node = node(&server);
    let holder = client().lock(&node, "busy").unwrap().lock().await.unwrap();
    let other = Client::new().lock(&node, "busy").unwrap();
    let started = Instant::now();
    let got = other
        .try_lock_for(Duration::from_millis(500), None)
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(got.is_none());
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    holder.unlock().await.unwrap();
}

/// Busy-waits `delay` on this thread: finer than the timer's millisecond,
/// while the runtime's workers go on.
fn spin_for(delay: Duration) {
    let started = std::time::Instant::now();
    while started.elapsed() < delay {
        std::hint::spin_loop();
    }
}

/// Cancel an acquire while it waits, where a grant can be in flight: the
/// holder releases (its unlock message wakes the waiter) and the waiter is
/// cut off 0 µs to 5 ms after the release: before it woke, while its
/// acquire is on the wire, or just after the grant. The waiter's client
/// leases for a minute, so a grant left behind would keep the third client
/// out far longer than it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_while_waiting_leaves_nothing() {
    let server = server().await;
    let url = server.url();
    let node = node(&server);
    let holder = Client::new().lock(&node, "cancel-wait").unwrap();
    let waiter_lock = long_lease_client().lock(&node, "cancel-wait").unwrap();
    let third = Client::new().lock(&node, "cancel-wait").unwrap();
    for sweep in 0..3 {
        for cut_us in [
            0u64, 10, 25, 50, 100, 150, 200, 300, 400, 600, 800, 1200, 2000, 5000,
        ] {
            let held = holder.lock_with_lease(LONG_LEASE).await.unwrap();
            // The last round's subscriptions are gone: the next count of 1
            // is this waiter's.
            wait_for_listeners(&url, "cancel-wait", 0).await;
            let attempt = waiter_lock.clone();
            let waiting = tokio::spawn(async move {
                let guard = attempt.lock().await.unwrap();
                // Granted: park with the guard; abort drops it.
                std::future::pending::<()>().await;
                drop(guard);
            });
            wait_for_listeners(&url, "cancel-wait", 1).await;
            held.unlock().await.unwrap();
            spin_for(Duration::from_micros(cut_us));
            waiting.abort();
            assert!(waiting.await.unwrap_err().is_cancelled());
            let why = format!("the waiter cut {cut_us} µs after the release (sweep {sweep})");
            take_and_release(&third, PATIENCE, &why).await;
        }
    }
}

/// Cut acquires off at every point, including right after the grant: the
/// lock is never left held beyond the rollback.
#[tokio::test]
async fn cancelled_at_any_point_leaves_nothing() {
    let server = server().await;
    let node = node(&server);
    let lock = long_lease_client().lock(&node, "cancel-grant").unwrap();
    let other = Client::new().lock(&node, "cancel-grant").unwrap();
    for cut_after_us in [0u64, 20, 50, 100, 200, 300, 500, 800, 1200, 2000, 5000] {
        let attempt = lock.clone();
        let task = tokio::spawn(async move {
            let guard = attempt.lock().await.unwrap();
            // Granted: park with the guard; abort drops it.
            std::future::pending::<()>().await;
            drop(guard);
        });
        tokio::time::sleep(Duration::from_micros(cut_after_us)).await;
        task.abort();
        let _ = task.await;
        let why = format!("lock left held after a cut at {cut_after_us} us");
        take_and_release(&other, PATIENCE, &why).await;
    }
    // Dropping the acquire future itself (not the task) mid-flight.
    for _ in 0..20 {
        let fut = lock.lock();
        let _ = tokio::time::timeout(Duration::from_micros(100), fut).await;
        take_and_release(
            &other,
            PATIENCE,
            "the rollback released the abandoned grant",
        )
        .await;
    }
}

/// The cut that surely lands after the request left: the server is frozen,
/// the acquire is dropped while its request waits there, and the server
/// then grants it. The grant is released in the background at once, not
/// after its 60 s lease.
#[tokio::test]
async fn an_acquire_dropped_at_a_frozen_server_is_rolled_back() {
    let mut server = server().await;
    let url = server.url();
    let node = node(&server);
    let lock = long_lease_client().lock(&node, "cancel-frozen").unwrap();
    let other = Client::new().lock(&node, "cancel-frozen").unwrap();
    // Warm: the connection exists, so the request really reaches the socket.
    take_and_release(&lock, Duration::ZERO, "free at first").await;
    let before = command_calls(&url).await;

    server.pause().await.unwrap();
    let cut = tokio::time::timeout(Duration::from_millis(200), lock.lock()).await;
    assert!(cut.is_err(), "nothing can be granted by a frozen server");
    server.unpause().await.unwrap();

    take_and_release(&other, PATIENCE, "the late grant was rolled back").await;
    let sent = delta(&before, &command_calls(&url).await);
    // The dropped acquire did reach the server (and was undone): two
    // scripts from it (acquire, rollback), two from `take_and_release`.
    assert!(sent.get("evalsha").copied().unwrap_or(0) >= 4, "{sent:?}");
}

/// The guard's lease is a minute: only its release frees the lock in time.
#[tokio::test]
async fn dropping_a_guard_releases_it() {
    let server = server().await;
    let node = node(&server);
    let lock = long_lease_client().lock(&node, "dropped").unwrap();
    let other = Client::new().lock(&node, "dropped").unwrap();
    drop(lock.lock().await.unwrap());
    take_and_release(
        &other,
        PATIENCE,
        "a dropped guard is released in the background",
    )
    .await;
}

/// 200 waiters on 20 locks share one subscription connection; the last
/// waiter of a channel leaving unsubscribes it.
#[tokio::test]
async fn waiters_share_one_subscription_connection() {
    let server = server().await;
    let url = server.url();
    let node = node(&server);
    let holder_client = client();
    let names: Vec<String> = (0..20).map(|i| format!("shared:{i}")).collect();
    let mut holders = Vec::new();
    for name in &names {
        holders.push(
            holder_client
                .lock(&node, name.as_str())
                .unwrap()
                .lock()
                .await
                .unwrap(),
        );
    }
    let waiter_client = Client::new();
    let waiters: Vec<_> = (0..200)
        .map(|i| {
            let lock = waiter_client.lock(&node, names[i % 20].as_str()).unwrap();
            tokio::spawn(async move {
                let guard = lock
                    .try_lock_for(Duration::from_secs(30), None)
                    .await
                    .unwrap();
                guard
                    .expect("every waiter gets its lock")
                    .unlock()
                    .await
                    .unwrap();
            })
        })
        .collect();
    for name in &names {
        wait_for_listeners(&url, name, 1).await;
    }
    let mut conn = raw(&url).await;
    let pubsub: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        pubsub.lines().count(),
        1,
        "one subscription connection: {pubsub}"
    );
    let mut channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query_async(&mut conn)
        .await
        .unwrap();
    channels.sort();
    let mut expected: Vec<String> = names.iter().map(|n| protocol::channel(n)).collect();
    expected.sort();
    assert_eq!(channels, expected);

    for holder in holders {
        holder.unlock().await.unwrap();
    }
    for waiter in waiters {
        waiter.await.unwrap();
    }
    // Every waiter left: every channel is unsubscribed.
    for name in &names {
        wait_for_listeners(&url, name, 0).await;
    }
}

/// A waiter that finds its lock's channel already subscribed by another
/// waiter of its process joins that subscription before its first attempt,
/// so it sends one failed attempt before it parks, not two (one before
/// subscribing and one after). The holder keeps the lock for a minute and
/// the waiters hold with a lease (no renewals): every EVALSHA on the server
/// is an acquire or a release of this test.
#[tokio::test]
async fn a_waiter_joining_a_subscribed_channel_tries_once_before_it_waits() {
    let server = server().await;
    let url = server.url();
    let node = node(&server);
    let holder = held_for_long(&node, "joined").await;
    let waiters = Client::new().lock(&node, "joined").unwrap();
    let before = command_calls(&url).await;
    let wait = take_and_release_in_background;
    let sent_since = |before: HashMap<String, u64>, url: String| evalsha_since(before, url);
    let reached = |count: u64| evalsha_reach(before.clone(), url.clone(), count);
    // The first waiter: an attempt, the subscription, an attempt, parked.
    let first = wait(waiters.clone());
    wait_for_listeners(&url, "joined", 1).await;
    reached(2).await;
    // The second joins the confirmed subscription and tries once.
    let second = wait(waiters.clone());
    reached(3).await;
    // Watch a while: a second attempt before parking would follow at once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        sent_since(before.clone(), url.clone()).await,
        3,
        "the second waiter tried once before it waited"
    );
    assert!(!first.is_finished() && !second.is_finished());
    holder.unlock().await.unwrap();
    tokio::time::timeout(PATIENCE, first)
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(PATIENCE, second)
        .await
        .unwrap()
        .unwrap();
    // The holder's release, then per waiter: its grant and its release.
    assert_eq!(
        sent_since(before, url).await,
        3 + 1 + 2 * 2,
        "one release wakes one waiter, whose attempt is granted"
    );
}

/// Waiters arriving together at a held lock, on a channel nobody here has
/// subscribed yet: each tries once, they subscribe, and then one attempt,
/// sent after the confirmation, covers them all: N + 1 acquire attempts
/// before they park, not 2N. Every EVALSHA on the server is an acquire or a
/// release of this test (long leases, no renewals).
#[tokio::test]
async fn waiters_that_subscribe_together_share_the_attempt_after_it() {
    const WAITERS: u64 = 8;
    let server = server().await;
    let url = server.url();
    let node = node(&server);
    let holder = held_for_long(&node, "herd").await;
    let waiters = Client::new().lock(&node, "herd").unwrap();
    let before = command_calls(&url).await;
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| take_and_release_in_background(waiters.clone()))
        .collect();
    wait_for_listeners(&url, "herd", 1).await;
    evalsha_reach(before.clone(), url.clone(), WAITERS + 1).await;
    // Watch a while: the attempts of the others would follow at once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        evalsha_since(before.clone(), url.clone()).await,
        WAITERS + 1,
        "one attempt after the subscription, not one per waiter"
    );
    assert!(tasks.iter().all(|task| !task.is_finished()));
    // They all still get their turn.
    holder.unlock().await.unwrap();
    for task in tasks {
        tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
    }
}

/// `name` on `node`, held by another client with [`LONG_LEASE`].
async fn held_for_long(node: &multilock::Node, name: &str) -> multilock::Guard {
    client()
        .lock(node, name)
        .unwrap()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap()
}

/// A task that waits for `lock`, takes it with [`LONG_LEASE`] (no
/// renewals) and releases it.
fn take_and_release_in_background(lock: multilock::Lock) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let guard = lock.lock_with_lease(LONG_LEASE).await.unwrap();
        guard.unlock().await.unwrap();
    })
}

/// EVALSHA calls the server ran since `before`.
async fn evalsha_since(before: HashMap<String, u64>, url: String) -> u64 {
    let after = command_calls(&url).await;
    delta(&before, &after).get("evalsha").copied().unwrap_or(0)
}

/// Waits until the server ran at least `count` EVALSHA calls since `before`.
async fn evalsha_reach(before: HashMap<String, u64>, url: String, count: u64) {
    eventually(
        PATIENCE,
        |seen| format!("{seen} acquire attempts, expected {count}"),
        || {
            let (before, url) = (before.clone(), url.clone());
            async move {
                let sent = evalsha_since(before, url).await;
                if sent >= count { Ok(()) } else { Err(sent) }
            }
        },
    )
    .await
}
