//! The read-write lock, alone and as parts of a RedLock: reads share,
//! writes exclude, a write release wakes every reader, no upgrade, the
//! writer's downgrade, the watchdog renewing only its own read holds, a
//! crashed reader's holds expiring, and Redisson's clients on the same lock.
//! Holders take minute-long leases unless the test is about expiry: a
//! waiter that was not woken would wait for all of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use multilock::testkit::{RedisProcess, TestServer, redisson, redisson_rwlock};
use multilock::{Client, Error, Lock, ReadWriteLock};

const NAME: &str = "prices";
const JAVA: &str = "6f1c0e9a-1111-2222-3333-444455556666:1";

fn rw(server: &RedisProcess) -> ReadWriteLock {
    Client::new().read_write_lock(&node(server), NAME).unwrap()
}

async fn mode(url: &str) -> Option<String> {
    run(url, redis::cmd("HGET").arg(NAME).arg("mode"))
        .await
        .unwrap()
}

#[tokio::test]
async fn readers_share_and_a_writer_waits_for_the_last_one() {
    let server = server().await;
    let first = rw(&server)
        .read()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let second = rw(&server)
        .read()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    assert_eq!(mode(&server.url()).await.as_deref(), Some("read"));
    let writer = rw(&server);
    assert!(writer.write().try_lock().await.unwrap().is_none());
    let task = tokio::spawn(async move {
        let guard = writer.write().lock_with_lease(LONG_LEASE).await.unwrap();
        let at = Instant::now();
        guard.unlock().await.unwrap();
        at
    });
    first.unlock().await.unwrap();
    assert!(!task.is_finished());
    let released = Instant::now();
    second.unlock().await.unwrap();
    let granted = tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
    assert!(
        granted - released < Duration::from_secs(3),
        "the writer was woken by the last read release, not the 60 s lease"
    );
    assert!(!exists(&server.url(), NAME).await);
}

/// Redisson #1542: readers blocked by a writer all enter at once when it
/// releases (a write release wakes every waiter), and hold together.
#[tokio::test]
async fn a_write_release_lets_every_waiting_reader_in_at_once() {
    let server = server().await;
    let writer = rw(&server)
        .write()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let holding = Arc::new(AtomicUsize::new(0));
    let (all_in_tx, all_in) = tokio::sync::watch::channel(false);
    let mut readers = Vec::new();
    for _ in 0..4 {
        let reader = rw(&server);
        let holding = holding.clone();
        let mut all_in = all_in.clone();
        readers.push(tokio::spawn(async move {
            let guard = reader.read().lock_with_lease(LONG_LEASE).await.unwrap();
            holding.fetch_add(1, Ordering::SeqCst);
            // Held until every reader is in: they overlap.
            all_in.wait_for(|all| *all).await.unwrap();
            guard.unlock().await.unwrap();
        }));
    }
    // Each reader has its own client and node: four subscriptions.
    wait_for_rw_listeners(&server.url(), 4).await;
    writer.unlock().await.unwrap();
    eventually(
        PATIENCE,
        |n: &usize| format!("{n} of 4 readers in"),
        || async {
            let n = holding.load(Ordering::SeqCst);
            if n == 4 { Ok(()) } else { Err(n) }
        },
    )
    .await;
    all_in_tx.send(true).unwrap();
    for reader in readers {
        reader.await.unwrap();
    }
    assert!(!exists(&server.url(), NAME).await);
}

/// Redisson #4796: a reader's write attempt would wait for its own reads
/// forever; it fails at once with a typed error instead.
#[tokio::test]
async fn a_reader_cannot_upgrade() {
    let server = server().await;
    let lock = rw(&server);
    let reading = lock.read().lock_with_lease(LONG_LEASE).await.unwrap();
    let started = Instant::now();
    let err = lock
        .write()
        .try_lock_for(Duration::from_secs(10), Some(LONG_LEASE))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("upgrade"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
    reading.unlock().await.unwrap();
}

/// The writer may read; releasing its write leaves the lock in read mode,
/// held by its reads: other readers enter, writers do not.
#[tokio::test]
async fn the_writer_downgrades_to_its_reads() {
    let server = server().await;
    let url = server.url();
    let lock = rw(&server);
    let writing = lock.write().lock_with_lease(LONG_LEASE).await.unwrap();
    let reading = lock.read().lock_with_lease(LONG_LEASE).await.unwrap();
    assert!(rw(&server).read().try_lock().await.unwrap().is_none());
    writing.unlock().await.unwrap();
    assert_eq!(mode(&url).await.as_deref(), Some("read"));
    let other = rw(&server).read().try_lock().await.unwrap();
    assert!(other.is_some(), "readers share a downgraded lock");
    assert!(rw(&server).write().try_lock().await.unwrap().is_none());
    other.unwrap().unlock().await.unwrap();
    reading.unlock().await.unwrap();
    assert!(!exists(&url, NAME).await);
}

/// Redisson #1604: the watchdog renews this client's read holds, their
/// timeout keys too. Another reader's release sets the hash's TTL to the
/// longest timeout key left: had ours not been renewed (1 s watchdog, 4 s
/// held), the hash would have expired under our guard.
#[tokio::test]
async fn the_watchdog_renews_its_own_read_timeouts() {
    let server = server().await;
    let url = server.url();
    let ours = client_with_watchdog(Duration::from_secs(1))
        .read_write_lock(&node(&server), NAME)
        .unwrap();
    let guard = ours.read().lock().await.unwrap();
    let mut raw = raw(&url).await;
    let request = redisson::new_request_id();
    for step in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A Redisson reader comes and goes: its release recomputes the TTL.
        let granted: Option<i64> =
            redisson_rwlock::read_acquire(NAME, JAVA, Duration::from_secs(30))
                .invoke_async(&mut raw)
                .await
                .unwrap();
        assert_eq!(granted, None, "step {step}: readers share");
        let _: Option<i64> = redisson_rwlock::read_release(NAME, JAVA, &request)
            .invoke_async(&mut raw)
            .await
            .unwrap();
        redisson::delete_latch(NAME, &request)
            .exec_async(&mut raw)
            .await
            .unwrap();
        assert!(
            exists(&url, NAME).await,
            "step {step}: our read hold is gone"
        );
    }
    assert!(
        guard.valid_until().is_some(),
        "the guard still proves its hold"
    );
    guard.unlock().await.unwrap();
    assert!(!exists(&url, NAME).await);
}

/// A crashed reader (a Redisson client whose read hold has a 1 s lease and
/// is never released) blocks writers only until its hold expires.
#[tokio::test]
async fn a_crashed_readers_hold_expires_and_lets_writers_in() {
    let server = server().await;
    let mut raw = raw(&server.url()).await;
    let granted: Option<i64> = redisson_rwlock::read_acquire(NAME, JAVA, Duration::from_secs(1))
        .invoke_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(granted, None);
    let writer = rw(&server);
    let guard = tokio::time::timeout(
        Duration::from_secs(10),
        writer.write().lock_with_lease(LONG_LEASE),
    )
    .await
    .expect("granted once the crashed reader's hold expired")
    .unwrap();
    guard.unlock().await.unwrap();
}

/// Redisson's readers and writers and ours exclude each other and wake
/// each other: a Redisson reader keeps our writer out, its release wakes
/// it; our write release publishes `1` on the shared channel.
#[tokio::test]
async fn redisson_readers_and_our_writer_share_the_lock() {
    let server = server().await;
    let url = server.url();
    let mut raw = raw(&url).await;
    let granted: Option<i64> = redisson_rwlock::read_acquire(NAME, JAVA, LONG_LEASE)
        .invoke_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(granted, None);
    let ours = rw(&server);
    let shared = ours
        .read()
        .try_lock()
        .await
        .unwrap()
        .expect("readers share");
    shared.unlock().await.unwrap();
    let writer = ours.clone();
    let task = tokio::spawn(async move {
        let guard = writer.write().lock_with_lease(LONG_LEASE).await.unwrap();
        let at = Instant::now();
        (at, guard)
    });
    wait_for_rw_listeners(&url, 1).await;
    let mut channel = Box::pin(subscribe_raw(&url, &redisson_rwlock::channel(NAME)).await);
    let request = redisson::new_request_id();
    let released = Instant::now();
    let _: Option<i64> = redisson_rwlock::read_release(NAME, JAVA, &request)
        .invoke_async(&mut raw)
        .await
        .unwrap();
    let (granted, guard) = tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
    assert!(
        granted - released < Duration::from_secs(3),
        "woken by the Redisson release"
    );
    let first = futures::StreamExt::next(&mut channel).await.unwrap();
    assert_eq!(
        first.get_payload::<String>().unwrap(),
        "0",
        "Redisson's read release"
    );
    let refused: Option<i64> = redisson_rwlock::write_acquire(NAME, JAVA, LONG_LEASE)
        .invoke_async(&mut raw)
        .await
        .unwrap();
    assert!(refused.is_some(), "our writer keeps Redisson's out");
    guard.unlock().await.unwrap();
    let second = tokio::time::timeout(PATIENCE, futures::StreamExt::next(&mut channel))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        second.get_payload::<String>().unwrap(),
        "1",
        "our write release wakes all"
    );
}

/// Read parts on five masters with one frozen: many readers hold at once
/// through the majority, and a writer is shut out; once the readers leave,
/// the writer gets in.
#[tokio::test]
async fn a_red_lock_of_read_locks_admits_readers_and_shuts_out_writers_with_a_frozen_master() {
    let mut servers = servers(5).await;
    let nodes = servers_nodes(&servers);
    let halves = |client: &Client, write: bool| -> Vec<Lock> {
        nodes
            .iter()
            .map(|node| {
                let rw = client.read_write_lock(node, NAME).unwrap();
                if write {
                    rw.write().clone()
                } else {
                    rw.read().clone()
                }
            })
            .collect()
    };
    servers[4].pause().await.unwrap();
    let mut readers = Vec::new();
    for _ in 0..5 {
        let client = Client::new();
        let red = client.red_lock(halves(&client, false)).unwrap();
        readers.push(
            red.try_lock_for(Duration::from_secs(5), Some(LONG_LEASE))
                .await
                .unwrap()
                .expect("readers share the majority"),
        );
    }
    let client = Client::new();
    let writer = client.red_lock(halves(&client, true)).unwrap();
    let shut_out = writer
        .try_lock_for(Duration::from_secs(1), Some(LONG_LEASE))
        .await
        .unwrap();
    assert!(shut_out.is_none(), "no writer while readers hold");
    for reader in readers {
        reader.unlock().await.unwrap();
    }
    let guard = writer
        .try_lock_for(Duration::from_secs(5), Some(LONG_LEASE))
        .await
        .unwrap()
        .expect("the writer gets in once the readers left");
    servers[4].unpause().await.unwrap();
    guard.unlock().await.unwrap();
}

fn servers_nodes(servers: &[RedisProcess]) -> Vec<multilock::Node> {
    servers
        .iter()
        .map(|s| node_at(&s.url(), Duration::from_millis(500)))
        .collect()
}

/// Waits until `n` connections listen on the lock's channel (a waiter of
/// ours has subscribed: all of a node's share one connection).
async fn wait_for_rw_listeners(url: &str, n: u64) {
    wait_for_channel_listeners(url, &redisson_rwlock::channel(NAME), n).await;
}

/// A read hold is trusted for its own lease, not for the hash's TTL:
/// another reader's longer lease keeps the hash now, but its release will
/// cut the hash down to the longest read timeout key left, ours.
#[tokio::test]
async fn a_read_hold_is_valid_for_its_own_lease_only() {
    let server = server().await;
    let mut raw = raw(&server.url()).await;
    let granted: Option<i64> = redisson_rwlock::read_acquire(NAME, JAVA, LONG_LEASE)
        .invoke_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(granted, None);
    let asked = std::time::Instant::now();
    let ours = rw(&server)
        .read()
        .lock_with_lease(Duration::from_secs(5))
        .await
        .unwrap();
    let valid_until = ours.valid_until().expect("held");
    assert!(
        valid_until <= asked + Duration::from_secs(5),
        "trusted {:?} past the ask, beyond its 5 s lease",
        valid_until - asked
    );
    let request = redisson::new_request_id();
    let _: Option<i64> = redisson_rwlock::read_release(NAME, JAVA, &request)
        .invoke_async(&mut raw)
        .await
        .unwrap();
    let hash_ttl = pttl(&server.url(), NAME).await;
    assert!(
        (0..=5_000).contains(&hash_ttl),
        "the hash lives as long as our hold: {hash_ttl} ms"
    );
    ours.unlock().await.unwrap();
}

/// As Redisson's: a read lock is locked when the lock is in read mode, a
/// write lock when it is in write mode (a writer's own reads keep it in
/// write mode), and neither once it is free.
#[tokio::test]
async fn each_half_reports_its_own_mode_as_locked() {
    let server = server().await;
    let lock = rw(&server);
    let locked = |lock: &ReadWriteLock| {
        let lock = lock.clone();
        async move {
            (
                lock.read().is_locked().await.unwrap(),
                lock.write().is_locked().await.unwrap(),
            )
        }
    };
    assert_eq!(locked(&lock).await, (false, false));
    let read = lock.read().lock_with_lease(LONG_LEASE).await.unwrap();
    assert_eq!(locked(&lock).await, (true, false));
    read.unlock().await.unwrap();
    let write = lock.write().lock_with_lease(LONG_LEASE).await.unwrap();
    let own_read = lock.read().lock_with_lease(LONG_LEASE).await.unwrap();
    assert_eq!(locked(&lock).await, (false, true));
    write.unlock().await.unwrap();
    // The downgrade: the writer's read hold remains, in read mode.
    assert_eq!(locked(&lock).await, (true, false));
    own_read.unlock().await.unwrap();
    assert_eq!(locked(&lock).await, (false, false));
}

/// Read holds of one owner are numbered, not named: releasing the first of
/// two (a short lease, then a long one) must not take the long hold's
/// timeout key, or the next reader's release sets the hash's TTL to the
/// short one's and a writer gets in while the long hold is valid (found by
/// `history_checker --locks family`: a background release of a dropped
/// guard overtaken by its owner's next read).
#[tokio::test]
async fn releasing_an_older_read_hold_keeps_the_longer_ones_key() {
    let server = server().await;
    let url = server.url();
    let mine = rw(&server);
    let short = mine
        .read()
        .lock_with_lease(Duration::from_secs(3))
        .await
        .unwrap();
    let long = mine.read().lock_with_lease(LONG_LEASE).await.unwrap();
    short.unlock().await.unwrap();
    // Another reader comes and goes: its release sets the hash's TTL to
    // the longest read key left.
    let other = rw(&server)
        .read()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    other.unlock().await.unwrap();
    let left = pttl(&url, NAME).await;
    assert!(
        left > LONG_LEASE.as_millis() as i64 - 10_000,
        "the hash lives {left} ms, while a hold of {LONG_LEASE:?} remains"
    );
    long.unlock().await.unwrap();
    assert!(!exists(&url, NAME).await);
}

/// A reader that drops its guard and asks for the write lock at once gets
/// it: the write waits for the dropped guard's release (sent in the
/// background) instead of finding the owner's read still there and
/// refusing the upgrade. Alone, and as a RedLock whose unlock returns at a
/// quorum and finishes the rest in the background.
#[tokio::test]
async fn a_write_right_after_dropping_the_read_waits_for_its_release() {
    let servers = servers(3).await;
    let single = rw(&servers[0]);
    for _ in 0..20 {
        let read = single.read().lock_with_lease(LONG_LEASE).await.unwrap();
        drop(read);
        let write = single
            .write()
            .try_lock_for(PATIENCE, Some(LONG_LEASE))
            .await
            .unwrap()
            .expect("granted once the read is released");
        write.unlock().await.unwrap();
    }
    let client = Client::new();
    let rws: Vec<ReadWriteLock> = servers
        .iter()
        .map(|s| client.read_write_lock(&node(s), NAME).unwrap())
        .collect();
    let reads = client
        .red_lock(rws.iter().map(|rw| rw.read().clone()).collect())
        .unwrap();
    let writes = client
        .red_lock(rws.iter().map(|rw| rw.write().clone()).collect())
        .unwrap();
    for i in 0..20 {
        let read = reads.lock_with_lease(LONG_LEASE).await.unwrap();
        if i % 2 == 0 {
            drop(read);
        } else {
            read.unlock().await.unwrap();
        }
        let write = writes
            .try_lock_for(PATIENCE, Some(LONG_LEASE))
            .await
            .unwrap()
            .expect("granted once the reads are released");
        write.unlock().await.unwrap();
    }
}
