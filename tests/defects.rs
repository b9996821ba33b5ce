//! Reproductions of the defects an audit found, each written to fail on the
//! code it was found in, and kept as regression tests.

mod common;

use std::time::{Duration, Instant};

use common::*;
use multilock::testkit::{RedisProcess, TestServer, poll_until, protocol};
use multilock::{Client, Error, Node};

fn client_with_watchdog(timeout: Duration) -> Client {
    Client::builder().watchdog_timeout(timeout).build().unwrap()
}

async fn command<T: redis::FromRedisValue>(server: &RedisProcess, cmd: &redis::Cmd) -> T {
    let mut conn = raw(server).await;
    cmd.query_async(&mut conn).await.unwrap()
}

/// A server that accepts `DEBUG SLEEP` (Redis 7 refuses DEBUG by default).
async fn debuggable_server() -> RedisProcess {
    RedisProcess::start_with_args(|_| vec!["--enable-debug-command".into(), "yes".into()])
        .await
        .unwrap()
}

/// Freezes `server` for `seconds` from another connection; returns once the
/// server is asleep (a PING on a third connection no longer answers).
async fn debug_sleep(server: &RedisProcess, seconds: f64) -> tokio::task::JoinHandle<()> {
    // No response timeout: the reply comes when the sleep ends.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let sleeper = tokio::spawn(async move {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(seconds)
            .query_async::<()>(&mut admin)
            .await
            .expect("DEBUG SLEEP");
    });
    let probe = multilock::testkit::PollLimit::new(Duration::from_secs(5));
    loop {
        let ping = async {
            let mut conn = raw(server).await;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        if tokio::time::timeout(Duration::from_millis(100), ping)
            .await
            .is_err()
        {
            break;
        }
        probe
            .tick(|| "the server never fell asleep".into())
            .await
            .unwrap();
    }
    sleeper
}

async fn pttl(server: &RedisProcess, key: &str) -> i64 {
    command(server, redis::cmd("PTTL").arg(key)).await
}

// ---------------------------------------------------------------------------
// 1. A shorter lease cuts a longer hold.

/// Outer `lock()` under a 3 s watchdog; in the same task a 300 ms re-entry
/// and its unlock. The key must keep the outer hold's TTL: no other client
/// gets in while the outer guard reports validity.
#[tokio::test]
async fn a_short_reentry_does_not_cut_a_watchdog_hold() {
    let server = server().await;
    let node = node(&server);
    let lock = client_with_watchdog(Duration::from_secs(3))
        .lock(&node, "cut")
        .unwrap();
    let outer = lock.lock().await.unwrap();
    let inner = lock
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    inner.unlock().await.unwrap();
    assert!(
        pttl(&server, "cut").await > 1_000,
        "the re-entry cut the TTL"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let rival = Client::new().lock(&node, "cut").unwrap();
    assert!(
        rival.try_lock().await.unwrap().is_none(),
        "a second client got in while the outer guard holds"
    );
    assert!(
        tokio::time::timeout(Duration::ZERO, outer.lost())
            .await
            .is_err()
    );
    outer.unlock().await.unwrap();
    assert!(!exists(&server, "cut").await);
}

/// Outer 10 s lease, inner 200 ms dropped: the key keeps the outer's lease.
#[tokio::test]
async fn a_short_reentry_does_not_cut_a_fixed_lease() {
    let server = server().await;
    let node = node(&server);
    let lock = client().lock(&node, "cut-fixed").unwrap();
    let outer = lock.lock_with_lease(Duration::from_secs(10)).await.unwrap();
    drop(
        lock.lock_with_lease(Duration::from_millis(200))
            .await
            .unwrap(),
    );
    poll_until(
        Duration::from_secs(5),
        || "the dropped inner hold was not released".into(),
        || async { (lock.hold_count().await.unwrap() == 1).then_some(()) },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let rival = Client::new().lock(&node, "cut-fixed").unwrap();
    assert!(
        rival.try_lock().await.unwrap().is_none(),
        "a second client got in within the outer lease"
    );
    outer.unlock().await.unwrap();
}

/// The same on every node of a RedLock.
#[tokio::test]
async fn a_short_reentry_does_not_cut_a_red_lock() {
    let servers = servers(3).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    let red = client().red_lock_on(&nodes, "cut-red").unwrap();
    let outer = red.lock_with_lease(Duration::from_secs(10)).await.unwrap();
    red.lock_with_lease(Duration::from_millis(200))
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let rival = Client::new().red_lock_on(&nodes, "cut-red").unwrap();
    assert!(
        rival.try_lock().await.unwrap().is_none(),
        "a second client got a majority within the outer lease"
    );
    for s in &servers {
        assert!(pttl(s, "cut-red").await > 5_000);
    }
    outer.unlock().await.unwrap();
}

/// Re-entry with a longer lease extends the key; the outer guard's unlock
/// then releases a held lock (it used to report `NotHeld` and leave the key
/// for the inner lease).
#[tokio::test]
async fn the_outer_guard_follows_a_longer_reentry() {
    let server = server().await;
    let node = node(&server);
    let lock = client().lock(&node, "longer").unwrap();
    let outer = lock
        .lock_with_lease(Duration::from_millis(500))
        .await
        .unwrap();
    lock.lock_with_lease(Duration::from_secs(20))
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(exists(&server, "longer").await, "the longer lease holds it");
    let valid_until = outer.valid_until().expect("a fixed lease has an end");
    assert!(
        valid_until > std::time::Instant::now() + Duration::from_secs(10),
        "the outer guard's validity follows the key"
    );
    outer.unlock().await.unwrap();
    assert!(!exists(&server, "longer").await);
}

// ---------------------------------------------------------------------------
// 2. The watchdog dies with the first runtime.

/// A client used on one runtime, then on another (a client in a `static`
/// shared by `#[tokio::test]`s): locks taken on the second are renewed, and
/// the pool's first use there works.
#[test]
fn the_watchdog_survives_its_first_runtime() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
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

    let second = runtime();
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

// ---------------------------------------------------------------------------
// 3. One key of the wrong type poisons a renewal batch.

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
    let mut conn = raw(&server).await;
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
            exists(&server, &format!("batch:{i}")).await,
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

// ---------------------------------------------------------------------------
// 4. A timed-out re-entrant acquire can release the outer hold.

/// The re-entrant acquire is sent while the server sleeps with an empty
/// script cache: it times out and is never applied (NOSCRIPT). Its rollback
/// must not lower the outer hold.
#[tokio::test]
async fn the_rollback_of_an_unapplied_reentry_spares_the_outer_hold() {
    let server = debuggable_server().await;
    let node = node(&server); // 500 ms response timeout
    let lock = client().lock(&node, "reentry").unwrap();
    let outer = lock.lock_with_lease(Duration::from_secs(20)).await.unwrap();
    let _: () = command(&server, redis::cmd("SCRIPT").arg("FLUSH")).await;
    let sleeper = debug_sleep(&server, 1.5).await;
    let err = lock
        .lock_with_lease(Duration::from_secs(20))
        .await
        .unwrap_err();
    assert!(err.is_node_unavailable(), "{err}");
    sleeper.await.unwrap();
    // Whatever the rollback does, it does within a few seconds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(exists(&server, "reentry").await, "the outer hold is gone");
    assert_eq!(lock.hold_count().await.unwrap(), 1, "the outer hold only");
    let rival = Client::new().lock(&node, "reentry").unwrap();
    assert!(rival.try_lock().await.unwrap().is_none());
    outer.unlock().await.unwrap();
    assert!(!exists(&server, "reentry").await);
}

/// A release that timed out on a server that never ran the release script
/// (a cold script cache) is applied once the server answers.
#[tokio::test]
async fn a_timed_out_release_on_a_cold_script_cache_is_applied() {
    let server = debuggable_server().await;
    let node = node(&server);
    let lock = client().lock(&node, "cold").unwrap();
    let guard = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
    let _: () = command(&server, redis::cmd("SCRIPT").arg("FLUSH")).await;
    let sleeper = debug_sleep(&server, 1.5).await;
    let _ = guard.unlock().await;
    sleeper.await.unwrap();
    poll_until(
        Duration::from_secs(5),
        || "the release was lost: the key lives for its 30 s lease".into(),
        || async { (!exists(&server, "cold").await).then_some(()) },
    )
    .await
    .unwrap();
}

// ---------------------------------------------------------------------------
// 5. Fencing tokens go backwards.

/// Node 1 of 3 has seen token 100 under another holder; our quorum is nodes
/// 0 and 2. The token handed out must exceed 100.
#[tokio::test]
async fn a_fencing_token_exceeds_every_counter_reported() {
    let servers = servers(3).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    let rival = Client::new()
        .lock(&nodes[1], "fenced")
        .unwrap()
        .lock_with_lease(Duration::from_secs(30))
        .await
        .unwrap();
    let _: () = command(
        &servers[1],
        redis::cmd("SET")
            .arg(protocol::token_key("fenced"))
            .arg(100),
    )
    .await;
    let red = client()
        .red_lock_on(&nodes, "fenced")
        .unwrap()
        .with_fencing();
    let guard = red
        .try_lock_for(Duration::from_secs(2), Some(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("nodes 0 and 2 are a majority");
    let token = guard.fencing_token().unwrap();
    assert!(
        token > 100,
        "token {token} is not above the 100 seen on node 1"
    );
    guard.unlock().await.unwrap();
    drop(rival);
}

/// The chaos run's sequence, made deterministic: A is granted while nodes 1
/// and 3 are down; they come back empty; node 4 dies (A's `lost()` fires)
/// and comes back empty after longer than the watchdog timeout; B is granted
/// on 1, 3 and 4. B's token must be above A's.
#[tokio::test]
async fn tokens_keep_increasing_when_restarted_nodes_form_the_next_quorum() {
    let mut servers = servers(5).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    let watchdog = Duration::from_secs(3);
    let a_red = client_with_watchdog(watchdog)
        .red_lock_on(&nodes, "chaos")
        .unwrap()
        .with_fencing();
    // Past tokens: the counters are well above 1 on every node.
    for _ in 0..5 {
        a_red.lock().await.unwrap().unlock().await.unwrap();
    }
    servers[1].kill().await.unwrap();
    servers[3].kill().await.unwrap();
    let a = tokio::time::timeout(Duration::from_secs(10), a_red.lock())
        .await
        .expect("nodes 0, 2 and 4 grant")
        .unwrap();
    let a_token = a.fencing_token().unwrap();
    tokio::time::sleep(watchdog + Duration::from_millis(600)).await;
    servers[1].restart().await.unwrap();
    servers[3].restart().await.unwrap();
    servers[4].kill().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), a.lost())
        .await
        .expect("A learns it is below quorum");
    tokio::time::sleep(watchdog + Duration::from_millis(600)).await;
    servers[4].restart().await.unwrap();
    let b_red = client_with_watchdog(watchdog)
        .red_lock_on(&nodes, "chaos")
        .unwrap()
        .with_fencing();
    let b = b_red
        .try_lock_for(Duration::from_secs(10), None)
        .await
        .unwrap()
        .expect("nodes 1, 3 and 4 are free");
    let b_token = b.fencing_token().unwrap();
    assert!(
        b_token > a_token,
        "B's token {b_token} is not above A's {a_token}"
    );
    drop(a);
    drop(b);
}

// ---------------------------------------------------------------------------
// 6. `with_replica_sync(n, Duration::MAX)` panics after the grant.

#[tokio::test]
async fn an_unbounded_replica_sync_timeout_is_rejected() {
    let server = server().await;
    let node = node(&server);
    let lock = client().lock(&node, "replicas").unwrap();
    let err = lock
        .with_replica_sync(1, Duration::MAX)
        .expect_err("an unbounded WAIT is bad input");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(!exists(&server, "replicas").await);
}

// ---------------------------------------------------------------------------
// 7. A quorum lock's `lock()` retries permanent errors forever.

#[tokio::test]
async fn a_red_lock_ends_its_wait_on_a_permanent_error() {
    let servers = servers(3).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    for s in &servers {
        let _: () = command(s, redis::cmd("SET").arg("typed").arg("a string")).await;
    }
    let red = client().red_lock_on(&nodes, "typed").unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), red.lock())
        .await
        .expect("lock() ended its wait");
    assert!(outcome.is_err(), "{outcome:?}");
}

#[tokio::test]
async fn a_red_lock_ends_its_wait_on_a_wrong_password() {
    let servers =
        futures::future::try_join_all((0..3).map(|_| {
            RedisProcess::start_with_args(|_| vec!["--requirepass".into(), "right".into()])
        }))
        .await
        .unwrap();
    let nodes: Vec<Node> = servers
        .iter()
        .map(|s| {
            Node::builder(format!("redis://:wrong@127.0.0.1:{}", s.port()))
                .connect_timeout(Duration::from_millis(500))
                .response_timeout(Duration::from_millis(500))
                .build()
                .unwrap()
        })
        .collect();
    let red = client().red_lock_on(&nodes, "auth").unwrap();
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), red.lock())
        .await
        .expect("lock() ended its wait");
    let err = outcome.unwrap_err();
    assert!(!format!("{err} {err:?}").contains("wrong"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_lease_that_can_never_be_valid_is_bad_input() {
    let servers = servers(3).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    let red = client().red_lock_on(&nodes, "tiny").unwrap();
    let outcome = tokio::time::timeout(
        Duration::from_secs(5),
        red.lock_with_lease(Duration::from_millis(1)),
    )
    .await
    .expect("no endless retries");
    assert!(
        matches!(outcome, Err(Error::InvalidArgument(_))),
        "{outcome:?}"
    );
}

// ---------------------------------------------------------------------------
// Also fixed: the subscription, bounded waits, one server under two names.

/// A foreign (Redisson-style) hold of `key` for 30 s.
async fn foreign_hold(server: &RedisProcess, key: &str) {
    let mut conn = raw(server).await;
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
    let mut conn = raw(server).await;
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
    wait_for_listeners(&server, "resubscribed", 1).await;
    let mut admin = raw(&server).await;
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

/// The ids of the pub/sub clients subscribed to `key`'s channel.
async fn subscriber_ids(server: &RedisProcess) -> Vec<String> {
    let list: String = command(
        server,
        redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg("pubsub"),
    )
    .await;
    list.lines()
        .filter_map(|line| line.split(' ').find_map(|kv| kv.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}

/// A NAT drops the idle connections without telling anyone: the keepalive
/// PING finds the subscription dead, the connection is rebuilt, and a
/// release published afterwards wakes the waiter (which, like any caller of
/// a single-node lock, retries the node errors of its own dropped command
/// connection).
#[tokio::test]
async fn a_silently_dropped_subscription_is_noticed() {
    let server = server().await;
    let proxy = multilock::testkit::TcpProxy::start(server.port())
        .await
        .unwrap();
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
                Err(err) if err.is_node_unavailable() => continue,
                outcome => break outcome,
            }
        }
    });
    wait_for_listeners(&server, "nat", 1).await;
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
    wait_for_listeners(&server, "nat", 1).await;
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
/// its bound, not after the connect and reply timeouts (3 s each here).
#[tokio::test]
async fn a_bounded_wait_ends_by_its_deadline_on_a_black_holed_node() {
    let server = server().await;
    let proxy = multilock::testkit::TcpProxy::start(server.port())
        .await
        .unwrap();
    let node = Node::new(&proxy.url()).unwrap(); // 3 s timeouts
    let lock = client().lock(&node, "black-hole").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    proxy.black_hole();
    let started = Instant::now();
    let outcome = lock
        .try_lock_for(Duration::from_millis(300), Some(Duration::from_secs(5)))
        .await;
    let took = started.elapsed();
    assert!(
        matches!(&outcome, Err(e) if e.is_node_unavailable()),
        "{outcome:?}"
    );
    assert!(took < Duration::from_millis(1_500), "took {took:?}");
}

/// `localhost` and `127.0.0.1` are one server: not two RedLock masters.
#[tokio::test]
async fn one_server_under_two_addresses_is_not_two_masters() {
    let servers = servers(2).await;
    let nodes = vec![
        Node::new(&format!("redis://127.0.0.1:{}", servers[0].port())).unwrap(),
        Node::new(&format!("redis://localhost:{}", servers[0].port())).unwrap(),
        node(&servers[1]),
    ];
    let red = client().red_lock_on(&nodes, "aliased").unwrap();
    let mut outcome = red.try_lock().await;
    if outcome.is_ok() {
        // The first round connected; from now on the aliases are known.
        drop(outcome);
        outcome = red.try_lock().await;
    }
    match outcome {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("one server"), "{msg}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(!exists(&servers[0], "aliased").await);
    assert!(!exists(&servers[1], "aliased").await);
}
