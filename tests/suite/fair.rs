//! The fair lock on one node: grants in the order waiters asked, wakes only
//! the head of its queue, and a waiter whose wait ends without a grant
//! (deadline, drop) leaves nothing in the queue. Holders take minute-long
//! leases: a waiter that was not woken would wait for all of it, and a
//! queue entry nobody removed would stay for its 5-minute share.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use multilock::{Client, Lock, Owner};
use multilock_testkit::{RedisProcess, TestServer, redisson, redisson_fair};

const NAME: &str = "tickets";

fn queue_keys() -> (String, String) {
    (redisson_fair::queue(NAME), redisson_fair::timeouts(NAME))
}

/// The queue's length and the number of deadlines.
async fn queue_state(url: &str) -> (u64, u64) {
    let (queue, deadlines) = queue_keys();
    let len: u64 = run(url, redis::cmd("LLEN").arg(&queue)).await.unwrap();
    let card: u64 = run(url, redis::cmd("ZCARD").arg(&deadlines)).await.unwrap();
    (len, card)
}

/// Waits (at most `limit`) until the queue holds `n` waiters, each with its
/// deadline.
async fn wait_for_queue(url: &str, n: u64, limit: Duration) {
    eventually(
        limit,
        |seen: &(u64, u64)| format!("queue and deadlines {seen:?}, expected {n} each"),
        || async {
            let seen = queue_state(url).await;
            if seen == (n, n) { Ok(()) } else { Err(seen) }
        },
    )
    .await
}

fn fair(server: &RedisProcess) -> Lock {
    Client::new().fair_lock(&node(server), NAME).unwrap()
}

#[tokio::test]
async fn waiters_are_granted_in_the_order_they_asked() {
    let server = server().await;
    let lock = fair(&server);
    let holder = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5u64 {
        let lock = fair(&server);
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let guard = lock.lock_with_lease(LONG_LEASE).await.unwrap();
            order.lock().unwrap().push(i);
            guard.unlock().await.unwrap();
        }));
        // Queued before the next one asks.
        wait_for_queue(&server.url(), i + 1, PATIENCE).await;
    }
    holder.unlock().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(PATIENCE, waiter)
            .await
            .expect("each waiter is woken by its predecessor's release")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    assert_eq!(queue_state(&server.url()).await, (0, 0));
}

/// A release publishes on the head's own channel only: the head is woken
/// at once, and the shared channel hears nothing.
#[tokio::test]
async fn a_release_wakes_the_head_on_its_own_channel() {
    let server = server().await;
    let lock = fair(&server);
    let holder = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let mut shared = Box::pin(subscribe_raw(&server.url(), &redisson::channel(NAME)).await);
    let waiter = fair(&server);
    let task = tokio::spawn(async move {
        let guard = waiter.lock_with_lease(LONG_LEASE).await.unwrap();
        let at = Instant::now();
        guard.unlock().await.unwrap();
        at
    });
    wait_for_queue(&server.url(), 1, PATIENCE).await;
    let released = Instant::now();
    holder.unlock().await.unwrap();
    let granted = tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
    assert!(
        granted - released < Duration::from_secs(3),
        "woken by the release, not the 60 s lease: {:?}",
        granted - released
    );
    let heard = tokio::time::timeout(
        Duration::from_millis(200),
        futures::StreamExt::next(&mut shared),
    )
    .await;
    assert!(heard.is_err(), "the shared channel heard {heard:?}");
}

/// A bounded wait that ends without a grant leaves the queue before it
/// returns (the entry would otherwise keep its turn for its wait).
#[tokio::test]
async fn a_waiter_that_times_out_leaves_the_queue() {
    let server = server().await;
    let holder = fair(&server).lock_with_lease(LONG_LEASE).await.unwrap();
    let waiter = fair(&server);
    let got = waiter
        .try_lock_for(Duration::from_millis(300), Some(LONG_LEASE))
        .await
        .unwrap();
    assert!(got.is_none());
    assert_eq!(queue_state(&server.url()).await, (0, 0));
    let got = waiter.try_lock().await.unwrap();
    assert!(got.is_none());
    assert_eq!(queue_state(&server.url()).await, (0, 0));
    holder.unlock().await.unwrap();
}

/// Redisson #5019: a waiter whose future is dropped leaves the queue, so
/// the next waiter is granted as soon as the lock is released, not after
/// the dropped waiter's 5-minute share.
#[tokio::test]
async fn a_dropped_waiter_leaves_the_queue_and_the_next_one_goes_first() {
    let server = server().await;
    let holder = fair(&server).lock_with_lease(LONG_LEASE).await.unwrap();
    let dropped = fair(&server);
    let task = tokio::spawn(async move { dropped.lock().await });
    wait_for_queue(&server.url(), 1, PATIENCE).await;
    let next = fair(&server);
    let second = tokio::spawn(async move {
        let guard = next.lock_with_lease(LONG_LEASE).await.unwrap();
        guard.unlock().await.unwrap();
    });
    wait_for_queue(&server.url(), 2, PATIENCE).await;
    task.abort();
    wait_for_queue(&server.url(), 1, PATIENCE).await;
    holder.unlock().await.unwrap();
    tokio::time::timeout(PATIENCE, second)
        .await
        .expect("the next waiter went first")
        .unwrap();
    assert_eq!(queue_state(&server.url()).await, (0, 0));
}

/// A waiter that died at the head of the queue (a Redisson client that
/// queued with a 1 s wait and never came back, nor gave up) publishes
/// nothing: ours, behind it, asks again when the queue's estimate has
/// passed, the dead head is dropped as stale, and ours is granted.
#[tokio::test]
async fn a_dead_head_is_passed_over_once_its_share_is_over() {
    let server = server().await;
    let holder = fair(&server)
        .lock_with_lease(Duration::from_secs(2))
        .await
        .unwrap();
    let mut raw = raw(&server.url()).await;
    let dead = "6f1c0e9a-1111-2222-3333-444455556666:1";
    let taken: Option<i64> = redisson_fair::acquire(
        NAME,
        dead,
        LONG_LEASE,
        Duration::from_secs(1),
        redisson_fair::now_ms(),
    )
    .invoke_async(&mut raw)
    .await
    .unwrap();
    assert!(taken.is_some(), "queued behind the holder");
    let waiter = fair(&server);
    let started = Instant::now();
    let task = tokio::spawn(async move { waiter.lock_with_lease(LONG_LEASE).await });
    holder.unlock().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("granted once the dead head's share was over")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
    guard.unlock().await.unwrap();
    assert_eq!(queue_state(&server.url()).await, (0, 0));
}

/// Redisson's waiters and ours share one queue: a Redisson waiter queued
/// first is granted first (woken on its own channel by our release), and
/// ours, queued behind it, is woken by the Redisson client's release.
#[tokio::test]
async fn redisson_waiters_and_ours_share_the_queue() {
    let server = server().await;
    let url = server.url();
    let holder = fair(&server).lock_with_lease(LONG_LEASE).await.unwrap();
    let mut raw = raw(&url).await;
    let java = "6f1c0e9a-1111-2222-3333-444455556666:1";
    let mut java_wake =
        Box::pin(subscribe_raw(&url, &redisson_fair::waiter_channel(NAME, java)).await);
    let wait = Duration::from_secs(30);
    let taken: Option<i64> =
        redisson_fair::acquire(NAME, java, LONG_LEASE, wait, redisson_fair::now_ms())
            .invoke_async(&mut raw)
            .await
            .unwrap();
    assert!(taken.is_some());
    let ours = fair(&server);
    let task = tokio::spawn(async move {
        let guard = ours.lock_with_lease(LONG_LEASE).await.unwrap();
        let at = Instant::now();
        guard.unlock().await.unwrap();
        at
    });
    wait_for_queue(&url, 2, PATIENCE).await;

    holder.unlock().await.unwrap();
    let message = tokio::time::timeout(PATIENCE, futures::StreamExt::next(&mut java_wake))
        .await
        .expect("our release woke the Redisson head on its own channel")
        .unwrap();
    assert_eq!(message.get_payload::<String>().unwrap(), "0");
    assert!(
        !task.is_finished(),
        "ours waits its turn behind the Redisson waiter"
    );
    let granted: Option<i64> =
        redisson_fair::acquire(NAME, java, LONG_LEASE, wait, redisson_fair::now_ms())
            .invoke_async(&mut raw)
            .await
            .unwrap();
    assert_eq!(granted, None, "the Redisson head is granted");

    let request = redisson::new_request_id();
    let released = Instant::now();
    let _: Option<i64> =
        redisson_fair::release(NAME, java, &request, LONG_LEASE, redisson_fair::now_ms())
            .invoke_async(&mut raw)
            .await
            .unwrap();
    let granted = tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
    assert!(
        granted - released < Duration::from_secs(3),
        "ours was woken by the Redisson release, not the 60 s lease"
    );
    assert_eq!(queue_state(&url).await, (0, 0));
}

/// Done-when of issue 22: 10,000 waiters, each cancelled at a random point
/// (before its first request, with a request in flight, while parked, or
/// just after its grant), leave no queue entry and no deadline behind, and
/// the lock free. In waves of 1,000, behind a holder that releases midway
/// through each wave so that some are granted and some are cancelled after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_cancelled_waiters_leave_nothing_in_the_queue() {
    let server = server().await;
    let url = server.url();
    let client = Client::new();
    // A long reply timeout: a thousand waiters at once keep the node busy,
    // and it is their cleanup under test, not the node's health.
    let node = node_at(&url, Duration::from_secs(10));
    for _wave in 0..10 {
        // Bounded: behind entries nobody removed, it would wait their share.
        let holder = client.fair_lock(&node, NAME).unwrap();
        let holder = match tokio::time::timeout(PATIENCE, holder.lock_with_lease(LONG_LEASE)).await
        {
            Ok(guard) => guard.unwrap(),
            Err(_) => panic!(
                "the holder waits behind entries nobody removed (queue, deadlines): {:?}",
                queue_state(&url).await
            ),
        };
        let mut tasks = Vec::with_capacity(1_000);
        for _ in 0..1_000 {
            let lock = client.fair_lock(&node, NAME).unwrap();
            let cancel_after = Duration::from_micros(rand::random_range(0..30_000));
            tasks.push(tokio::spawn(async move {
                let _ = tokio::time::timeout(cancel_after, lock.lock_with_lease(LONG_LEASE)).await;
            }));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        holder.unlock().await.unwrap();
        for task in tasks {
            task.await.unwrap();
        }
    }
    eventually(
        Duration::from_secs(30),
        |seen: &(u64, u64, bool)| format!("queue, deadlines, locked: {seen:?}"),
        || async {
            let (len, card) = queue_state(&url).await;
            let locked = exists(&url, NAME).await;
            if (len, card, locked) == (0, 0, false) {
                Ok(())
            } else {
                Err((len, card, locked))
            }
        },
    )
    .await;
}

/// A fair lock refuses what only makes sense for one: a queue wait on a
/// reentrant lock, a queue wait out of range, and (for now) a place in a
/// MultiLock or RedLock.
#[tokio::test]
async fn fair_lock_settings_are_checked() {
    let client = Client::new();
    let node = multilock::Node::new("redis://127.0.0.1:1").unwrap();
    let plain = client.lock(&node, NAME).unwrap();
    assert!(!plain.is_fair());
    assert!(plain.with_queue_wait(Duration::from_secs(1)).is_err());
    let fair = client.fair_lock(&node, NAME).unwrap();
    assert!(fair.is_fair());
    assert!(fair.with_queue_wait(Duration::ZERO).is_err());
    assert!(
        fair.with_queue_wait(Duration::from_secs(1))
            .unwrap()
            .is_fair()
    );
    assert!(client.fair_lock(&node, "").is_err());
}

/// Fair locks on several nodes, one per node.
fn fair_parts(client: &Client, servers: &[RedisProcess]) -> Vec<Lock> {
    servers
        .iter()
        .map(|s| client.fair_lock(&node(s), NAME).unwrap())
        .collect()
}

/// Waits until every server's queue holds `n` waiters.
async fn wait_for_queues(servers: &[RedisProcess], n: u64) {
    for server in servers {
        wait_for_queue(&server.url(), n, PATIENCE).await;
    }
}

/// A MultiLock of fair locks queues its waiter on every node and keeps its
/// places from round to round: waiters are granted in the order they asked,
/// and leave nothing queued.
#[tokio::test]
async fn a_multi_lock_of_fair_locks_grants_in_order() {
    let servers = servers(3).await;
    let client = Client::new();
    let holder = client
        .multi_lock(fair_parts(&client, &servers))
        .unwrap()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3u64 {
        let client = Client::new();
        let multi = client.multi_lock(fair_parts(&client, &servers)).unwrap();
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let guard = multi.lock_with_lease(LONG_LEASE).await.unwrap();
            order.lock().unwrap().push(i);
            guard.unlock().await.unwrap();
        }));
        wait_for_queues(&servers, i + 1).await;
    }
    holder.unlock().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(PATIENCE * 2, waiter)
            .await
            .expect("every waiter is granted in turn")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    wait_for_queues(&servers, 0).await;
}

/// A RedLock waiter on five fair locks that is dropped while queued leaves
/// every queue: the next waiter is granted as soon as the holder releases.
#[tokio::test]
async fn a_dropped_red_lock_waiter_leaves_every_queue() {
    let servers = servers(5).await;
    let client = Client::new();
    let red = client.red_lock(fair_parts(&client, &servers)).unwrap();
    let holder = red.lock_with_lease(LONG_LEASE).await.unwrap();
    let dropped = Client::new();
    let dropped = dropped.red_lock(fair_parts(&dropped, &servers)).unwrap();
    let task = tokio::spawn(async move { dropped.lock().await });
    wait_for_queues(&servers, 1).await;
    task.abort();
    wait_for_queues(&servers, 0).await;
    let next = Client::new();
    let next = next.red_lock(fair_parts(&next, &servers)).unwrap();
    let second = tokio::spawn(async move { next.lock_with_lease(LONG_LEASE).await });
    wait_for_queues(&servers, 1).await;
    holder.unlock().await.unwrap();
    let guard = tokio::time::timeout(PATIENCE, second)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    guard.unlock().await.unwrap();
    wait_for_queues(&servers, 0).await;
}

/// A RedLock of five fair locks with one master frozen: the majority
/// grants, a bounded wait that fails leaves the queues of the live nodes,
/// and once the frozen node thaws, its queue is left too.
#[tokio::test]
async fn a_red_lock_of_fair_locks_works_with_a_frozen_master() {
    let mut servers = servers(5).await;
    let client = Client::new();
    let parts: Vec<Lock> = servers
        .iter()
        .map(|s| {
            client
                .fair_lock(&node_at(&s.url(), Duration::from_millis(500)), NAME)
                .unwrap()
        })
        .collect();
    let red = client.red_lock(parts).unwrap();
    servers[4].pause().await.unwrap();
    let holder = red.lock_with_lease(LONG_LEASE).await.unwrap();
    assert_eq!(holder.nodes().len(), 4);
    let other = Client::new();
    let other_parts: Vec<Lock> = servers
        .iter()
        .map(|s| {
            other
                .fair_lock(&node_at(&s.url(), Duration::from_millis(500)), NAME)
                .unwrap()
        })
        .collect();
    let waiter = other.red_lock(other_parts).unwrap();
    let got = waiter
        .try_lock_for(Duration::from_secs(1), Some(LONG_LEASE))
        .await
        .unwrap();
    assert!(got.is_none(), "the holder has the majority");
    wait_for_queues(&servers[..4], 0).await;
    servers[4].unpause().await.unwrap();
    wait_for_queue(&servers[4].url(), 0, PATIENCE * 2).await;
    holder.unlock().await.unwrap();
}

/// A fenced fair lock INCRs the token counter on every grant, as Redisson's
/// fenced lock does, re-entries included.
#[tokio::test]
async fn a_fenced_fair_lock_hands_out_increasing_tokens() {
    let server = server().await;
    // One owner for both acquires: the second re-enters the first.
    let lock = fair(&server)
        .with_fencing()
        .with_owner(Owner::new("job").unwrap());
    let first = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let again = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let (a, b) = (
        first.fencing_token().unwrap(),
        again.fencing_token().unwrap(),
    );
    assert!(b > a, "{a} then {b}");
    again.unlock().await.unwrap();
    first.unlock().await.unwrap();
    let next = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    assert!(next.fencing_token().unwrap() > b);
    next.unlock().await.unwrap();
    assert_eq!(queue_state(&server.url()).await, (0, 0));
}

/// The deadline (epoch ms) of waiter `field` in the queue of [`NAME`] on
/// `url`; `None` when it is not queued.
async fn queue_deadline(url: &str, field: &str) -> Option<f64> {
    run(
        url,
        redis::cmd("ZSCORE")
            .arg(redisson_fair::timeouts(NAME))
            .arg(field),
    )
    .await
    .unwrap()
}

/// Defect 6: a RedLock of fair locks queues each part for the waiter's own
/// wait (as Redisson's RedLock divides `waitTime` over its locks), not for
/// the 5-minute default share. A waiter with a 2 s wait that dies while
/// queued (kill -9: no give-up is sent) keeps its turn for seconds, and a
/// RedLock that then waits 8 s is granted.
#[tokio::test]
async fn a_crashed_red_lock_waiter_keeps_its_turn_for_its_wait_only() {
    let servers = servers(3).await;
    let red_lock = |client: &Client, owner: &str| {
        client
            .red_lock(fair_parts(client, &servers))
            .unwrap()
            .with_owner(multilock::Owner::new(owner).unwrap())
    };
    let holder_client = Client::new();
    let holder = red_lock(&holder_client, "holder")
        .lock_with_lease(Duration::from_secs(3))
        .await
        .unwrap();

    let waiter_client = Client::new();
    let waiter = red_lock(&waiter_client, "waiter");
    let field = format!("{}:waiter", waiter_client.id());
    let mut attempt = Box::pin(waiter.try_lock_for(Duration::from_secs(2), Some(LONG_LEASE)));
    let polled = tokio::time::timeout(Duration::from_millis(700), &mut attempt).await;
    assert!(polled.is_err(), "still waiting after 700 ms: {polled:?}");
    // The crash: no drop runs, so no give-up is sent (the client and the
    // handles clean nothing up when dropped).
    std::mem::forget(attempt);
    let now = redisson_fair::now_ms() as f64;
    let mut turns = Vec::new();
    for s in &servers {
        let deadline = queue_deadline(&s.url(), &field)
            .await
            .unwrap_or_else(|| panic!("the waiter queued on {}", s.url()));
        turns.push(Duration::from_millis((deadline - now).max(0.0) as u64));
    }
    holder.unlock().await.unwrap();

    let next_client = Client::new();
    let next = red_lock(&next_client, "next");
    let started = Instant::now();
    let got = next
        .try_lock_for(Duration::from_secs(8), Some(LONG_LEASE))
        .await
        .unwrap();
    let waited = started.elapsed();
    let granted = got.is_some();
    if let Some(guard) = got {
        guard.unlock().await.unwrap();
    }
    assert!(
        granted && turns.iter().all(|t| *t < Duration::from_secs(30)),
        "a waiter with a 2 s wait, crashed while queued behind a 3 s lease, keeps its \
         turn for {turns:?} from now on the 3 nodes (expected a few seconds); a RedLock \
         waiting 8 s afterwards was {} after {waited:?}",
        if granted { "granted" } else { "refused" }
    );
}

/// Defect 6, one node: `try_lock()` (no wait) that finds the lock taken and
/// dies before it gives up (kill -9) leaves no entry keeping a turn for
/// minutes (Redisson's `tryLock()` does not queue at all).
#[tokio::test]
async fn a_crashed_try_lock_leaves_no_minutes_long_turn() {
    let server = server().await;
    let url = server.url();
    let holder = Client::new()
        .fair_lock(&node(&server), NAME)
        .unwrap()
        .with_owner(multilock::Owner::new("holder").unwrap())
        .lock_with_lease(Duration::from_secs(3))
        .await
        .unwrap();
    let client = Client::new();
    let lock = client
        .fair_lock(&node(&server), NAME)
        .unwrap()
        .with_owner(multilock::Owner::new("crashed").unwrap());
    // Connected on the lock's lane: the acquire goes out on the first poll.
    assert!(lock.is_locked().await.unwrap());
    let field = format!("{}:crashed", client.id());
    let before = script_calls(&url).await;
    let mut attempt = Box::pin(lock.try_lock());
    assert!(futures::poll!(&mut attempt).is_pending());
    eventually(
        PATIENCE,
        |calls: &u64| format!("the acquire never reached the server ({calls} script calls)"),
        || async {
            let calls = script_calls(&url).await;
            if calls > before { Ok(()) } else { Err(calls) }
        },
    )
    .await;
    // The crash: its reply is never read, so no give-up is sent.
    std::mem::forget(attempt);
    let now = redisson_fair::now_ms() as f64;
    let turn = queue_deadline(&url, &field)
        .await
        .map(|deadline| Duration::from_millis((deadline - now).max(0.0) as u64));
    assert!(
        turn.is_none_or(|t| t < Duration::from_secs(30)),
        "a crashed try_lock() (no wait) left its entry in the queue keeping its turn for \
         {turn:?} from now (the holder's lease is 3 s)"
    );
    holder.unlock().await.unwrap();
}
