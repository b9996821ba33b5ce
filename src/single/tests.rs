//! The order of an owner's requests and the rollbacks of its earlier ones,
//! on a real server.

use std::time::Duration;

use tokio::time::Instant;

use super::acquire::Undo;
use super::*;
use crate::Client;
use crate::testkit::{RedisProcess, TestServer, poll_until};

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

    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let tombstone = lock.inner.keys.unlock_latch(&unknown);
    poll_until(
        Duration::from_secs(5),
        || "the rollback was never answered".to_owned(),
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
    let count: Option<u64> = redis::cmd("HGET")
        .arg("k")
        .arg(&*field)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(count, Some(1), "the granted hold is on the server");
    part.release().await.unwrap();
}
