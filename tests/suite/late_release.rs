//! A release that could not reach its node is retried in the background
//! once the node is back; the owner's next hold there must outlive it.

use std::time::Duration;

use crate::common::*;
use multilock::Node;
use multilock::testkit::{TestServer, poll_until};

/// A release whose node was down is sent again in the background once the
/// node is back (restarted empty: the release's latch is gone with it). The
/// owner's next acquire of that lock on that node waits for it: granted
/// first, the late release would find the owner's field on the new hold and
/// release that instead. The likely cause of the rolling-restart history
/// checker's one overlap: a RedLock part lost this way lets a rival win a
/// quorum while its owner holds (fencing refused the stale holder's writes).
#[tokio::test]
async fn a_release_retried_after_a_restart_never_releases_the_next_hold() {
    let mut server = server().await;
    let node = node(&server);
    let lock = client().lock(&node, "lazarus").unwrap();
    for round in 0..3 {
        let held = lock.lock_with_lease(LONG_LEASE).await.unwrap();
        server.kill().await.unwrap();
        let err = held.unlock().await.unwrap_err();
        assert!(err.is_node_unavailable(), "{err:?}");
        server.restart().await.unwrap();
        let url = server.url();
        let again = lock_once_back(&lock, &format!("round {round}")).await;
        background_release_ran(&url, round).await;
        assert!(
            exists(&url, "lazarus").await,
            "round {round}: the earlier hold's release took the new hold"
        );
        again.unlock().await.unwrap();
    }
}

/// The same through a RedLock, whose unlock returns once a quorum released
/// and retries the dead node's part in the background: the next hold's
/// part on the restarted node is kept (else the RedLock would count a part
/// that no longer holds, and a rival could win that node and the others).
#[tokio::test]
async fn a_red_lock_part_retried_after_a_restart_never_releases_the_next_hold() {
    const NAME: &str = "lazarus:red";
    let mut servers = servers(3).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    let lock = client().red_lock_on(&nodes, NAME).unwrap();
    for round in 0..3 {
        let held = lock.lock_with_lease(LONG_LEASE).await.unwrap();
        servers[0].kill().await.unwrap();
        // A quorum releases; the dead node's part goes to the background.
        let _ = held.unlock().await;
        servers[0].restart().await.unwrap();
        let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
        let again = eventually(
            PATIENCE,
            |held_on: &Vec<String>| {
                format!("round {round}: no hold on all three nodes; last held on {held_on:?}")
            },
            || async {
                let guard = match lock.try_lock_for(Duration::ZERO, Some(LONG_LEASE)).await {
                    Ok(Some(guard)) => guard,
                    Ok(None) => panic!("round {round}: nobody else holds it"),
                    Err(err) => return Err(vec![err.to_string()]),
                };
                let mut held_on = Vec::new();
                for url in &urls {
                    if exists(url, NAME).await {
                        held_on.push(url.clone());
                    }
                }
                // The restarted node is skipped while it is suspect.
                if held_on.len() == urls.len() {
                    Ok(guard)
                } else {
                    guard.unlock().await.unwrap();
                    Err(held_on)
                }
            },
        )
        .await;
        background_release_ran(&urls[0], round).await;
        assert!(
            exists(&urls[0], NAME).await,
            "round {round}: the earlier hold's release took the new hold's part"
        );
        again.unlock().await.unwrap();
    }
}

/// Waits until the background release has run on the restarted server at
/// `url`: its script read the hold count there (the acquire's fresh-hold
/// path reads none, and the server's counts started at zero).
async fn background_release_ran(url: &str, round: usize) {
    poll_until(
        PATIENCE,
        || format!("round {round}: the background release never reached the new server"),
        || async { (command_calls(url).await.get("hget").copied().unwrap_or(0) > 0).then_some(()) },
    )
    .await
    .unwrap();
}
