//! Bad input gets a clear typed error before anything is sent; unlock by a
//! non-holder is typed; secrets never show.

use std::time::Duration;

use crate::common::*;
use multilock::{Client, Error, Node, Owner};
use multilock_testkit::TestServer;

fn invalid<T: std::fmt::Debug>(result: multilock::Result<T>) -> String {
    match result {
        Err(Error::InvalidArgument(msg)) => msg,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_input_is_rejected_before_sending() {
    // A node nobody listens on: anything sent would fail differently.
    let node = Node::new("redis://127.0.0.1:1").unwrap();
    let client = Client::new();
    assert!(invalid(client.lock(&node, "")).contains("name"));
    let lock = client.lock(&node, "x").unwrap();
    assert!(invalid(lock.lock_with_lease(Duration::ZERO).await).contains("lease"));
    assert!(
        invalid(
            lock.try_lock_for(Duration::from_secs(1), Some(Duration::ZERO))
                .await
        )
        .contains("lease")
    );
    invalid(lock.with_replica_sync(0, Duration::from_secs(1)));
    invalid(lock.with_replica_sync(1, Duration::ZERO));
    invalid(Client::builder().watchdog_timeout(Duration::ZERO).build());
    invalid(Owner::new(""));
    invalid(client.multi_lock(vec![]));
    invalid(client.red_lock(vec![]));
    invalid(client.red_lock_on(&[], "x"));
    // The same node twice in a RedLock, as one handle or two for one address.
    invalid(client.red_lock(vec![lock.clone(), client.lock(&node, "y").unwrap()]));
    let same_addr = Node::new("redis://127.0.0.1:1").unwrap();
    invalid(client.red_lock_on(&[node.clone(), same_addr], "x"));
    // A MultiLock may lock several names on one node, but not one name twice.
    client
        .multi_lock(vec![lock.clone(), client.lock(&node, "y").unwrap()])
        .unwrap();
    invalid(client.multi_lock(vec![lock.clone(), lock.clone()]));
    // Locks of another client.
    invalid(Client::new().multi_lock(vec![lock.clone()]));
    let red = client
        .red_lock_on(std::slice::from_ref(&node), "x")
        .unwrap();
    invalid(red.with_node_timeout(Duration::ZERO));
    invalid(red.lock_with_lease(Duration::ZERO).await);
    // Leases Redis could not set (PEXPIRE would overflow).
    let huge = multilock::MAX_LEASE + Duration::from_millis(1);
    assert!(invalid(lock.lock_with_lease(Duration::MAX).await).contains("lease"));
    invalid(lock.try_lock_for(Duration::ZERO, Some(huge)).await);
    invalid(red.lock_with_lease(huge).await);
    invalid(Client::builder().watchdog_timeout(Duration::MAX).build());
}

/// A wait of `Duration::MAX` means "no limit", not a panic.
#[tokio::test]
async fn an_unbounded_wait_is_accepted() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "unbounded").unwrap();
    let guard = lock.try_lock_for(Duration::MAX, None).await.unwrap();
    guard.expect("free").unlock().await.unwrap();
    let red = client
        .red_lock_on(std::slice::from_ref(&node), "unbounded")
        .unwrap();
    let guard = red.try_lock_for(Duration::MAX, None).await.unwrap();
    guard.expect("free").unlock().await.unwrap();
}

#[test]
fn bad_urls_and_secrets() {
    for url in [
        "",
        "localhost:6379",
        "http://127.0.0.1:6379",
        "redis://:pw@127.0.0.1:notaport",
    ] {
        invalid(Node::new(url));
    }
    let err = Node::new("redis://admin:hunter2@127.0.0.1:notaport").unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    let node = Node::new("redis://admin:hunter2@127.0.0.1:1").unwrap();
    assert!(!format!("{node:?} {node}").contains("hunter2"));
    let builder = Node::builder("redis://admin:hunter2@127.0.0.1:1");
    assert!(!format!("{builder:?}").contains("hunter2"));
}

#[tokio::test]
async fn unreachable_node_is_a_typed_error_without_the_password() {
    let node = Node::builder("redis://admin:hunter2@127.0.0.1:1")
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let lock = Client::new().lock(&node, "x").unwrap();
    let err = lock.try_lock().await.unwrap_err();
    assert!(err.is_node_unavailable(), "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(
        shown.contains("127.0.0.1:1") && !shown.contains("hunter2"),
        "{shown}"
    );
}

#[tokio::test]
async fn unlock_by_a_non_holder_is_typed() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "mine").unwrap();
    let guard = lock.lock_with_lease(Duration::from_secs(10)).await.unwrap();
    // Someone else takes over after a force unlock: our guard no longer holds.
    assert!(lock.force_unlock().await.unwrap());
    let thief = Client::new()
        .lock(&node, "mine")
        .unwrap()
        .lock()
        .await
        .unwrap();
    match guard.unlock().await {
        Err(Error::NotHeld { lock, nodes }) => {
            assert_eq!(lock, "mine");
            assert_eq!(nodes, vec![addr(&server)]);
        }
        other => panic!("expected NotHeld, got {other:?}"),
    }
    assert!(
        Client::new()
            .lock(&crate::common::node(&server), "mine")
            .unwrap()
            .is_locked()
            .await
            .unwrap(),
        "the thief's hold is untouched"
    );
    thief.unlock().await.unwrap();
}

#[tokio::test]
async fn a_key_of_another_type_is_a_redis_error() {
    let server = server().await;
    let node = node(&server);
    let mut conn = raw(&server.url()).await;
    redis::cmd("SET")
        .arg("plain")
        .arg("x")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    redis::cmd("PEXPIRE")
        .arg("plain")
        .arg(50_000)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let lock = Client::new().lock(&node, "plain").unwrap();
    let err = lock.try_lock().await.unwrap_err();
    assert!(matches!(err, Error::Redis { .. }), "{err:?}");
    assert!(
        std::error::Error::source(&err)
            .unwrap()
            .to_string()
            .contains("WRONGTYPE")
    );
    let err = lock.hold_count().await.unwrap_err();
    assert!(matches!(err, Error::Redis { .. }), "{err:?}");
}

// ---------------------------------------------------------------------------
// Regressions of defects an audit reproduced: each failed before its fix.

#[tokio::test]
async fn an_unbounded_replica_sync_timeout_is_rejected() {
    let server = server().await;
    let node = node(&server);
    let lock = client().lock(&node, "replicas").unwrap();
    let err = lock
        .with_replica_sync(1, Duration::MAX)
        .expect_err("an unbounded WAIT is bad input");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(!exists(&server.url(), "replicas").await);
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

/// `localhost` and `127.0.0.1` are one server: not two RedLock masters.
#[tokio::test]
async fn one_server_under_two_addresses_is_not_two_masters() {
    let servers = servers(2).await;
    let nodes = vec![
        node_at(
            &format!("redis://127.0.0.1:{}", servers[0].port()),
            PATIENCE,
        ),
        node_at(
            &format!("redis://localhost:{}", servers[0].port()),
            PATIENCE,
        ),
        node(&servers[1]),
    ];
    let red = long_lease_client().red_lock_on(&nodes, "aliased").unwrap();
    // The first round connects; from then on the aliases are known.
    let refused = eventually(
        PATIENCE,
        |outcome: &String| format!("never refused: {outcome}"),
        || async {
            match red.try_lock().await {
                Err(Error::InvalidArgument(msg)) => Ok(msg),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(refused.contains("one server"), "{refused}");
    for s in &servers {
        wait_absent(&s.url(), "aliased", PATIENCE, "nothing left held").await;
    }
}
