//! A node that goes down gives typed errors, and works again, waiting via
//! pub/sub included, once it is back.

use std::time::{Duration, Instant};

use crate::common::*;
use multilock::Client;
use multilock::testkit::TestServer;

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
    let guard = eventually(
        PATIENCE,
        |err| format!("still failing after restart: {err}"),
        || async {
            match lock.try_lock_for(Duration::ZERO, Some(LONG_LEASE)).await {
                Ok(Some(guard)) => Ok(guard),
                Ok(None) => panic!("nobody else holds it"),
                Err(err) => {
                    assert!(err.is_node_unavailable(), "{err:?}");
                    Err(err)
                }
            }
        },
    )
    .await;

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

/// A waiter whose node restarts gets a typed error or the lock: never a hang.
#[tokio::test]
async fn waiters_through_a_restart_end_promptly() {
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
        Err(err) => assert!(err.is_node_unavailable(), "{err:?}"),
        Ok(None) => panic!("the wait was not over"),
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
    server.unpause().await.unwrap();
    // The timed-out acquire is applied once the node resumed; it is rolled
    // back on its own connection, so the lock ends up free.
    let other = Client::new().lock(&node, "frozen").unwrap();
    take_and_release(&other, PATIENCE, "free after the rollback").await;
    assert!(!exists(&server.url(), "frozen").await);
}
