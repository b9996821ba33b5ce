//! Credentials and transport: ACL `user:password` URLs, and `rediss://`
//! (TLS, feature `tls`) end to end; the password never shows.

use std::time::{Duration, Instant};

use crate::common::{LONG_LEASE, client, node_at, wait_for_listeners, wait_healthy};
use multilock::{Client, Health, Node};
use multilock_testkit::{RedisProcess, TestServer};

#[tokio::test]
async fn acl_user_and_password() {
    let server = RedisProcess::start_with_args(|_| {
        [
            "--user", "default", "off", "--user", "app", "on", ">hunter2", "~*", "&*", "+@all",
        ]
        .map(String::from)
        .to_vec()
    })
    .await
    .unwrap();
    let port = server.port();
    let url = format!("redis://app:hunter2@127.0.0.1:{port}");
    let node = Node::new(&url).unwrap();
    let client = Client::new();
    let lock = client.lock(&node, "acl").unwrap();
    let guard = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    // Waiting works too: the subscription connection authenticates as well.
    // The waiter waits longer than the bound below, and the holder's lease
    // is longer still: only the unlock message gets it the lock in time.
    let other = Client::new().lock(&node, "acl").unwrap();
    let waiter =
        tokio::spawn(async move { other.try_lock_for(Duration::from_secs(20), None).await });
    wait_for_listeners(&url, "acl", 1).await;
    guard.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("woken through pub/sub, not by the holder's 60 s lease")
        .unwrap()
        .unwrap()
        .expect("granted")
        .unlock()
        .await
        .unwrap();

    // A wrong password is a typed error that does not show it.
    let wrong = Node::builder(format!("redis://app:wrong-secret@127.0.0.1:{port}"))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let err = Client::new()
        .lock(&wrong, "acl")
        .unwrap()
        .try_lock()
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(
        !shown.contains("wrong-secret") && !shown.contains("hunter2"),
        "{shown}"
    );
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn tls_end_to_end() {
    let dir = std::env::temp_dir().join(format!("multilock-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = crate::common::self_signed_cert(&dir);
    let (cert_arg, key_arg) = (cert.display().to_string(), key.display().to_string());
    let server = RedisProcess::start_with_args(move |port| {
        vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            cert_arg.clone(),
            "--tls-key-file".into(),
            key_arg.clone(),
            "--tls-ca-cert-file".into(),
            cert_arg.clone(),
            "--tls-auth-clients".into(),
            "no".into(),
            "--requirepass".into(),
            "tls-secret".into(),
        ]
    })
    .await
    .unwrap();
    // A self-signed certificate: `#insecure` skips verification.
    let url = format!("rediss://:tls-secret@127.0.0.1:{}/#insecure", server.port());
    let node = Node::new(&url).unwrap();
    assert!(!format!("{node:?}").contains("tls-secret"));
    let lock = Client::new().lock(&node, "tls").unwrap();
    let guard = lock.lock().await.unwrap();
    assert!(lock.is_locked().await.unwrap());
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// Regressions of defects an audit reproduced: each failed before its fix.

#[tokio::test]
async fn a_red_lock_ends_its_wait_on_a_wrong_password() {
    let (_servers, nodes) = wrong_password_nodes(3).await;
    let red = client().red_lock_on(&nodes, "auth").unwrap();
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), red.lock())
        .await
        .expect("lock() ended its wait");
    let err = outcome.unwrap_err();
    assert!(!format!("{err} {err:?}").contains("wrong"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // A bounded wait ends at the first round too, not at its deadline.
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        red.try_lock_for(Duration::from_secs(60), None),
    )
    .await
    .expect("try_lock_for() ended its 60 s wait at the refused password");
    assert!(outcome.is_err(), "{outcome:?}");
}

/// A refused password is an answer: a node that went suspect (here, frozen)
/// and then refuses the probe's password is healthy again, and callers get
/// the refusal, which ends a wait, rather than `Suspect`, which does not.
/// (Before the fix the probe counted the refusal as silence: the node stayed
/// suspect for good, and a RedLock whose nodes had timed out once under load
/// waited out its whole deadline.)
#[tokio::test]
async fn a_node_refusing_the_password_is_not_kept_suspect() {
    let (mut servers, nodes) = wrong_password_nodes(1).await;
    let (server, node) = (&mut servers[0], &nodes[0]);
    let lock = client().lock(node, "auth-probe").unwrap();
    server.pause().await.unwrap();
    let frozen = lock.try_lock().await.unwrap_err();
    assert!(!frozen.is_permanent(), "{frozen}");
    assert!(
        matches!(node.health(), Health::Suspect { .. }),
        "a timed-out request makes the node suspect"
    );
    server.unpause().await.unwrap();
    wait_healthy(node).await;
    let refused = lock.try_lock().await.unwrap_err();
    assert!(refused.is_permanent(), "{refused}");
}

/// The CI failure of 2026-11-27: under load two nodes' first requests timed
/// out, the nodes went suspect, and a bounded wait then saw `Suspect` from
/// them, never enough refusals to end, and waited out its 60 s. Here two of
/// three nodes are frozen for the first round instead of slowed.
#[tokio::test]
async fn a_red_lock_whose_nodes_timed_out_once_ends_its_wait_on_a_wrong_password() {
    let (mut servers, nodes) = wrong_password_nodes(3).await;
    let red = client().red_lock_on(&nodes, "auth-suspect").unwrap();
    for server in &mut servers[..2] {
        server.pause().await.unwrap();
    }
    let frozen = red.try_lock().await.unwrap_err();
    assert!(!frozen.is_permanent(), "{frozen}");
    for server in &mut servers[..2] {
        server.unpause().await.unwrap();
    }
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        red.try_lock_for(Duration::from_secs(60), None),
    )
    .await
    .expect("try_lock_for() ended its 60 s wait at the refused password");
    let err = outcome.unwrap_err();
    assert!(err.is_permanent(), "{err}");
}

/// `n` servers that require the password `right`, and a node for each that
/// gives `wrong`, with 500 ms timeouts.
async fn wrong_password_nodes(n: usize) -> (Vec<RedisProcess>, Vec<Node>) {
    let servers =
        futures::future::try_join_all((0..n).map(|_| {
            RedisProcess::start_with_args(|_| vec!["--requirepass".into(), "right".into()])
        }))
        .await
        .unwrap();
    let nodes = servers
        .iter()
        .map(|s| {
            node_at(
                &format!("redis://:wrong@127.0.0.1:{}", s.port()),
                Duration::from_millis(500),
            )
        })
        .collect();
    (servers, nodes)
}
