//! The order of an owner's requests and the rollbacks of its earlier ones,
//! on a real server.

use std::time::Duration;

use tokio::time::Instant;

use super::acquire::Undo;
use super::*;
use crate::Client;
use crate::protocol;
use multilock_testkit::{RedisProcess, TestServer, poll_until};

/// CI's `down_then_back`: an acquire's outcome was unknown and its rollback
/// was decided (no holds on record), then the same owner asked again at
/// once. The rollback, counted before that request, must reach the server
/// before it, or it takes the new request's fresh hold for the unknown one
/// and undoes it: the caller holds a guard on a free lock.
///
/// Runs on one thread: the rollback's task runs only once the next request
/// is under way, the order that lost the hold.
#[tokio::test]
async fn the_next_request_of_an_owner_waits_for_its_rollback() {
    let server = RedisProcess::start().await.unwrap();
    let node = Node::new(&server.url()).unwrap();
    let lock = Client::new().lock(&node, "k").unwrap();
    let owner = Owner::new("o").unwrap();
    let field = lock.field(&owner);
    // Connected: requests leave in the order they are made.
    assert!(!lock.is_locked().await.unwrap());
    let unknown = protocol::new_request_id();
    // Sent, never applied: the rollback has nothing to undo.
    let undo = Undo {
        sent: true,
        ..Undo::default()
    };
    lock.roll_back_later(undo, field.clone(), unknown.clone(), Instant::now());

    let Attempt::Granted(part) = lock
        .attempt(&owner, Some(Duration::from_secs(60)))
        .await
        .unwrap()
    else {
        panic!("nobody else holds it");
    };

    let count = count_once_rolled_back(&server, &lock, &field, &[unknown]).await;
    assert_eq!(count, Some(1), "the granted hold is on the server");
    part.release().await.unwrap();
}

/// A grant whose request was in flight when a rollback of the same owner
/// counted the holds may be the hold that rollback undoes: it is not
/// trusted. It is rolled back too, and asked for once more after both
/// rollbacks were answered; the caller gets that grant, which stays.
#[tokio::test]
async fn a_grant_in_flight_during_a_rollback_is_asked_for_again() {
    let server = RedisProcess::start().await.unwrap();
    let node = Node::new(&server.url()).unwrap();
    let lock = Client::new().lock(&node, "k").unwrap();
    let owner = Owner::new("o").unwrap();
    let field = lock.field(&owner);
    // Connected: requests leave in the order they are made.
    assert!(!lock.is_locked().await.unwrap());

    let attempt = lock.attempt(&owner, Some(Duration::from_secs(60)));
    tokio::pin!(attempt);
    assert!(
        futures::poll!(&mut attempt).is_pending(),
        "the request is on its way"
    );
    // An earlier request of this owner, its outcome unknown, is rolled back
    // while the one above is in flight: the server will apply that rollback
    // after the grant, with no holds on record, and undo the grant.
    let unknown = protocol::new_request_id();
    let undo = Undo {
        sent: true,
        ..Undo::default()
    };
    lock.roll_back_later(undo, field.clone(), unknown.clone(), Instant::now());
    let Attempt::Granted(part) = attempt.await.unwrap() else {
        panic!("nobody else holds it");
    };

    let count = count_once_rolled_back(&server, &lock, &field, &[unknown]).await;
    assert_eq!(count, Some(1), "the grant the caller got is on the server");
    part.release().await.unwrap();
}

/// `field`'s hold count on `lock`'s key, read once the rollbacks of
/// `requests` left their tombstones (they were answered).
async fn count_once_rolled_back(
    server: &RedisProcess,
    lock: &Lock,
    field: &str,
    requests: &[Arc<str>],
) -> Option<u64> {
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for request in requests {
        let tombstone = lock.inner.keys.unlock_latch(request);
        poll_until(
            Duration::from_secs(5),
            || format!("the rollback of {request} was never answered"),
            || {
                let mut raw = raw.clone();
                let tombstone = tombstone.clone();
                async move {
                    let exists: bool = redis::cmd("EXISTS")
                        .arg(&tombstone)
                        .query_async(&mut raw)
                        .await
                        .unwrap();
                    exists.then_some(())
                }
            },
        )
        .await
        .unwrap();
    }
    redis::cmd("HGET")
        .arg(&*lock.inner.keys.name)
        .arg(field)
        .query_async(&mut raw)
        .await
        .unwrap()
}
