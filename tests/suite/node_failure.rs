//! A node that goes down gives typed errors, and works again, waiting via
//! pub/sub included, once it is back.

use std::time::{Duration, Instant};

use crate::common::*;
use multilock::{Client, Error, Node, Owner};
use multilock_testkit::{RedisProcess, TcpProxy, TestServer, poll_until, protocol};

#[tokio::test]
async fn down_then_back() {
    let mut server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "phoenix").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();

    server.kill().await.unwrap();
    let err = lock.try_lock().await.unwrap_err();
    assert!(err.is_node_unavailable(), "{err:?}");
    let err = lock.is_locked().await.unwrap_err();
    assert!(err.is_node_unavailable(), "{err:?}");

    server.restart().await.unwrap();
    // The pool drops broken connections and makes new ones. A long lease:
    // a waiter not woken by pub/sub would wait for all of it.
    let guard = lock_once_back(&lock, "phoenix").await;

    // Waiting via pub/sub works on the new server: the shared subscription
    // reconnected and subscribes again.
    let other = Client::new().lock(&node, "phoenix").unwrap();
    let waiter = tokio::spawn(async move {
        let got = other.lock().await.unwrap();
        let at = Instant::now();
        got.unlock().await.unwrap();
        at
    });
    wait_for_listeners(&server.url(), "phoenix", 1).await;
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(
        granted - released < Duration::from_secs(3),
        "woken by pub/sub after the restart, not the 60 s lease: {:?}",
        granted - released
    );
}

/// The shared subscription connection is lost while waiters wait (killed
/// server-side): they are woken to re-check, keep waiting, the subscription
/// comes back by itself, and the next release wakes them promptly.
#[tokio::test]
async fn waiters_survive_a_lost_subscription() {
    let server = server().await;
    let node = node(&server);
    let lock = client().lock(&node, "survivor").unwrap();
    let holder = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let other = Client::new().lock(&node, "survivor").unwrap();
    let waiter = tokio::spawn(async move {
        let got = other
            .try_lock_for(Duration::from_secs(20), Some(Duration::from_secs(5)))
            .await;
        (Instant::now(), got)
    });
    wait_for_listeners(&server.url(), "survivor", 1).await;
    let mut conn = raw(&server.url()).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(killed, 1, "one subscription connection for the node");
    // Resubscribed within its backoff.
    wait_for_listeners(&server.url(), "survivor", 1).await;
    assert!(!waiter.is_finished(), "the waiter still waits");
    let released = Instant::now();
    holder.unlock().await.unwrap();
    let (granted, got) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    got.unwrap().expect("granted").unlock().await.unwrap();
    assert!(
        granted - released < Duration::from_secs(3),
        "woken by pub/sub, not the 60 s lease: {:?}",
        granted - released
    );
}

/// A waiter whose node restarts (empty: the holder's key is gone) is
/// granted once the node is back, promptly: the restart is part of its
/// wait, never an error, never a hang.
#[tokio::test]
async fn a_waiter_is_granted_promptly_after_a_restart() {
    let mut server = server().await;
    let node = node(&server);
    let holder = client()
        .lock(&node, "restarted")
        .unwrap()
        .lock_with_lease(Duration::from_secs(30))
        .await
        .unwrap();
    let other = Client::new().lock(&node, "restarted").unwrap();
    let waiter = tokio::spawn(async move {
        other
            .try_lock_for(Duration::from_secs(60), Some(Duration::from_secs(5)))
            .await
    });
    wait_for_listeners(&server.url(), "restarted", 1).await;
    server.restart().await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("no hang")
        .unwrap();
    match outcome {
        Ok(Some(guard)) => guard.unlock().await.unwrap(),
        other => panic!("not granted through the restart: {other:?}"),
    }
    drop(holder);
}

/// The acquire that timed out at the frozen node leases for a minute once
/// the node applies it: only its rollback frees the lock in time.
#[tokio::test]
async fn paused_node_times_out_and_recovers() {
    let mut server = server().await;
    let node = node(&server); // 500 ms response timeout
    let lock = long_lease_client().lock(&node, "frozen").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    server.pause().await.unwrap();
    let started = Instant::now();
    let err = lock.try_lock().await.unwrap_err();
    assert!(err.is_node_unavailable(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    // The timeout made the node suspect: requests fail at once, sending
    // nothing, until a probe finds it answering again.
    assert!(matches!(node.health(), multilock::Health::Suspect { .. }));
    let again = lock.try_lock().await.unwrap_err();
    assert!(
        matches!(
            again,
            multilock::Error::NodeUnavailable {
                reason: multilock::Unavailable::Suspect,
                ..
            }
        ),
        "{again:?}"
    );
    server.unpause().await.unwrap();
    wait_healthy(&node).await;
    // The timed-out acquire is applied once the node resumed; it is rolled
    // back on its own connection, so the lock ends up free.
    let other = Client::new().lock(&node, "frozen").unwrap();
    take_and_release(&other, PATIENCE, "free after the rollback").await;
    assert!(!exists(&server.url(), "frozen").await);
}

// ---------------------------------------------------------------------------
// Regressions of defects an audit reproduced: each failed before its fix.

/// A foreign (Redisson-style) hold of `key` for 30 s.
async fn foreign_hold(server: &RedisProcess, key: &str) {
    let mut conn = raw(&server.url()).await;
    let _: () = redis::pipe()
        .cmd("HSET")
        .arg(key)
        .arg("b9f8c4e2-java-client:1")
        .arg(1)
        .ignore()
        .cmd("PEXPIRE")
        .arg(key)
        .arg(30_000)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Its release, as Redisson's unlock does it: DEL and PUBLISH.
async fn foreign_release(server: &RedisProcess, key: &str) {
    let mut conn = raw(&server.url()).await;
    let _: () = redis::pipe()
        .cmd("DEL")
        .arg(key)
        .ignore()
        .cmd("PUBLISH")
        .arg(protocol::channel(key))
        .arg("0")
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// The ids of the pub/sub clients subscribed to `key`'s channel.
async fn subscriber_ids(server: &RedisProcess) -> Vec<String> {
    let list: String = run(
        &server.url(),
        redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg("pubsub"),
    )
    .await
    .unwrap();
    list.lines()
        .filter_map(|line| line.split(' ').find_map(|kv| kv.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}

/// The re-entrant acquire is sent while the server sleeps with an empty
/// script cache: it times out and is never applied (NOSCRIPT). Its rollback
/// must not lower the outer hold.
#[tokio::test]
async fn the_rollback_of_an_unapplied_reentry_spares_the_outer_hold() {
    let server = debuggable_server().await;
    let node = node(&server); // 500 ms response timeout
    // One owner for both acquires: the second is a re-entry of the first.
    let lock = client()
        .lock(&node, "reentry")
        .unwrap()
        .with_owner(Owner::new("job").unwrap());
    let outer = lock.lock_with_lease(Duration::from_secs(20)).await.unwrap();
    let _: () = run(&server.url(), redis::cmd("SCRIPT").arg("FLUSH"))
        .await
        .unwrap();
    let sleeper = debug_sleep(&server, 1.5).await;
    // One attempt (a wait would go on through the timeout).
    let err = lock.try_lock().await.unwrap_err();
    assert!(err.is_node_unavailable(), "{err}");
    sleeper.await.unwrap();
    // Whatever the rollback does, it does within a few seconds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        exists(&server.url(), "reentry").await,
        "the outer hold is gone"
    );
    assert_eq!(lock.hold_count().await.unwrap(), 1, "the outer hold only");
    let rival = Client::new().lock(&node, "reentry").unwrap();
    assert!(rival.try_lock().await.unwrap().is_none());
    outer.unlock().await.unwrap();
    assert!(!exists(&server.url(), "reentry").await);
}

/// A release that timed out on a server that never ran the release script
/// (a cold script cache) is applied once the server answers.
#[tokio::test]
async fn a_timed_out_release_on_a_cold_script_cache_is_applied() {
    let server = debuggable_server().await;
    let node = node(&server);
    let lock = client().lock(&node, "cold").unwrap();
    let guard = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
    let _: () = run(&server.url(), redis::cmd("SCRIPT").arg("FLUSH"))
        .await
        .unwrap();
    let sleeper = debug_sleep(&server, 1.5).await;
    let _ = guard.unlock().await;
    sleeper.await.unwrap();
    poll_until(
        Duration::from_secs(5),
        || "the release was lost: the key lives for its 30 s lease".into(),
        || async { (!exists(&server.url(), "cold").await).then_some(()) },
    )
    .await
    .unwrap();
}

/// A restarted server has an empty script cache. A new connection loads
/// every script before it is used, so no request meets NOSCRIPT (an
/// EVALSHA that met it and timed out before its reload would never run,
/// and its rollback could not tell).
#[tokio::test]
async fn new_connections_load_the_scripts_before_any_script_call() {
    let mut server = server().await;
    let node = node(&server);
    let lock = client().lock(&node, "cached").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    server.kill().await.unwrap();
    server.restart().await.unwrap();
    // A plain command (EXISTS) on a new connection: no script is sent.
    eventually(
        PATIENCE,
        |err: &multilock::Error| format!("still failing after the restart: {err}"),
        || async { lock.is_locked().await },
    )
    .await;
    let hashes: Vec<String> = protocol::scripts()
        .into_iter()
        .map(|(_, _, hash)| hash)
        .collect();
    let loaded: Vec<bool> = run(
        &server.url(),
        redis::cmd("SCRIPT").arg("EXISTS").arg(&hashes),
    )
    .await
    .unwrap();
    assert!(
        loaded.iter().all(|loaded| *loaded),
        "scripts missing after the new connection was made: {loaded:?}"
    );
}

/// The subscription connection is lost while a waiter waits, and the lock
/// is released before it comes back (the server refuses new connections
/// meanwhile): the unlock message reached nobody. When the subscription is
/// confirmed again the waiter re-checks, instead of sleeping out the
/// holder's 30 s TTL.
#[tokio::test]
async fn waiters_recheck_when_their_subscription_comes_back() {
    let server = server().await;
    let node = node(&server);
    foreign_hold(&server, "resubscribed").await;
    let lock = client().lock(&node, "resubscribed").unwrap();
    let waiter = tokio::spawn(async move {
        lock.try_lock_for(Duration::from_secs(25), Some(Duration::from_secs(5)))
            .await
    });
    wait_for_listeners(&server.url(), "resubscribed", 1).await;
    let mut admin = raw(&server.url()).await;
    let clients: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut admin)
        .await
        .unwrap();
    let connected: u64 = clients
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let script_calls = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
            .and_then(|stats| stats.split(',').find_map(|kv| kv.strip_prefix("calls=")))
            .map_or(0, |calls| calls.parse().unwrap())
    };
    let info = |conn: redis::aio::MultiplexedConnection| async move {
        redis::cmd("INFO")
            .arg("commandstats")
            .query_async::<String>(&mut conn.clone())
            .await
            .unwrap()
    };
    let attempts_before = script_calls(info(admin.clone()).await);
    // The subscription goes, and no new connection comes in its place.
    let _: () = redis::pipe()
        .cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(connected - 1)
        .ignore()
        .cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .ignore()
        .query_async(&mut admin)
        .await
        .unwrap();
    // The disconnection woke the waiter, which checked again (still held)
    // and went back to waiting: only then is the lock released.
    poll_until(
        Duration::from_secs(5),
        || "the waiter never checked again after the disconnection".into(),
        || async { (script_calls(info(admin.clone()).await) > attempts_before).then_some(()) },
    )
    .await
    .unwrap();
    let _: () = redis::pipe()
        .cmd("DEL")
        .arg("resubscribed")
        .ignore()
        .cmd("PUBLISH")
        .arg(protocol::channel("resubscribed"))
        .arg("0")
        .ignore()
        .query_async(&mut admin)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    if waiter.is_finished() {
        panic!("nobody told the waiter yet: {:?}", waiter.await);
    }
    let restored = Instant::now();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(10_000)
        .query_async(&mut admin)
        .await
        .unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is not sleeping out the 30 s TTL")
        .unwrap()
        .unwrap();
    assert!(granted.is_some());
    assert!(
        restored.elapsed() < Duration::from_secs(5),
        "woken by the new subscription: {:?}",
        restored.elapsed()
    );
}

/// A NAT drops the idle connections without telling anyone: the keepalive
/// PING finds the subscription dead, the connection is rebuilt, and a
/// release published afterwards wakes the waiter (which, like any caller of
/// a single-node lock, retries the node errors of its own dropped command
/// connection).
#[tokio::test]
async fn a_silently_dropped_subscription_is_noticed() {
    let server = server().await;
    let proxy = TcpProxy::start(server.port()).await.unwrap();
    let node = Node::builder(proxy.url())
        .response_timeout(Duration::from_millis(500))
        .keepalive(Duration::from_millis(500))
        .build()
        .unwrap();
    foreign_hold(&server, "nat").await;
    let lock = client().lock(&node, "nat").unwrap();
    let waiter = tokio::spawn(async move {
        loop {
            match lock
                .try_lock_for(Duration::from_secs(25), Some(Duration::from_secs(5)))
                .await
            {
                Err(err) if err.is_node_unavailable() => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                outcome => break outcome,
            }
        }
    });
    wait_for_listeners(&server.url(), "nat", 1).await;
    let before = subscriber_ids(&server).await;
    proxy.drop_connections();
    poll_until(
        Duration::from_secs(10),
        || "the dropped subscription was never rebuilt".into(),
        || async {
            let now = subscriber_ids(&server).await;
            (now.len() == 1 && now != before).then_some(())
        },
    )
    .await
    .unwrap();
    wait_for_listeners(&server.url(), "nat", 1).await;
    let released = Instant::now();
    foreign_release(&server, "nat").await;
    let granted = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken by pub/sub, not the 30 s TTL")
        .unwrap()
        .unwrap();
    assert!(granted.is_some());
    assert!(released.elapsed() < Duration::from_secs(5));
}

/// A black-holed node (no RST, nothing answers): a bounded wait ends near
/// its bound, not after the connect and reply timeouts (3 s each here). The
/// caller's bound is no verdict on the node (a short wait on a busy machine
/// would otherwise make a healthy node look down): the wait ends empty, and
/// the node's own reply timeout, which the attempt left in flight meets in
/// the background, makes it suspect; requests then fail at once.
#[tokio::test]
async fn a_bounded_wait_ends_by_its_deadline_on_a_black_holed_node() {
    let server = server().await;
    let proxy = TcpProxy::start(server.port()).await.unwrap();
    let node = Node::new(&proxy.url()).unwrap(); // 3 s timeouts
    let lock = client().lock(&node, "black-hole").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    proxy.black_hole();
    let started = Instant::now();
    let outcome = lock
        .try_lock_for(Duration::from_millis(300), Some(Duration::from_secs(5)))
        .await;
    let took = started.elapsed();
    assert!(matches!(&outcome, Ok(None)), "{outcome:?}");
    assert!(took < Duration::from_millis(1_500), "took {took:?}");
    eventually(
        Duration::from_secs(10),
        |health: &multilock::Health| format!("still {health:?} after its reply timeout"),
        || async {
            match node.health() {
                multilock::Health::Healthy => Err(multilock::Health::Healthy),
                suspect => Ok(suspect),
            }
        },
    )
    .await;
    let refused = lock.try_lock().await;
    assert!(
        matches!(
            &refused,
            Err(Error::NodeUnavailable {
                reason: multilock::Unavailable::Suspect,
                ..
            })
        ),
        "{refused:?}"
    );
}

/// Requests on a dead server until `node` is suspect (the first may meet
/// the broken connection; a refused one makes the node suspect).
async fn wait_suspect(lock: &multilock::Lock, node: &Node) {
    eventually(
        PATIENCE,
        |health: &multilock::Health| format!("the server is down, the node {health:?}"),
        || async {
            let refused = lock.try_lock().await.unwrap_err();
            assert!(refused.is_node_unavailable(), "{refused:?}");
            match node.health() {
                multilock::Health::Healthy => Err(multilock::Health::Healthy),
                _ => Ok(()),
            }
        },
    )
    .await;
}

/// Tries `lock` until it is granted (and unlocks it), within `limit`.
async fn wait_granted_again(lock: &multilock::Lock, limit: Duration) {
    eventually(
        limit,
        |err: &Error| format!("the node came back, its requests still fail: {err}"),
        || async {
            match lock.try_lock().await {
                Ok(guard) => {
                    guard.expect("free").unlock().await.unwrap();
                    Ok(())
                }
                Err(err) => Err(err),
            }
        },
    )
    .await;
}

/// A node that went suspect under a runtime that then ended (a static
/// `Node` shared by `#[tokio::test]`s, each on its own runtime) is probed
/// again from the next runtime that uses it: its requests go through once
/// its server answers. (On 88e8a7e the probe died with the first runtime,
/// and every later request was refused as `Suspect`, for good.)
#[test]
fn a_suspicion_is_probed_again_on_the_next_runtime() {
    let first = current_thread_runtime();
    let mut server = first.block_on(server());
    let node = node(&server);
    let lock = client().lock(&node, "outlived").unwrap();
    first.block_on(async {
        lock.lock().await.unwrap().unlock().await.unwrap();
        server.kill().await.unwrap();
        wait_suspect(&lock, &node).await;
    });
    drop(first);
    current_thread_runtime().block_on(async {
        server.restart().await.unwrap();
        wait_granted_again(&lock, Duration::from_secs(10)).await;
    });
}

/// As above, with the first runtime kept but no longer driven (a
/// current-thread runtime between two `block_on`s): its probe is alive but
/// stalled, and a request on a driven runtime starts another. (Found by
/// audit: the parked probe counted as running, and the node stayed suspect.)
#[test]
fn a_probe_stalled_on_an_idle_runtime_is_replaced() {
    let idle = current_thread_runtime();
    let driven = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut server = driven.block_on(server());
    let node = node(&server);
    let lock = client().lock(&node, "idle-runtime").unwrap();
    driven.block_on(async { lock.lock().await.unwrap().unlock().await.unwrap() });
    driven.block_on(server.kill()).unwrap();
    // The suspicion, and so the probe, begins on the runtime left idle.
    idle.block_on(wait_suspect(&lock, &node));
    driven.block_on(async {
        server.restart().await.unwrap();
        wait_granted_again(&lock, Duration::from_secs(15)).await;
    });
    drop(idle);
}
