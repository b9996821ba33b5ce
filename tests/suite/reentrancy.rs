//! Reentrancy and mutual exclusion of the single-node lock.

use std::time::Duration;

use crate::common::*;
use multilock::testkit::TestServer;
use multilock::{Client, Owner};

#[tokio::test]
async fn hold_count_rises_and_falls_with_reentry() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "reentrant").unwrap();

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

/// 32 tasks x 50 acquisitions guarding a read-sleep-write counter in Redis:
/// any overlap of two holders loses an increment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_keeps_a_non_atomic_counter_exact() {
    const TASKS: usize = 32;
    const ROUNDS: usize = 50;
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "counter-lock").unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| spawn_counter_task(lock.clone(), server.url(), ROUNDS, None))
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(counter(&server.url()).await, (TASKS * ROUNDS) as u64);
    assert!(!exists(&server.url(), "counter-lock").await);
}
