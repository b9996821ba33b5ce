//! Fencing tokens of RedLock and MultiLock: strictly increasing through
//! restarts, above every counter a node reports, seeded only when settled.

use super::*;
/// Fencing tokens strictly increase over 1,000 acquisitions by several
/// clients while a minority of nodes is killed and restarted empty. A
/// worker whose assertion fails ends the run at once with its message, and
/// a run that stalls fails at its deadline instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase_through_restarts() {
    const ACQUISITIONS: u64 = 1000;
    /// Many times what the run takes on a loaded machine.
    const DEADLINE: Duration = Duration::from_secs(180);
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    let last = Arc::new(AtomicU64::new(0));
    let acquisitions = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let red = client()
            .red_lock_on(&nodes, "fenced")
            .unwrap()
            .with_fencing()
            .with_node_timeout(Duration::from_millis(200))
            .unwrap();
        let (last, acquisitions, stop) = (last.clone(), acquisitions.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) && acquisitions.load(Ordering::SeqCst) < ACQUISITIONS
            {
                let Ok(Some(guard)) = red
                    .try_lock_for(Duration::from_secs(2), Some(Duration::from_secs(5)))
                    .await
                else {
                    continue;
                };
                let token = guard.fencing_token().expect("fenced");
                // Inside the lock nobody else writes `last`.
                let previous = last.swap(token, Ordering::SeqCst);
                assert!(token > previous, "token {token} after {previous}");
                acquisitions.fetch_add(1, Ordering::SeqCst);
                let _ = guard.unlock().await;
            }
        }));
    }
    // Chaos: nodes 3 and 4 (a minority) are killed and restarted empty,
    // until the workers are done, one of them ended early, or the deadline.
    let started = Instant::now();
    while acquisitions.load(Ordering::SeqCst) < ACQUISITIONS
        && !workers.iter().any(|w| w.is_finished())
        && started.elapsed() < DEADLINE
    {
        for i in [3, 4] {
            tokio::time::sleep(Duration::from_millis(150)).await;
            servers[i].kill().await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
            servers[i].restart().await.unwrap();
        }
    }
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        // A worker ends within one bounded wait (2 s) and its unlock.
        match tokio::time::timeout(Duration::from_secs(10), worker).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Ok(Err(err)) => panic!("worker: {err}"),
            Err(_) => panic!("a worker did not stop within 10 s"),
        }
    }
    let done = acquisitions.load(Ordering::SeqCst);
    assert!(
        done >= ACQUISITIONS,
        "only {done} acquisitions within {DEADLINE:?}"
    );
    assert!(last.load(Ordering::SeqCst) >= ACQUISITIONS);
}

/// Node 1 of 3 has seen token 100 under another holder; our quorum is nodes
/// 0 and 2. The token handed out must exceed 100.
#[tokio::test]
async fn a_fencing_token_exceeds_every_counter_reported() {
    let servers = servers(3).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    let rival = Client::new()
        .lock(&nodes[1], "fenced")
        .unwrap()
        .lock_with_lease(Duration::from_secs(30))
        .await
        .unwrap();
    let _: () = run(
        &servers[1].url(),
        redis::cmd("SET")
            .arg(protocol::token_key("fenced"))
            .arg(100),
    )
    .await
    .unwrap();
    let red = client()
        .red_lock_on(&nodes, "fenced")
        .unwrap()
        .with_fencing();
    let guard = red
        .try_lock_for(Duration::from_secs(2), Some(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("nodes 0 and 2 are a majority");
    let token = guard.fencing_token().unwrap();
    assert!(
        token > 100,
        "token {token} is not above the 100 seen on node 1"
    );
    guard.unlock().await.unwrap();
    drop(rival);
}

/// The chaos run's sequence, made deterministic: A is granted while nodes 1
/// and 3 are down; they come back empty; node 4 dies (A's `lost()` fires)
/// and comes back empty after longer than the watchdog timeout; B is granted
/// on 1, 3 and 4. B's token must be above A's.
#[tokio::test]
async fn tokens_keep_increasing_when_restarted_nodes_form_the_next_quorum() {
    let mut servers = servers(5).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    let watchdog = Duration::from_secs(3);
    let a_red = client_with_watchdog(watchdog)
        .red_lock_on(&nodes, "chaos")
        .unwrap()
        .with_fencing();
    // Past tokens: the counters are well above 1 on every node.
    for _ in 0..5 {
        a_red.lock().await.unwrap().unlock().await.unwrap();
    }
    servers[1].kill().await.unwrap();
    servers[3].kill().await.unwrap();
    let a = tokio::time::timeout(Duration::from_secs(10), a_red.lock())
        .await
        .expect("nodes 0, 2 and 4 grant")
        .unwrap();
    let a_token = a.fencing_token().unwrap();
    tokio::time::sleep(watchdog + Duration::from_millis(600)).await;
    servers[1].restart().await.unwrap();
    servers[3].restart().await.unwrap();
    servers[4].kill().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), a.lost())
        .await
        .expect("A learns it is below quorum");
    tokio::time::sleep(watchdog + Duration::from_millis(600)).await;
    servers[4].restart().await.unwrap();
    let b_red = client_with_watchdog(watchdog)
        .red_lock_on(&nodes, "chaos")
        .unwrap()
        .with_fencing();
    let b = b_red
        .try_lock_for(Duration::from_secs(10), None)
        .await
        .unwrap()
        .expect("nodes 1, 3 and 4 are free");
    let b_token = b.fencing_token().unwrap();
    assert!(
        b_token > a_token,
        "B's token {b_token} is not above A's {a_token}"
    );
    drop(a);
    drop(b);
}

#[tokio::test]
async fn a_red_lock_ends_its_wait_on_a_permanent_error() {
    let servers = servers(3).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    for s in &servers {
        let _: () = run(&s.url(), redis::cmd("SET").arg("typed").arg("a string"))
            .await
            .unwrap();
    }
    let red = client().red_lock_on(&nodes, "typed").unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), red.lock())
        .await
        .expect("lock() ended its wait");
    assert!(outcome.is_err(), "{outcome:?}");
    // A bounded wait ends at the first round too, not at its deadline.
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        red.try_lock_for(Duration::from_secs(60), None),
    )
    .await
    .expect("try_lock_for() ended its 60 s wait at the permanent error");
    assert!(outcome.is_err(), "{outcome:?}");
}

/// A node that lost its counter (restarted empty) is seeded only with a
/// settled token, never with a lower value. Here node 0 has seen token 100
/// under a rival holder, nodes 1 and 2 lag at 5, and nodes 3 and 4 have no
/// counter: the grants' highest INCR is 6, the token handed out 101. A
/// counter seeded with 6 on node 3 or 4 would count as a surviving counter
/// at the next settlement, and if the raise to 101 never reached it (the
/// settlement returns at quorum), a quorum of nodes 1, 3 and 4 would hand
/// the next holder a token below this one. (Under load, node 0's counter
/// may come after the round's grace: too few witnesses then, and the token
/// is the wall-clock floor, far above 101; the seeding rule is the same.)
#[tokio::test]
async fn a_restarted_node_is_seeded_only_with_a_settled_token() {
    let servers = servers(5).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    let token_key = protocol::token_key("seeded");
    let rival = Client::new()
        .lock(&nodes[0], "seeded")
        .unwrap()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    for (server, counter) in [(&servers[0], 100), (&servers[1], 5), (&servers[2], 5)] {
        set_sealed_counter(&server.url(), "seeded", counter).await;
    }
    let mut monitors = Vec::new();
    for server in &servers[3..] {
        monitors.push(monitor(&server.url()).await);
    }
    let floor_before = wall_clock_micros();
    let guard = client()
        .red_lock_on(&nodes, "seeded")
        .unwrap()
        .with_fencing()
        .try_lock_for(Duration::from_secs(5), Some(LONG_LEASE))
        .await
        .unwrap()
        .expect("nodes 1 to 4 grant");
    let token = guard.fencing_token().unwrap();
    assert!(
        token == 101 || token >= floor_before,
        "{token}: 101, above the 100 node 0 reported, or the wall-clock floor"
    );
    // Every value written to the counter of nodes 3 and 4, until it holds
    // the token (a node the settlement did not wait for may get nothing).
    for (lines, server) in monitors.iter_mut().zip(&servers[3..]) {
        let seeded = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = lines.next().await {
                if line.from_script && line.command() == "set" && line.has_arg(&token_key) {
                    let value: u64 = line.args[2].parse().unwrap();
                    assert!(
                        value >= token,
                        "node {} seeded with {value}, below the token {token}: {line:?}",
                        server.url()
                    );
                    return;
                }
            }
        })
        .await;
        if seeded.is_err() {
            assert!(!exists(&server.url(), &token_key).await, "never seeded");
        }
    }
    guard.unlock().await.unwrap();
    drop(rival);
}
