//! (d) a node of a bare-majority holder restarts empty, and one scenario
//! run on both backends through a kill and a restart.

use super::*;

/// A RedLock over three fresh containers held by `client` on exactly the
/// first two (the third was paused while it acquired, and is clean again).
async fn bare_majority_holder(
    servers: &mut [RedisContainer],
    client: &Client,
    lease: Duration,
) -> multilock::Guard {
    let red = client.red_lock_on(&nodes_of(servers), "jobs").unwrap();
    // C is dead while the holder acquires, so it holds A and B only (a
    // slow C would grant late, and the guard would adopt it), then C comes
    // back empty.
    servers[2].kill().await.unwrap();
    let guard = red
        .try_lock_for(Duration::from_secs(3), Some(lease))
        .await
        .unwrap()
        .expect("two of three grant");
    servers[2].restart().await.unwrap();
    let expected: Vec<String> = servers[..2].iter().map(addr).collect();
    assert_eq!(guard.nodes(), expected);
    guard
}

/// (d) The restart limit of every Redlock: the holder has A and B, B comes
/// back empty, a second client takes B and C. Two holders.
#[tokio::test]
async fn red_lock_restart_without_persistence_makes_two_holders() {
    let mut servers = containers(3).await;
    let first = client();
    let held = bare_majority_holder(&mut servers, &first, LONG_LEASE).await;

    servers[1].restart().await.unwrap();
    let second = client();
    let also_held = second
        .red_lock_on(&nodes_of(&servers), "jobs")
        .unwrap()
        .try_lock_for(Duration::from_secs(3), Some(LONG_LEASE))
        .await
        .unwrap()
        .expect("B (empty) and C grant");
    assert_eq!(also_held.nodes().len(), 2);
    assert!(Instant::now() < held.valid_until().unwrap(), "two holders");
    also_held.unlock().await.unwrap();
    drop(held);
    for server in servers {
        server.rm().await.unwrap();
    }
}

/// (d) The remedy: a node kept down for longer than the longest lease
/// before it returns. The holder has A and B; A freezes, so the only
/// majority left to a second client is B (restarted empty) with C. B comes
/// back only after the first holder's validity, so the second client
/// acquires B and C only then.
#[tokio::test]
async fn red_lock_restart_delayed_past_the_lease_keeps_one_holder() {
    const LEASE: Duration = Duration::from_secs(3);
    let mut servers = containers(3).await;
    let first = client();
    let held = bare_majority_holder(&mut servers, &first, LEASE).await;
    let valid_until = held.valid_until().unwrap();
    let b_and_c: Vec<String> = servers[1..].iter().map(addr).collect();

    let second = client();
    let red = second.red_lock_on(&nodes_of(&servers), "jobs").unwrap();
    servers[0].pause().await.unwrap();
    servers[1].kill().await.unwrap();
    let killed_at = Instant::now();
    let mut restarted = servers.remove(1);
    let restart = tokio::spawn(async move {
        tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
        // B cannot grant anything before its restart begins.
        let begun = Instant::now();
        restarted.restart().await.unwrap();
        (restarted, begun)
    });

    let acquired_at = loop {
        match red
            .try_lock_for(Duration::from_millis(500), Some(LEASE))
            .await
        {
            Ok(Some(guard)) => {
                let at = Instant::now();
                assert_eq!(guard.nodes(), b_and_c, "the restarted B and C");
                let _ = guard.unlock().await;
                break at;
            }
            Ok(None) | Err(Error::NoQuorum(_)) => {}
            Err(err) => panic!("{err}"),
        }
        assert!(
            killed_at.elapsed() < LEASE * 4,
            "the second client never acquired"
        );
    };
    let (restarted, restart_begun) = restart.await.unwrap();
    assert!(
        acquired_at >= restart_begun.max(valid_until),
        "acquired before B's delayed return or the first holder's validity ended"
    );
    servers[0].unpause().await.unwrap();
    drop(held);
    servers.insert(1, restarted);
    for server in servers {
        server.rm().await.unwrap();
    }
}

/// One scenario written once against [`TestServer`], run on both backends:
/// a RedLock over three servers survives one killed and comes back whole
/// after the restart.
async fn red_lock_through_a_kill_and_restart<S: TestServer>() {
    let mut servers = S::start_many(3).await.expect("start servers");
    let nodes: Vec<Node> = servers
        .iter()
        .map(|s| node_at(&s.url(), NODE_TIMEOUT))
        .collect();
    let red = client().red_lock_on(&nodes, "either").unwrap();
    let lease = Some(Duration::from_secs(5));
    servers[0].kill().await.unwrap();
    assert!(!servers[0].is_running());
    let guard = red
        .try_lock_for(Duration::from_secs(3), lease)
        .await
        .unwrap()
        .expect("two of three");
    assert_eq!(guard.nodes().len(), 2);
    guard.unlock().await.unwrap();
    servers[0].restart().await.unwrap();
    assert!(servers[0].is_running());
    // The node that refused is skipped until its probe finds it back (the
    // probes back off to 2 s); then it grants again, in the round or just
    // after it (a late grant the guard adopts).
    let guard = eventually(
        Duration::from_secs(10),
        |held: &usize| format!("the restarted node never came back: {held} nodes"),
        || async {
            let guard = red
                .try_lock_for(Duration::from_secs(3), lease)
                .await
                .unwrap()
                .expect("a majority");
            tokio::time::sleep(Duration::from_millis(100)).await;
            let held = guard.nodes().len();
            if held == 3 { Ok(guard) } else { Err(held) }
        },
    )
    .await;
    guard.unlock().await.unwrap();
    for server in servers {
        server.rm().await.unwrap();
    }
}

#[tokio::test]
async fn the_same_scenario_runs_on_processes() {
    red_lock_through_a_kill_and_restart::<multilock_testkit::RedisProcess>().await;
}

#[tokio::test]
async fn the_same_scenario_runs_on_containers() {
    init_tracing();
    red_lock_through_a_kill_and_restart::<RedisContainer>().await;
}
