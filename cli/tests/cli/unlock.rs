//! `multilock unlock --force`: a waiter wakes at once, nothing held is exit
//! 3, no confirmation is exit 4, and `auto` picks the kind stored.

use std::time::{Duration, Instant};

use multilock::{Client, Node, Owner};
use multilock_testkit::{RedisProcess, TestServer, protocol, redisson_fair, redisson_rwlock};

use crate::common::{
    LONG_LEASE, args, node_args, raw, run_expecting, run_with_input, wait_for_listeners,
};

#[tokio::test]
async fn a_force_unlock_wakes_a_waiter_long_before_the_lease_ends() {
    let server = RedisProcess::start().await.unwrap();
    let node = Node::new(&server.url()).unwrap();
    let holder = Client::new().lock(&node, "orders:42").unwrap();
    let _held = holder.lock_with_lease(LONG_LEASE).await.unwrap();
    let waiter = Client::new().lock(&node, "orders:42").unwrap();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let guard = waiter.try_lock_for(Duration::from_secs(20), None).await;
        (guard, started.elapsed())
    });
    wait_for_listeners(&server.url(), &protocol::channel("orders:42"), 1).await;

    let unlocked = Instant::now();
    let run = run_expecting(
        &args(
            &["unlock", "orders:42", "--force", "--yes"],
            &node_args(&server.url()),
        ),
        0,
    )
    .await;
    assert!(run.stdout.contains("deleted"), "{run:?}");
    let (guard, _) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter ends within its wait")
        .unwrap();
    let guard = guard.unwrap().expect("granted after the force unlock");
    // Woken by the unlock message, not by the end of the 60 s lease (nor
    // by the end of its 20 s wait).
    assert!(
        unlocked.elapsed() < Duration::from_secs(10),
        "{:?}",
        unlocked.elapsed()
    );
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn nothing_held_is_exit_3_and_no_confirmation_is_exit_4() {
    let server = RedisProcess::start().await.unwrap();
    let nodes = node_args(&server.url());
    let run = run_expecting(
        &args(&["unlock", "free-lock", "--force", "--yes"], &nodes),
        3,
    )
    .await;
    assert!(run.stdout.contains("nothing deleted"), "{run:?}");

    let node = Node::new(&server.url()).unwrap();
    let lock = Client::new().lock(&node, "kept").unwrap();
    let _guard = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let declined = run_with_input(&args(&["unlock", "kept", "--force"], &nodes), "n\n").await;
    assert_eq!(declined.code, Some(4), "{declined:?}");
    assert!(lock.is_locked().await.unwrap(), "still held");
    // End of input is no confirmation either.
    let silent = run_with_input(&args(&["unlock", "kept", "--force"], &nodes), "").await;
    assert_eq!(silent.code, Some(4), "{silent:?}");
    // Without --force: refused as a usage error, before any request.
    let refused = run_expecting(&args(&["unlock", "kept", "--yes"], &nodes), 2).await;
    assert!(refused.stderr.contains("--force"), "{refused:?}");
    assert!(lock.is_locked().await.unwrap(), "still held");
    // The lock's name confirms too.
    let typed = run_with_input(&args(&["unlock", "kept", "--force"], &nodes), "kept\n").await;
    assert_eq!(typed.code, Some(0), "{typed:?}");
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test]
async fn auto_unlocks_a_redisson_read_lock_in_its_mode_and_wakes_a_writer() {
    let server = RedisProcess::start().await.unwrap();
    let java = "6f0c9a5e-1b2c-4d3e-8f90-a1b2c3d4e5f6:57";
    let granted: Option<i64> = redisson_rwlock::read_acquire("catalog", java, LONG_LEASE)
        .invoke_async(&mut raw(&server.url()).await)
        .await
        .unwrap();
    assert_eq!(granted, None);
    let node = Node::new(&server.url()).unwrap();
    let rw = Client::new().read_write_lock(&node, "catalog").unwrap();
    let writer = rw.write().with_owner(Owner::new("writer").unwrap());
    let waiting =
        tokio::spawn(async move { writer.try_lock_for(Duration::from_secs(20), None).await });
    wait_for_listeners(&server.url(), &redisson_rwlock::channel("catalog"), 1).await;

    let run = run_expecting(
        &args(
            &["unlock", "catalog", "--force", "--yes"],
            &node_args(&server.url()),
        ),
        0,
    )
    .await;
    assert!(run.stdout.contains("read lock force unlock"), "{run:?}");
    let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the writer wakes on the read-write lock's channel")
        .unwrap()
        .unwrap()
        .expect("granted");
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn auto_unlocks_a_fair_lock_and_its_queue_head_takes_it() {
    let server = RedisProcess::start().await.unwrap();
    let node = Node::new(&server.url()).unwrap();
    let client = Client::new();
    let fair = client.fair_lock(&node, "tickets").unwrap();
    let _held = fair
        .with_owner(Owner::new("holder").unwrap())
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let head = fair.with_owner(Owner::new("head").unwrap());
    let waiting =
        tokio::spawn(async move { head.try_lock_for(Duration::from_secs(20), None).await });
    let channel = redisson_fair::waiter_channel("tickets", &format!("{}:head", client.id()));
    wait_for_listeners(&server.url(), &channel, 1).await;

    let run = run_expecting(
        &args(
            &["unlock", "tickets", "--force", "--yes"],
            &node_args(&server.url()),
        ),
        0,
    )
    .await;
    assert!(run.stdout.contains("fair lock force unlock"), "{run:?}");
    let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the head wakes on its own channel")
        .unwrap()
        .unwrap()
        .expect("granted");
    guard.unlock().await.unwrap();
}
