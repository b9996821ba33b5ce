//! Renewal: the watchdog keeps a lock alive, a fixed lease expires, no
//! renewal outlives an unlock, and `lost()` fires when the lock is taken away.

use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::common::*;
use multilock_testkit::{Delay, Direction, TcpProxy, TestServer};

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

/// After unlock no renewal of the lock reaches the server, watched through
/// MONITOR, which also shows the commands scripts run. Once the release's
/// DEL ran, a renewal shows as a script call carrying the key (other than
/// a retried release), or as the renewal script's HEXISTS (the key is
/// gone, so no PEXPIRE follows).
#[tokio::test]
async fn no_renewal_after_unlock() {
    let server = server().await;
    let url = server.url();
    let node = node(&server);
    let client = client_with_watchdog(Duration::from_millis(300));
    let lock = client.lock(&node, "stopped").unwrap();
    let (_, renew_sha) = script("renew_batch");
    let (release_source, release_sha) = script("release");
    let mut lines = monitor(&url).await;
    // Keep another lock held so the node's timer keeps ticking.
    let other = client.lock(&node, "ticking").unwrap().lock().await.unwrap();
    let guard = lock.lock().await.unwrap();
    let renewed = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next().await {
            if line.command() == "evalsha" && line.args[1] == renew_sha && line.has_arg("stopped") {
                return;
            }
        }
    });
    renewed.await.expect("the lock is renewed while held");

    guard.unlock().await.unwrap();
    assert!(!exists(&url, "stopped").await);
    let watch_until = tokio::time::Instant::now() + Duration::from_millis(1000);
    let mut renewals_of_other = 0;
    let mut released = false;
    while let Ok(Some(line)) = tokio::time::timeout_at(watch_until, lines.next()).await {
        let on_key = |key: &str| line.args.get(1).is_some_and(|arg| arg == key);
        let renews_stopped = match line.command() {
            "evalsha" | "eval" => {
                line.has_arg("stopped")
                    && ![release_sha.as_str(), release_source].contains(&line.args[1].as_str())
            }
            "hexists" | "pexpire" => line.from_script && on_key("stopped"),
            _ => false,
        };
        if released && renews_stopped {
            panic!("a renewal of the unlocked lock reached the server after its release: {line:?}");
        }
        if line.from_script && line.command() == "del" && on_key("stopped") {
            released = true;
        }
        if line.from_script && line.command() == "pexpire" && on_key("ticking") {
            renewals_of_other += 1;
        }
    }
    assert!(released, "the release's DEL went by");
    assert!(
        renewals_of_other >= 2,
        "the other lock kept being renewed meanwhile ({renewals_of_other})"
    );
    other.unlock().await.unwrap();
}

/// The server sleeps while the release is on its way, for longer than a
/// renewal period: the ticks that fall meanwhile must not carry the
/// released hold. It leaves the renewal before its release is sent; a hold
/// still counted until its release returned would be renewed right behind
/// that release, once the server wakes.
#[tokio::test]
async fn no_renewal_follows_a_release_the_server_is_slow_to_answer() {
    // A tick every 1.33 s; the keys' 4 s TTL outlasts the 2 s sleep.
    const TIMEOUT: Duration = Duration::from_secs(4);
    let server = debuggable_server().await;
    let url = server.url();
    // Replies wait out the sleep: no response timeout on the way.
    let node = node_at(&url, Duration::from_secs(5));
    let client = client_with_watchdog(TIMEOUT);
    let lock = client.lock(&node, "stopped").unwrap();
    let (_, renew_sha) = script("renew_batch");
    let mut lines = monitor(&url).await;
    // Another hold keeps the node's timer ticking.
    let other = client.lock(&node, "ticking").unwrap().lock().await.unwrap();
    let guard = lock.lock().await.unwrap();
    let sleeper = debug_sleep(&server, 2.0).await;
    let sent = Instant::now();
    guard.unlock().await.unwrap();
    let took = sent.elapsed();
    sleeper.await.unwrap();
    assert!(
        took >= TIMEOUT / 3,
        "the release was on its way for a whole renewal period: {took:?}"
    );
    // The first renewal the server runs after the release's DEL (the tick
    // queued behind it) carries only the other lock.
    let mut released = false;
    let followed = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next().await {
            let on_stopped = line.args.get(1).is_some_and(|arg| arg == "stopped");
            if line.from_script && line.command() == "del" && on_stopped {
                released = true;
            } else if released && line.command() == "evalsha" && line.args[1] == renew_sha {
                assert!(
                    !line.has_arg("stopped"),
                    "a renewal of the released lock ran right after its release: {line:?}"
                );
                return;
            } else if released && line.from_script && on_stopped {
                panic!("a renewal of the released lock ran after its release: {line:?}");
            }
        }
    });
    followed
        .await
        .expect("the release, then a renewal of the other lock, went by");
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
    // Told by a renewal that found the lock gone, not by the fallback
    // that fires once the last confirmed TTL may have run out.
    assert_eq!(
        guard.valid_until(),
        None,
        "lost() fired because a renewal found the lock gone"
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

// ---------------------------------------------------------------------------
// Regressions of defects an audit reproduced: each failed before its fix.

/// A client used on one runtime, then on another (a client in a `static`
/// shared by `#[tokio::test]`s): locks taken on the second are renewed, and
/// the pool's first use there works.
#[test]
fn the_watchdog_survives_its_first_runtime() {
    let first = current_thread_runtime();
    let server = first.block_on(server());
    let node = node(&server);
    let client = client_with_watchdog(Duration::from_millis(900));
    let lock = client.lock(&node, "runtimes").unwrap();
    first.block_on(async {
        lock.lock().await.unwrap().unlock().await.unwrap();
        // Hold briefly so the timer is running when the runtime goes.
        let guard = lock.lock().await.unwrap();
        guard.unlock().await.unwrap();
    });
    drop(first);

    let second = current_thread_runtime();
    second.block_on(async {
        let guard = lock
            .lock()
            .await
            .expect("the pool hands out no connection of the dead runtime");
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        assert!(
            tokio::time::timeout(Duration::ZERO, guard.lost())
                .await
                .is_err(),
            "renewed on the second runtime"
        );
        assert!(lock.is_locked().await.unwrap(), "the key was renewed");
        guard.unlock().await.unwrap();
    });
}

#[tokio::test]
async fn one_bad_key_does_not_spoil_a_renewal_batch() {
    let server = server().await;
    let node = node(&server);
    let client = client(); // 1 s watchdog
    let mut guards = Vec::new();
    for i in 0..20 {
        let lock = client.lock(&node, format!("batch:{i}")).unwrap();
        guards.push(lock.lock().await.unwrap());
    }
    let mut conn = raw(&server.url()).await;
    redis::pipe()
        .cmd("DEL")
        .arg("batch:7")
        .cmd("SET")
        .arg("batch:7")
        .arg("not a lock")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(3), guards[7].lost())
        .await
        .expect("the replaced lock is lost");
    tokio::time::sleep(WATCHDOG * 5 / 2).await;
    for (i, guard) in guards.iter().enumerate() {
        if i == 7 {
            continue;
        }
        assert!(
            exists(&server.url(), &format!("batch:{i}")).await,
            "lock {i} expired"
        );
        assert!(
            tokio::time::timeout(Duration::ZERO, guard.lost())
                .await
                .is_err(),
            "guard {i} fired lost()"
        );
    }
}

/// A renewal's reply updates only the hold it renewed. A watchdog hold is
/// force-unlocked, the next renewal finds it gone (it answers 0), and a
/// proxy holds that reply back while the same owner takes the lock again,
/// with a 60 s lease, on another connection. The late reply must not mark
/// the new hold gone: its unlock must free the lock at once.
#[tokio::test]
async fn a_late_renewal_reply_leaves_a_later_hold_of_its_owner_alone() {
    // A tick every 2 s; the held-back reply comes 2 s late, within the
    // node's 5 s response timeout and before the holds' trusted TTLs run
    // out (a reply later than that would leave them lost for good).
    const TIMEOUT: Duration = Duration::from_secs(6);
    const HELD_BACK: Duration = Duration::from_secs(2);
    let server = server().await;
    let url = server.url();
    let proxy = TcpProxy::start(server.port()).await.unwrap();
    // Two shared connections: a lock's requests keep to the one its name
    // picks ("ticking": the first, "regrant": the second), renewal batches
    // take them in turn, the first batch the first one.
    let node = multilock::Node::builder(proxy.url())
        .shared_connections(2)
        .connect_timeout(PATIENCE)
        .response_timeout(PATIENCE)
        .build()
        .unwrap();
    let client = client_with_watchdog(TIMEOUT);
    let (_, renew_sha) = script("renew_batch");
    // Another hold in the same batch: its guard's validity moves forward
    // once the batch's reply has been handled.
    let marker = client.lock(&node, "ticking").unwrap().lock().await.unwrap();
    let lock = client
        .lock(&node, "regrant")
        .unwrap()
        .with_owner(multilock::Owner::new("w").unwrap());
    let _first = lock.lock().await.unwrap();
    let mut lines = monitor(&url).await;
    assert!(
        multilock::Client::new()
            .lock(&node_at(&url, PATIENCE), "regrant")
            .unwrap()
            .force_unlock()
            .await
            .unwrap()
    );
    proxy.set_delay(Direction::ToClient, Delay::fixed(HELD_BACK));
    // The first tick's renewal runs on the server after the force unlock.
    let mut deleted = false;
    let renewal = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next().await {
            if line.command() == "del" && line.has_arg("regrant") {
                deleted = true;
            } else if line.command() == "evalsha" && line.args[1] == renew_sha {
                return line;
            }
        }
        panic!("MONITOR ended");
    })
    .await
    .expect("a renewal within PATIENCE");
    assert!(deleted, "the force unlock ran before the renewal");
    assert!(
        renewal.has_arg("regrant") && renewal.has_arg("ticking"),
        "{renewal:?}"
    );
    // A round trip to the server: the proxy has read the renewal's reply
    // meanwhile (it stays delayed); later replies pass at once.
    let _: String = run(&url, &redis::cmd("PING")).await.unwrap();
    proxy.set_delay(Direction::ToClient, Delay::NONE);
    let marker_before = marker.valid_until().unwrap();
    let second = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    assert_eq!(
        marker.valid_until(),
        Some(marker_before),
        "setup: the second hold was granted while the renewal's reply was held back"
    );
    eventually(
        PATIENCE,
        |_: &()| "the held-back renewal reply was not handled".to_owned(),
        || async {
            if marker.valid_until() > Some(marker_before) {
                Ok(())
            } else {
                Err(())
            }
        },
    )
    .await;
    let unlocked = second.unlock().await;
    assert!(
        unlocked.is_ok(),
        "the later hold's unlock, after the earlier hold's late renewal reply: {unlocked:?}"
    );
    assert!(
        !exists(&url, "regrant").await,
        "the key is gone right after the later hold's unlock (PTTL {} ms)",
        pttl(&url, "regrant").await
    );
    marker.unlock().await.unwrap();
}

/// Issue 34, defect 5, with a slow node: a renewal the server applied in
/// time but whose reply came after the hold's trusted TTL ran out. `lost()`
/// fired at that moment (the client could not prove the hold), so the
/// guard stays lost when the reply comes: `valid_until()` never moves
/// ahead again and `nodes()` stays empty, though the key lived throughout.
/// Before the fix, the late reply moved `valid_until()` ~0.5 s ahead of a
/// guard whose `lost()` had fired.
#[tokio::test]
async fn a_renewal_answered_after_the_trust_ran_out_does_not_revive_the_guard() {
    const TIMEOUT: Duration = Duration::from_secs(3);
    let server = server().await;
    let url = server.url();
    let proxy = TcpProxy::start(server.port()).await.unwrap();
    let node = multilock::Node::builder(proxy.url())
        .connect_timeout(PATIENCE)
        .response_timeout(PATIENCE)
        .build()
        .unwrap();
    let lock = client_with_watchdog(TIMEOUT)
        .lock(&node, "late-proof")
        .unwrap();
    let guard = lock.lock().await.unwrap();
    // The first renewal (at 1 s) reaches the server at once; its reply
    // comes 2.5 s later, after the grant's trust ran out (~3 s).
    proxy.set_delay(
        Direction::ToClient,
        Delay::fixed(Duration::from_millis(2500)),
    );
    tokio::time::timeout(PATIENCE, guard.lost())
        .await
        .expect("lost() once the trusted TTL ran out with no renewal answered");
    proxy.set_delay(Direction::ToClient, Delay::NONE);
    // Past every reply held back (the last one sent before the delay went
    // away comes by 2.5 s from now), and one more renewal.
    let watch_until = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < watch_until {
        let now = std::time::Instant::now();
        if let Some(until) = guard.valid_until() {
            assert!(
                until <= now,
                "lost() fired, yet a late renewal reply moved valid_until() {:?} ahead",
                until - now
            );
        }
        assert!(guard.nodes().is_empty(), "{:?}", guard.nodes());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        pttl(&url, "late-proof").await > 0,
        "the key lived throughout: the renewals reached the server"
    );
    guard.unlock().await.unwrap();
    assert!(!exists(&url, "late-proof").await);
}
