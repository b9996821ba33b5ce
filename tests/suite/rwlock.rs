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
use multilock::{Client, Error, Guard, Lock, Owner, ReadWriteLock};
use multilock_testkit::{RedisProcess, TestServer, redisson, redisson_rwlock};

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
    let lock = rw(&server).with_owner(Owner::new("job").unwrap());
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
    let lock = rw(&server).with_owner(Owner::new("job").unwrap());
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
    let lock = rw(&server).with_owner(Owner::new("job").unwrap());
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

/// A reader of its own: a client on a current-thread runtime in a thread of
/// its own, holding a read lock under a 3 s watchdog. Blocking that thread
/// pauses the whole client (its renewal timer, its connections), as SIGSTOP
/// pauses a process, while the server's clock and the other clients go on.
struct PausableReader {
    guard: Arc<Guard>,
    /// The hold's field, `<client-uuid>:reader-1`.
    field: String,
    /// Each value sent pauses the client that long; closing it ends the thread.
    pause: tokio::sync::mpsc::UnboundedSender<Duration>,
    /// `true` when a pause starts, `false` when it ends.
    events: tokio::sync::mpsc::UnboundedReceiver<bool>,
}

impl PausableReader {
    async fn start(url: String, watchdog: Duration) -> PausableReader {
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let (pause, mut pauses) = tokio::sync::mpsc::unbounded_channel::<Duration>();
        let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let client = client_with_watchdog(watchdog);
                let lock = client
                    .read_write_lock(&node_at(&url, Duration::from_millis(500)), NAME)
                    .unwrap()
                    .read()
                    .with_owner(Owner::new("reader-1").unwrap());
                let guard = Arc::new(lock.lock().await.unwrap());
                let field = format!("{}:reader-1", client.id());
                let _ = ready_tx.send((guard.clone(), field));
                while let Some(pause) = pauses.recv().await {
                    let _ = events_tx.send(true);
                    // Blocks the runtime's only thread: nothing of this
                    // client runs meanwhile.
                    std::thread::sleep(pause);
                    let _ = events_tx.send(false);
                }
                if let Ok(guard) = Arc::try_unwrap(guard) {
                    let _ = guard.unlock().await;
                }
            });
        });
        let (guard, field) = ready.await.expect("the paused reader took its read lock");
        PausableReader {
            guard,
            field,
            pause,
            events,
        }
    }

    /// Pauses the client for `pause`; returns once the pause has started.
    async fn pause(&mut self, pause: Duration) {
        self.pause.send(pause).unwrap();
        assert_eq!(self.events.recv().await, Some(true));
    }

    /// Waits (at most `limit`) until the pause has ended.
    async fn resumed(&mut self, limit: Duration) {
        let ended = tokio::time::timeout(limit, self.events.recv()).await;
        assert_eq!(ended, Ok(Some(false)), "the pause did not end in time");
    }
}

/// How far ahead `guard` claims validity (None: it claims none).
fn validity_left(guard: &Guard) -> Option<Duration> {
    let until = guard.valid_until()?;
    let now = std::time::Instant::now();
    (until > now).then(|| until - now)
}

/// A read hold whose timeout key expired is expired, whatever its hash
/// field says: a reader paused (its whole client) past its 3 s watchdog
/// lease while another reader's 60 s hold keeps the hash must not be
/// renewed back to life from the hash field alone on resume, nor claim a
/// validity when that other reader leaves and a writer gets in.
#[tokio::test]
async fn a_paused_readers_expired_hold_is_not_revived_by_renewal() {
    let server = server().await;
    let url = server.url();
    let watchdog = Duration::from_secs(3);
    let mut paused = PausableReader::start(url.clone(), watchdog).await;
    let timeout_key = redisson_rwlock::read_timeout(NAME, &paused.field, 1);
    // Another client's reader keeps the hash for a minute: nothing expires
    // on its own during the checks but the paused reader's key.
    let second = rw(&server)
        .read()
        .with_owner(Owner::new("reader-2").unwrap())
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    assert!(
        validity_left(&paused.guard).is_some(),
        "held before the pause"
    );
    assert!(exists(&url, &timeout_key).await);

    paused.pause(Duration::from_secs(5)).await;
    wait_absent(
        &url,
        &timeout_key,
        PATIENCE,
        "the paused reader's 3 s timeout key expires",
    )
    .await;
    let field_left: Option<i64> = run(&url, redis::cmd("HGET").arg(NAME).arg(&paused.field))
        .await
        .unwrap();
    assert_eq!(
        field_left,
        Some(1),
        "its hash field stays, kept by reader-2"
    );
    let scripts_before = script_calls(&url).await;
    paused.resumed(Duration::from_secs(10)).await;

    // Two renewal periods and more: the one due at once on resume, and
    // the next.
    let resumed = Instant::now();
    while resumed.elapsed() < watchdog {
        if let Some(left) = validity_left(&paused.guard) {
            panic!(
                "{:?} after the resume, the guard claims {left:?} more of validity, \
                 though its timeout key {timeout_key} expired during the pause \
                 (renewed from the hash field alone)",
                resumed.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        script_calls(&url).await > scripts_before,
        "a renewal ran after the resume"
    );
    tokio::time::timeout(Duration::from_secs(1), paused.guard.lost())
        .await
        .expect("lost() resolves: the hold expired during the pause");

    // reader-2 leaves: no timeout key is left, the hash goes, a writer gets in.
    second.unlock().await.unwrap();
    let writer = rw(&server)
        .write()
        .with_owner(Owner::new("writer").unwrap())
        .try_lock_for(PATIENCE, Some(LONG_LEASE))
        .await
        .unwrap()
        .expect("the writer gets in: no read timeout key is left");
    assert_eq!(
        validity_left(&paused.guard),
        None,
        "the paused reader claims validity while a writer holds"
    );
    tokio::time::timeout(Duration::from_secs(1), paused.guard.lost())
        .await
        .expect("lost() still resolves while a writer holds");
    writer.unlock().await.unwrap();
}

/// The writer (a third owner) taken after `other` read and left, while a
/// read hold of `job` (60 s) is valid: must be None.
async fn writer_after_other_reader_left(server: &RedisProcess) -> Option<Guard> {
    let other = rw(server)
        .read()
        .with_owner(Owner::new("other").unwrap())
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    other.unlock().await.unwrap();
    rw(server)
        .write()
        .with_owner(Owner::new("writer").unwrap())
        .try_lock_for(Duration::from_secs(1), Some(LONG_LEASE))
        .await
        .unwrap()
}

/// A reader whose owner id ends in `:write` is a reader like any other:
/// when another reader leaves, its hold keeps writers out. (The owner may
/// instead be refused as invalid: then there is no such reader.)
#[tokio::test]
async fn a_reader_whose_owner_ends_in_write_keeps_writers_out() {
    let server = server().await;
    let owner = match Owner::new("job:write") {
        Ok(owner) => owner,
        Err(Error::InvalidArgument(_)) => return,
        Err(err) => panic!("{err:?}"),
    };
    let job = match rw(&server)
        .read()
        .with_owner(owner)
        .lock_with_lease(LONG_LEASE)
        .await
    {
        Ok(guard) => guard,
        Err(Error::InvalidArgument(_)) => return,
        Err(err) => panic!("{err:?}"),
    };
    let writer = writer_after_other_reader_left(&server).await;
    let left = validity_left(&job).expect("job:write's 60 s read hold is valid");
    assert!(
        writer.is_none(),
        "a writer got in while job:write's read hold is valid for {left:?} more \
         (the lock's mode: {:?})",
        mode(&server.url()).await
    );
    job.unlock().await.unwrap();
}

/// The same on the wire, whatever our owner rules: a foreign client's read
/// hold (Redisson's read acquire, run raw) whose field ends in `:write`
/// keeps our writer out after our other reader leaves.
#[tokio::test]
async fn a_foreign_read_field_ending_in_write_keeps_our_writers_out() {
    let server = server().await;
    let url = server.url();
    let foreign = "6f1c0e9a-1111-2222-3333-444455556666:job:write";
    let mut raw = raw(&url).await;
    let granted: Option<i64> = redisson_rwlock::read_acquire(NAME, foreign, LONG_LEASE)
        .invoke_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(granted, None);
    let writer = writer_after_other_reader_left(&server).await;
    let left = pttl(&url, &redisson_rwlock::read_timeout(NAME, foreign, 1)).await;
    assert!(left > 50_000, "the foreign read hold is valid ({left} ms)");
    assert!(
        writer.is_none(),
        "a writer got in while the foreign read hold {foreign} is valid for {left} ms more \
         (the lock's mode: {:?})",
        mode(&url).await
    );
}

/// A read hold lives by its timeout key, not its hash field (issue 34's
/// class audit): once the key is gone (deleted here, as expiry would while
/// another reader keeps the hash), every script and query that met the
/// field alone treats the hold as over. The watchdog's renewal finds it
/// gone (`lost()` fires within a renewal period, with no pause to lapse
/// the guard's trust), `hold_count` does not count it, the owner's write
/// attempt is not refused as an upgrade; a fixed-lease read's `extend`
/// is refused by the server, and its unlock says `NotHeld` and removes
/// the stale field.
#[tokio::test]
async fn a_read_hold_whose_timeout_key_is_gone_is_over_everywhere() {
    let server = server().await;
    let url = server.url();
    let client = client(); // 1 s watchdog
    let locks = client.read_write_lock(&node(&server), NAME).unwrap();
    let job = locks.with_owner(Owner::new("job").unwrap());
    let solo = locks.with_owner(Owner::new("solo").unwrap());
    let field = |owner: &str| format!("{}:{owner}", client.id());
    let drop_timeout_keys = |owner: &str, holds: u32| {
        let (url, field) = (url.clone(), field(owner));
        async move {
            for n in 1..=holds {
                let key = redisson_rwlock::read_timeout(NAME, &field, n);
                let deleted: i64 = run(&url, redis::cmd("DEL").arg(&key)).await.unwrap();
                assert_eq!(deleted, 1, "{key}");
            }
        }
    };
    let count_of = |owner: &str| {
        let (url, field) = (url.clone(), field(owner));
        async move {
            run::<Option<i64>>(&url, redis::cmd("HGET").arg(NAME).arg(&field))
                .await
                .unwrap()
        }
    };
    let renewed = job.read().lock().await.unwrap();
    let also = job.read().lock_with_lease(LONG_LEASE).await.unwrap();
    let leased = solo.read().lock_with_lease(LONG_LEASE).await.unwrap();
    let other = rw(&server)
        .read()
        .with_owner(Owner::new("other").unwrap())
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    assert_eq!(job.read().hold_count().await.unwrap(), 2);
    drop_timeout_keys("job", 2).await;
    drop_timeout_keys("solo", 1).await;
    assert_eq!(
        count_of("job").await,
        Some(2),
        "the field outlives its keys"
    );

    assert_eq!(job.read().hold_count().await.unwrap(), 0);
    assert_eq!(solo.read().hold_count().await.unwrap(), 0);
    tokio::time::timeout(PATIENCE, renewed.lost())
        .await
        .expect("the renewal finds the read hold gone");
    let write = job.write().try_lock().await;
    assert!(
        matches!(write, Ok(None)),
        "the owner of expired reads waits for the other reader, not refused as an upgrade: {write:?}"
    );
    drop((renewed, also));
    assert!(matches!(
        leased.extend(LONG_LEASE).await,
        Err(Error::NotHeld { .. })
    ));
    assert!(matches!(leased.unlock().await, Err(Error::NotHeld { .. })));
    assert_eq!(count_of("solo").await, None, "the stale field was removed");
    other.unlock().await.unwrap();
    assert!(!exists(&url, NAME).await);
}

/// The last live reader's release frees the lock when the hash outlives
/// its timeout key by a few milliseconds and all else left is the field of
/// a reader whose keys are gone. A read grant sets the key and the hash's
/// TTL with two commands of one script, a clock tick apart now and then (a
/// foreign client's grant, or a server descheduled mid-script, further):
/// a release that took the hash for another hold's then left it, and the
/// lock, to the rest of the lease (a CI run of the test above caught it).
#[tokio::test]
async fn the_last_reader_frees_the_lock_when_the_hash_is_a_tick_ahead() {
    let server = server().await;
    let url = server.url();
    let client = long_lease_client();
    let locks = client.read_write_lock(&node(&server), NAME).unwrap();
    let crashed = locks.with_owner(Owner::new("crashed").unwrap());
    let last = locks.with_owner(Owner::new("last").unwrap());
    let crashed_guard = crashed.read().lock_with_lease(LONG_LEASE).await.unwrap();
    let last_guard = last.read().lock_with_lease(LONG_LEASE).await.unwrap();
    // The crashed reader's hold is over: its key expired (deleted here).
    let crashed_key = redisson_rwlock::read_timeout(NAME, &format!("{}:crashed", client.id()), 1);
    let deleted: i64 = run(&url, redis::cmd("DEL").arg(&crashed_key))
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    // The hash a few ticks ahead of the last reader's key.
    let last_key = redisson_rwlock::read_timeout(NAME, &format!("{}:last", client.id()), 1);
    let key_ttl = pttl(&url, &last_key).await;
    let _: i64 = run(&url, redis::cmd("PEXPIRE").arg(NAME).arg(key_ttl + 5))
        .await
        .unwrap();
    last_guard.unlock().await.unwrap();
    let left = pttl(&url, NAME).await;
    assert!(
        left < 0,
        "the lock outlives its last reader by {left} ms, kept by a field whose keys are gone"
    );
    drop(crashed_guard);
}

/// Waits (at most [`PATIENCE`]) until read hold `n` of `owner` of `client`
/// on `url` has expired: its timeout key is gone.
async fn read_key_expired(url: &str, client: &Client, owner: &str, n: u32) {
    let key = redisson_rwlock::read_timeout(NAME, &format!("{}:{owner}", client.id()), n);
    wait_absent(url, &key, PATIENCE, "the read hold's lease runs out").await;
}

/// From the audit of issue 34's fix: read holds are known by their keys'
/// values, not their numbers. Owner `o`'s first read (300 ms lease)
/// expires while `b` keeps the hash; `o`'s second read (20 s) is applied
/// and its future dropped. Its rollback must take its own 20 s key, not the
/// expired one's number, or nothing holds a read and writers are refused
/// for 20 s. Before the fix, a writer waited 3 s in vain.
#[tokio::test]
async fn a_cancelled_read_reentry_leaves_no_hold_behind() {
    let server = server().await;
    let url = server.url();
    let client = long_lease_client();
    let locks = client.read_write_lock(&node(&server), NAME).unwrap();
    let o = locks.with_owner(Owner::new("o").unwrap());
    let b = locks
        .with_owner(Owner::new("b").unwrap())
        .read()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let first = o
        .read()
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    read_key_expired(&url, &client, "o", 1).await;
    let field = format!("{}:o", client.id());
    let count = || async {
        run::<Option<u64>>(&url, redis::cmd("HGET").arg(NAME).arg(&field))
            .await
            .unwrap()
    };
    let mut cancelled = Box::pin(o.read().lock_with_lease(Duration::from_secs(20)));
    assert!(futures::poll!(&mut cancelled).is_pending());
    eventually(
        PATIENCE,
        |c: &Option<u64>| format!("not applied: count {c:?}"),
        || async {
            let c = count().await;
            if c == Some(2) { Ok(()) } else { Err(c) }
        },
    )
    .await;
    drop(cancelled);
    eventually(
        PATIENCE,
        |c: &Option<u64>| format!("not rolled back: count {c:?}"),
        || async {
            let c = count().await;
            if c.is_none() { Ok(()) } else { Err(c) }
        },
    )
    .await;
    assert_eq!(o.read().hold_count().await.unwrap(), 0);
    assert!(matches!(first.unlock().await, Err(Error::NotHeld { .. })));
    b.unlock().await.unwrap();
    let writer = locks
        .with_owner(Owner::new("w").unwrap())
        .write()
        .try_lock()
        .await
        .unwrap();
    assert!(
        writer.is_some(),
        "no guard holds a read, yet the writer was refused"
    );
}

/// From the audit: one owner's read that expired and a later one of the
/// same owner (a re-entry with a longer lease, which keeps the entry's
/// guards valid): the expired one's unlock says `NotHeld` and leaves the
/// later hold alone; the later one's unlock frees the lock. (The later
/// one's unlock first, with the expired one's key gone, used to take the
/// expired one's number and leave the later key behind.)
#[tokio::test]
async fn an_expired_read_and_a_later_one_of_its_owner_release_exactly() {
    let server = server().await;
    let url = server.url();
    let client = long_lease_client();
    let locks = client.read_write_lock(&node(&server), NAME).unwrap();
    let o = locks.with_owner(Owner::new("o").unwrap());
    let b = locks
        .with_owner(Owner::new("b").unwrap())
        .read()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    for later_first in [false, true] {
        let first = o
            .read()
            .lock_with_lease(Duration::from_millis(300))
            .await
            .unwrap();
        read_key_expired(&url, &client, "o", 1).await;
        let later = o.read().lock_with_lease(LONG_LEASE).await.unwrap();
        if later_first {
            later.unlock().await.unwrap();
            drop(first); // its hold is known over: nothing is sent
        } else {
            assert!(
                matches!(first.unlock().await, Err(Error::NotHeld { .. })),
                "the expired hold's unlock"
            );
            assert_eq!(
                o.read().hold_count().await.unwrap(),
                1,
                "the later hold stays"
            );
            later.unlock().await.unwrap();
        }
        assert_eq!(
            o.read().hold_count().await.unwrap(),
            0,
            "later first: {later_first}"
        );
    }
    b.unlock().await.unwrap();
    assert!(!exists(&url, NAME).await, "no read hold is left behind");
}

/// From the audit: the writer reads with a 300 ms lease, the read expires,
/// then the write (renewed) is released: the downgrade finds no live read
/// and frees the lock, instead of keeping it in read mode for the rest of
/// the write's TTL (about a minute) with no guard holding it.
#[tokio::test]
async fn a_downgrade_to_expired_reads_frees_the_lock() {
    let server = server().await;
    let url = server.url();
    let client = long_lease_client(); // the write's TTL: a minute
    let locks = client.read_write_lock(&node(&server), NAME).unwrap();
    let w = locks.with_owner(Owner::new("w").unwrap());
    let writing = w.write().lock().await.unwrap();
    let reading = w
        .read()
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    read_key_expired(&url, &client, "w", 1).await;
    // The read's guard is still there, its field too: the downgrade must
    // look at the key, not the field.
    writing.unlock().await.unwrap();
    assert!(!exists(&url, NAME).await, "mode {:?}", mode(&url).await);
    drop(reading);
    // A live read is downgraded to, and the hash lives as long as it.
    let writing = w.write().lock().await.unwrap();
    let reading = w
        .read()
        .lock_with_lease(Duration::from_secs(5))
        .await
        .unwrap();
    writing.unlock().await.unwrap();
    assert_eq!(mode(&url).await.as_deref(), Some("read"));
    let ttl = pttl(&url, NAME).await;
    assert!(
        (1..=5_000).contains(&ttl),
        "the hash lives as long as the read: {ttl} ms"
    );
    reading.unlock().await.unwrap();
    assert!(!exists(&url, NAME).await);
}

/// From the second audit: a read hold is valid for its own key, not for a
/// longer hold of the same owner (each read hold has its own key). Owner
/// `o` reads for 1 s, then for 20 s; once the short hold's key expired and
/// the long one is released, a writer gets in, and the short guard must not
/// claim validity (it claimed the long hold's ~18 s before the fix).
#[tokio::test]
async fn a_read_guard_is_valid_for_its_own_key_only() {
    let server = server().await;
    let url = server.url();
    let client = long_lease_client();
    let o = client
        .read_write_lock(&node(&server), NAME)
        .unwrap()
        .with_owner(Owner::new("o").unwrap());
    let short = o
        .read()
        .lock_with_lease(Duration::from_secs(1))
        .await
        .unwrap();
    let long = o.read().lock_with_lease(LONG_LEASE).await.unwrap();
    read_key_expired(&url, &client, "o", 1).await;
    long.unlock().await.unwrap();
    let writer = rw(&server)
        .with_owner(Owner::new("w").unwrap())
        .write()
        .try_lock()
        .await
        .unwrap()
        .expect("no live read is left");
    let now = std::time::Instant::now();
    assert!(
        short.valid_until().is_none_or(|until| until <= now),
        "a writer holds, yet the expired read guard claims {:?} more",
        short.valid_until().map(|until| until - now)
    );
    tokio::time::timeout(Duration::from_millis(100), short.lost())
        .await
        .expect("lost() has fired");
    writer.unlock().await.unwrap();
}
