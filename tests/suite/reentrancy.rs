//! Reentrancy and mutual exclusion of the single-node lock.

use std::time::Duration;

use crate::common::*;
use multilock::{Client, Owner};
use multilock_testkit::{TestServer, poll_until};

#[tokio::test]
async fn hold_count_rises_and_falls_with_reentry() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client
        .lock(&node, "reentrant")
        .unwrap()
        .with_owner(Owner::new("job").unwrap());

    let g1 = lock.lock().await.unwrap();
    let g2 = lock.lock().await.unwrap();
    let g3 = lock
        .try_lock()
        .await
        .unwrap()
        .expect("re-entry never waits");
    assert_eq!(lock.hold_count().await.unwrap(), 3);
    assert!(lock.is_held_by_current_owner().await.unwrap());

    g3.unlock().await.unwrap();
    g2.unlock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 1);
    assert!(
        lock.is_locked().await.unwrap(),
        "still held after 2 of 3 unlocks"
    );
    g1.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    assert!(!exists(&server.url(), "reentrant").await);
}

#[tokio::test]
async fn two_tasks_exclude_each_other() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "tasks").unwrap();

    let guard = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await.unwrap() }
    })
    .await
    .unwrap();
    let other = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_lock().await.unwrap().is_none() }
    });
    assert!(other.await.unwrap(), "another task must not enter");
    // A guard unlocks from any task: it carries its owner.
    tokio::spawn(async move { guard.unlock().await.unwrap() })
        .await
        .unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test]
async fn two_clients_exclude_each_other_even_with_one_owner_name() {
    let server = server().await;
    let node = node(&server);
    let owner = Owner::new("same-owner").unwrap();
    let a = Client::new()
        .lock(&node, "clients")
        .unwrap()
        .with_owner(owner.clone());
    let b = Client::new()
        .lock(&node, "clients")
        .unwrap()
        .with_owner(owner);
    let guard = a.lock().await.unwrap();
    assert!(b.try_lock().await.unwrap().is_none());
    assert!(
        b.try_lock_for(Duration::from_millis(200), None)
            .await
            .unwrap()
            .is_none(),
        "a bounded wait ends empty-handed while the other client holds"
    );
    guard.unlock().await.unwrap();
    b.try_lock()
        .await
        .unwrap()
        .expect("free after unlock")
        .unlock()
        .await
        .unwrap();
}

#[tokio::test]
async fn explicit_owner_shares_a_hold_across_tasks() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let owner = Owner::new("job-1").unwrap();
    let lock = client.lock(&node, "handoff").unwrap().with_owner(owner);
    let first = lock.lock().await.unwrap();
    let second = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_lock().await.unwrap() }
    })
    .await
    .unwrap()
    .expect("the same explicit owner re-enters from another task");
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    first.unlock().await.unwrap();
    second.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

/// Issue 34, defect 4: two futures of one task, joined, each take the same
/// lock with a bounded wait, as ordinary async code does. They are not
/// nested, so they must exclude each other: the second is granted only
/// after the first released. Before the fix both held at once (the task
/// was the owner, so the second re-entered) and `hold_count` read 2.
#[tokio::test]
async fn two_futures_of_one_task_exclude_each_other() {
    let server = server().await;
    let node = node(&server);
    let lock = long_lease_client().lock(&node, "joined").unwrap();
    let holders = std::sync::atomic::AtomicUsize::new(0);
    let most = std::sync::atomic::AtomicUsize::new(0);
    let work = || async {
        let guard = lock
            .try_lock_for(Duration::from_secs(5), Some(Duration::from_secs(30)))
            .await
            .unwrap()
            .expect("granted once the other released");
        let now = holders.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        holders.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        guard.unlock().await.unwrap();
    };
    tokio::join!(work(), work());
    assert_eq!(
        most.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "two futures of one task held the lock at once"
    );
    assert!(!exists(&server.url(), "joined").await);
}

/// Re-entry is asked for: inside the work of `run_locked`, the same lock
/// re-enters (the work is the hold's scope), while a future beside it in
/// the same task waits; a handle bound to the guard's owner re-enters too.
#[tokio::test]
async fn run_locked_work_re_enters_and_its_sibling_waits() {
    let server = server().await;
    let node = node(&server);
    let lock = long_lease_client().lock(&node, "scope").unwrap();
    let sibling_got_in = std::sync::atomic::AtomicBool::new(false);
    let scoped = lock.run_locked(|_| async {
        let inner = lock
            .try_lock()
            .await
            .unwrap()
            .expect("the work re-enters its lock");
        assert_eq!(lock.hold_count().await.unwrap(), 2);
        assert!(lock.is_held_by_current_owner().await.unwrap());
        // Give the sibling time to try.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !sibling_got_in.load(std::sync::atomic::Ordering::SeqCst),
            "a sibling future got in while the scope held the lock"
        );
        inner.unlock().await.unwrap();
    });
    let sibling = async {
        tokio::task::yield_now().await;
        let guard = lock
            .try_lock_for(Duration::from_secs(5), None)
            .await
            .unwrap()
            .expect("granted after the scope released");
        sibling_got_in.store(true, std::sync::atomic::Ordering::SeqCst);
        guard
    };
    let (scoped, guard) = tokio::join!(scoped, sibling);
    scoped.unwrap();
    let same_owner = lock.with_owner(guard.owner().clone());
    let again = same_owner
        .try_lock()
        .await
        .unwrap()
        .expect("the guard's owner re-enters");
    assert_eq!(same_owner.hold_count().await.unwrap(), 2);
    again.unlock().await.unwrap();
    guard.unlock().await.unwrap();
    assert!(!exists(&server.url(), "scope").await);
}

/// 32 tasks x 50 acquisitions guarding a read-sleep-write counter in Redis:
/// any overlap of two holders loses an increment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_keeps_a_non_atomic_counter_exact() {
    const TASKS: usize = 32;
    const ROUNDS: usize = 50;
    let server = server().await;
    let node = node(&server);
    // Its key outlives the wait for a background release: only the
    // release removes it in time.
    let client = long_lease_client();
    let lock = client.lock(&node, "counter-lock").unwrap();
    let holds = Holds::of(&client, std::slice::from_ref(&server));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| spawn_counter_task(lock.clone(), server.url(), ROUNDS, None, holds.clone()))
        .collect();
    join_counter_tasks(tasks).await;
    assert_eq!(counter(&server.url()).await, (TASKS * ROUNDS) as u64);
    assert!(!exists(&server.url(), "counter-lock").await);
}

// ---------------------------------------------------------------------------
// Regressions of defects an audit reproduced: each failed before its fix.

/// Outer `lock()` under a 3 s watchdog; in the same task a 300 ms re-entry
/// and its unlock. The key must keep the outer hold's TTL: no other client
/// gets in while the outer guard reports validity.
#[tokio::test]
async fn a_short_reentry_does_not_cut_a_watchdog_hold() {
    let server = server().await;
    let node = node(&server);
    let lock = client_with_watchdog(Duration::from_secs(3))
        .lock(&node, "cut")
        .unwrap()
        .with_owner(Owner::new("job").unwrap());
    let outer = lock.lock().await.unwrap();
    let inner = lock
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    inner.unlock().await.unwrap();
    assert!(
        pttl(&server.url(), "cut").await > 1_000,
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
    assert!(!exists(&server.url(), "cut").await);
}

/// Outer 10 s lease, inner 200 ms dropped: the key keeps the outer's lease.
#[tokio::test]
async fn a_short_reentry_does_not_cut_a_fixed_lease() {
    let server = server().await;
    let node = node(&server);
    let lock = client()
        .lock(&node, "cut-fixed")
        .unwrap()
        .with_owner(Owner::new("job").unwrap());
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

/// Re-entry with a longer lease extends the key; the outer guard's unlock
/// then releases a held lock (it used to report `NotHeld` and leave the key
/// for the inner lease).
#[tokio::test]
async fn the_outer_guard_follows_a_longer_reentry() {
    let server = server().await;
    let node = node(&server);
    let lock = client()
        .lock(&node, "longer")
        .unwrap()
        .with_owner(Owner::new("job").unwrap());
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
    assert!(
        exists(&server.url(), "longer").await,
        "the longer lease holds it"
    );
    let valid_until = outer.valid_until().expect("a fixed lease has an end");
    assert!(
        valid_until > std::time::Instant::now() + Duration::from_secs(10),
        "the outer guard's validity follows the key"
    );
    outer.unlock().await.unwrap();
    assert!(!exists(&server.url(), "longer").await);
}

/// The audit of issue 34's fix: two critical sections guarded by
/// `run_locked`, joined inside the work of a `run_locked` of the same lock.
/// Each re-enters the outer hold, but they are siblings, not nested in each
/// other: they take turns (each still re-enters, so neither waits for the
/// outer hold to end). Before the turns, both held at once.
#[tokio::test]
async fn joined_sections_inside_a_scope_take_turns() {
    let server = server().await;
    let node = node(&server);
    let lock = long_lease_client().lock(&node, "nested-join").unwrap();
    let holders = std::sync::atomic::AtomicUsize::new(0);
    let most = std::sync::atomic::AtomicUsize::new(0);
    let section = || {
        lock.run_locked(|_| async {
            let now = holders.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
            // Code the section calls re-enters it.
            let inner = lock
                .try_lock()
                .await
                .unwrap()
                .expect("nested in the section");
            tokio::time::sleep(Duration::from_millis(200)).await;
            inner.unlock().await.unwrap();
            holders.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        })
    };
    lock.run_locked(|_| async {
        let (a, b) = tokio::join!(section(), section());
        a.unwrap();
        b.unwrap();
        // Both sections are over: the scope's turn is free again.
        let again = lock
            .try_lock()
            .await
            .unwrap()
            .expect("re-enters once they are done");
        again.unlock().await.unwrap();
    })
    .await
    .unwrap();
    assert_eq!(
        most.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "two joined sections under one scope held the lock at once"
    );
    assert!(!exists(&server.url(), "nested-join").await);
}

/// From the second audit: inside a MultiLock's `run_locked`, its parts are
/// re-entered one after the other in plain sequential code (each lock has
/// its own turn); and `run_locked`s nested over two locks run as one owner,
/// so a MultiLock of both, inside, re-enters both parts. Before, the second
/// part waited for the first part's turn, and the MultiLock for an owner
/// that held only one of them (both for ever with `lock()`).
#[tokio::test]
async fn scopes_re_enter_parts_and_nested_holds() {
    let servers = servers(2).await;
    let (n0, n1) = (node(&servers[0]), node(&servers[1]));
    let client = long_lease_client();
    let a = client.lock(&n0, "part-a").unwrap();
    let b = client.lock(&n1, "part-b").unwrap();
    let wait = Duration::from_secs(3);
    let multi = client.multi_lock(vec![a.clone(), b.clone()]).unwrap();
    multi
        .run_locked(|_| async {
            let ga = a
                .try_lock_for(wait, None)
                .await
                .unwrap()
                .expect("part a re-entered");
            let gb = b
                .try_lock_for(wait, None)
                .await
                .unwrap()
                .expect("part b re-entered");
            gb.unlock().await.unwrap();
            ga.unlock().await.unwrap();
        })
        .await
        .unwrap();
    a.run_locked(|_| async {
        b.run_locked(|_| async {
            let both = client.multi_lock(vec![a.clone(), b.clone()]).unwrap();
            let guard = both
                .try_lock_for(wait, None)
                .await
                .unwrap()
                .expect("both parts re-entered inside the scopes holding them");
            guard.unlock().await.unwrap();
        })
        .await
        .unwrap();
    })
    .await
    .unwrap();
    assert!(!exists(&servers[0].url(), "part-a").await);
    assert!(!exists(&servers[1].url(), "part-b").await);
}
