//! RedLock and MultiLock on 5 real redis-server processes: quorum under node
//! loss and pauses, rollback, cancellation, `lost()`, reentrancy, fencing.

mod tokens;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::common::*;
use multilock::{Client, Error, Node, Owner};
use multilock_testkit::{RedisProcess, TestServer, protocol};

const NAME: &str = "orders:42";

fn nodes(servers: &[RedisProcess]) -> Vec<Node> {
    servers.iter().map(node).collect()
}

async fn keys_left(servers: &[RedisProcess], key: &str) -> Vec<usize> {
    let mut left = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        if s.is_running() && exists(&s.url(), key).await {
            left.push(i);
        }
    }
    left
}

/// Waits (at most [`PATIENCE`]) until no node holds `key`: requests that a
/// failed round stopped waiting for are rolled back in the background. The
/// keys are the attempt's own, leased for [`LONG_LEASE`]: none expires in
/// time on its own.
async fn assert_rolled_back(servers: &[RedisProcess], key: &str, why: &str) {
    wait_until_keys_left(servers, key, &[], why).await;
}

/// Waits (at most [`PATIENCE`]) until exactly the nodes `expected` hold `key`.
async fn wait_until_keys_left(servers: &[RedisProcess], key: &str, expected: &[usize], why: &str) {
    eventually(
        PATIENCE,
        |left| format!("{why}: keys left on nodes {left:?}, expected {expected:?}"),
        || async {
            let left = keys_left(servers, key).await;
            if left == expected { Ok(()) } else { Err(left) }
        },
    )
    .await
}

/// The hold count of `field` on each node (`None`: no such field).
async fn counts_on(servers: &[RedisProcess], key: &str, field: &str) -> Vec<Option<u64>> {
    let mut counts = Vec::new();
    for s in servers {
        let mut conn = raw(&s.url()).await;
        counts.push(
            redis::cmd("HGET")
                .arg(key)
                .arg(field)
                .query_async(&mut conn)
                .await
                .unwrap(),
        );
    }
    counts
}

/// EVALSHA calls each server received since `before`.
async fn scripts_since(
    servers: &[RedisProcess],
    before: &[std::collections::HashMap<String, u64>],
) -> Vec<u64> {
    let mut sent = Vec::new();
    for (s, before) in servers.iter().zip(before) {
        let now = command_calls(&s.url()).await;
        sent.push(delta(before, &now).get("evalsha").copied().unwrap_or(0));
    }
    sent
}

async fn all_command_calls(
    servers: &[RedisProcess],
) -> Vec<std::collections::HashMap<String, u64>> {
    let mut calls = Vec::new();
    for s in servers {
        calls.push(command_calls(&s.url()).await);
    }
    calls
}

/// Another client takes the lock on each of `nodes` (30 s lease).
async fn rival_holds(nodes: &[Node]) -> Vec<multilock::Guard> {
    let rival = Client::new();
    let mut guards = Vec::new();
    for n in nodes {
        guards.push(
            rival
                .lock(n, NAME)
                .unwrap()
                .lock_with_lease(Duration::from_secs(30))
                .await
                .unwrap(),
        );
    }
    guards
}

/// One lock+unlock on every node under another name: connections made, so
/// a node paused afterwards really receives what is sent to it.
async fn warm(nodes: &[Node]) {
    let warm = Client::new().multi_lock_on(nodes, "warm-up").unwrap();
    warm.lock().await.unwrap().unlock().await.unwrap();
}

#[tokio::test]
async fn both_work_when_all_nodes_are_up() {
    let servers = servers(5).await;
    let nodes = nodes(&servers);
    let client = client();
    // An explicit owner: the RedLock is re-entered below.
    let red = client
        .red_lock_on(&nodes, NAME)
        .unwrap()
        .with_owner(Owner::new("job").unwrap());
    let multi = client.multi_lock_on(&nodes, "multi").unwrap();
    let g = red.lock().await.unwrap();
    assert_eq!(g.nodes().len(), 5);
    assert!(red.is_locked().await.unwrap());
    let m = multi
        .try_lock_for(Duration::from_secs(1), Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    assert!(m.valid_until().is_some());
    // Reentrancy of the composite: the count rises on every node.
    let field = format!("{}:{}", client.id(), g.owner());
    assert_eq!(counts_on(&servers, NAME, &field).await, vec![Some(1); 5]);
    let g2 = red.lock().await.unwrap();
    assert_eq!(red.hold_count().await.unwrap(), 2);
    assert_eq!(counts_on(&servers, NAME, &field).await, vec![Some(2); 5]);
    g2.unlock().await.unwrap();
    assert_eq!(red.hold_count().await.unwrap(), 1);
    assert_eq!(counts_on(&servers, NAME, &field).await, vec![Some(1); 5]);
    g.unlock().await.unwrap();
    m.unlock().await.unwrap();
    assert!(keys_left(&servers, NAME).await.is_empty());
    assert!(keys_left(&servers, "multi").await.is_empty());
}

/// 3 clients x 8 tasks x 15 rounds guarding a read-sleep-write counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_across_clients_keeps_the_counter_exact() {
    let servers = servers(5).await;
    let nodes = nodes(&servers);
    let counter_url = servers[0].url();
    let mut tasks = Vec::new();
    // Three clients: three processes in real life.
    for _ in 0..3 {
        let client = client();
        let red = client.red_lock_on(&nodes, NAME).unwrap();
        let holds = Holds::of(&client, &servers);
        for _ in 0..8 {
            let lease = Some(Duration::from_secs(10));
            tasks.push(spawn_counter_task(
                red.clone(),
                counter_url.clone(),
                15,
                lease,
                holds.clone(),
            ));
        }
    }
    join_counter_tasks(tasks).await;
    assert_eq!(counter(&counter_url).await, 3 * 8 * 15);
    assert!(keys_left(&servers, NAME).await.is_empty());
}

/// The same with MultiLock: 3 clients x 4 tasks x 10 rounds, every node
/// must grant each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multilock_contention_across_clients_keeps_the_counter_exact() {
    let servers = servers(5).await;
    let nodes = nodes(&servers);
    let counter_url = servers[0].url();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        // Its keys outlive the wait for a background release.
        let client = long_lease_client();
        let multi = client.multi_lock_on(&nodes, NAME).unwrap();
        let holds = Holds::of(&client, &servers);
        for _ in 0..4 {
            tasks.push(spawn_counter_task(
                multi.clone(),
                counter_url.clone(),
                10,
                None,
                holds.clone(),
            ));
        }
    }
    join_counter_tasks(tasks).await;
    assert_eq!(counter(&counter_url).await, 3 * 4 * 10);
    assert!(keys_left(&servers, NAME).await.is_empty());
}

/// A RedLock waiter is subscribed on every node, an unlock message from
/// any one of them wakes it, and it takes the lock once the holder lets go.
///
/// A multi-node waiter also retries on its own every 50 to 250 ms, so a
/// prompt handoff alone proves no wake-up. Unlock messages published on one
/// node while the lock is still held do: each wakes the waiter into a round
/// at once, so its rounds (on that node's MONITOR clock) come far closer
/// together than the 50 ms its retry delay leaves at least.
#[tokio::test]
async fn a_redlock_waiter_listens_on_every_node() {
    let servers = servers(5).await;
    let nodes = nodes(&servers);
    let holder = client().red_lock_on(&nodes, NAME).unwrap();
    let held = holder.lock_with_lease(LONG_LEASE).await.unwrap();
    let waiter = client().red_lock_on(&nodes, NAME).unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .try_lock_for(Duration::from_secs(10), None)
            .await
            .unwrap();
        (guard.is_some(), Instant::now())
    });
    for s in &servers {
        wait_for_listeners(&s.url(), NAME, 1).await;
    }

    let url = servers[0].url();
    let (_, acquire) = script("acquire");
    let mut lines = monitor(&url).await;
    let mut publisher = raw(&url).await;
    let channel = protocol::channel(NAME);
    let publishing = async move {
        for _ in 0..200 {
            redis::cmd("PUBLISH")
                .arg(&channel)
                .arg("0")
                .query_async::<()>(&mut publisher)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let mut rounds = Vec::new();
    let mut meanwhile = (&mut lines).take_until(Box::pin(publishing));
    while let Some(line) = meanwhile.next().await {
        if !line.from_script && line.command() == "evalsha" && line.args[1] == acquire {
            rounds.push(line.at);
        }
    }
    let quick = rounds.windows(2).filter(|w| w[1] - w[0] < 0.025).count();
    assert!(
        quick >= 10,
        "unlock messages on one node must wake the waiter into a round at once: only \
         {quick} of its {} rounds there came within 25 ms of the one before",
        rounds.len()
    );

    assert!(!waiting.is_finished(), "nothing granted while held");
    let released_at = Instant::now();
    held.unlock().await.unwrap();
    let (acquired, at) = waiting.await.unwrap();
    assert!(acquired);
    assert!(
        at - released_at < Duration::from_secs(2),
        "woken by the release: {:?}",
        at - released_at
    );
}

#[tokio::test]
async fn two_nodes_down_redlock_acquires_multilock_does_not() {
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    let client = long_lease_client();
    servers[0].kill().await.unwrap();
    servers[1].kill().await.unwrap();
    let red = client.red_lock_on(&nodes, NAME).unwrap();
    let g = red
        .try_lock_for(Duration::from_secs(3), None)
        .await
        .unwrap()
        .expect("3 of 5 is a majority");
    assert_eq!(g.nodes().len(), 3);
    g.unlock().await.unwrap();

    let multi = client.multi_lock_on(&nodes, NAME).unwrap();
    let started = Instant::now();
    let err = multi
        .try_lock_for(Duration::from_secs(1), None)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "returns within its budget: {took:?}"
    );
    match err {
        Error::NoQuorum(q) => {
            assert_eq!(q.required, 5);
            // The round ends at the first failure (the quorum is out of
            // reach). The error names every node: the dead ones with their
            // error, the others with what they answered, or that they had
            // not answered yet.
            let dead = [addr(&servers[0]), addr(&servers[1])];
            assert_eq!(q.succeeded_on.len() + q.failures.len(), 5, "{q}");
            for failure in &q.failures {
                assert!(q.to_string().contains(&failure.node), "names the node: {q}");
                if let multilock::FailureCause::Failed(err) = &failure.cause {
                    assert!(dead.contains(&failure.node), "{failure:?} in {q}");
                    assert!(err.is_node_unavailable(), "{err}");
                }
            }
            assert!(
                q.failures
                    .iter()
                    .any(|f| matches!(f.cause, multilock::FailureCause::Failed(_))),
                "a dead node is named with its error: {q}"
            );
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    assert_rolled_back(&servers, NAME, "rolled back on the live nodes").await;
}

#[tokio::test]
async fn three_nodes_down_redlock_refuses_within_its_budget() {
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    for s in &mut servers[..3] {
        s.kill().await.unwrap();
    }
    let red = long_lease_client().red_lock_on(&nodes, NAME).unwrap();
    let started = Instant::now();
    let err = red
        .try_lock_for(Duration::from_secs(1), None)
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(err, Error::NoQuorum(ref q) if q.required == 3),
        "{err:?}"
    );
    assert_rolled_back(&servers, NAME, "the two live nodes were rolled back").await;
}

/// A frozen node costs a round its per-node timeout, not the wait budget;
/// once it resumes, the acquire it applied late is rolled back.
#[tokio::test]
async fn a_paused_node_does_not_block_the_majority() {
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    let red = client()
        .red_lock_on(&nodes, NAME)
        .unwrap()
        .with_node_timeout(Duration::from_millis(500))
        .unwrap();
    warm(&nodes).await;
    let before = all_command_calls(&servers).await;
    servers[4].pause().await.unwrap();
    let started = Instant::now();
    let guard = red
        .try_lock_for(Duration::from_secs(10), Some(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("a majority of the live nodes");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "within the per-node timeout, not the 10 s budget: {:?}",
        started.elapsed()
    );
    // Usually all 4 live nodes; a live node slower than 500 ms on a loaded
    // machine is rolled back like the frozen one.
    let granted = guard.nodes();
    assert!(granted.len() >= 3, "{granted:?}");
    assert!(
        !granted.iter().any(|n| n == nodes[4].addr()),
        "{granted:?} includes the frozen node"
    );
    servers[4].unpause().await.unwrap();
    guard.unlock().await.unwrap();
    // The paused node applied the acquire when it resumed; the rollback on
    // the same connection follows it.
    assert_rolled_back(&servers, NAME, "no key left, paused node included").await;
    let sent = scripts_since(&servers, &before).await;
    assert!(
        sent[4] >= 2,
        "acquire and rollback reached node 4: {sent:?}"
    );
}

/// A failed attempt (the majority held by someone else) leaves none of our
/// fields anywhere, including on a node that timed out.
#[tokio::test]
async fn a_failed_attempt_rolls_back_everywhere() {
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    warm(&nodes).await;
    // Someone else holds the lock on nodes 0..3 (a majority).
    let rival_guards = rival_holds(&nodes[..3]).await;
    servers[4].pause().await.unwrap();
    let client = long_lease_client();
    let red = client
        .red_lock_on(&nodes, NAME)
        .unwrap()
        .with_node_timeout(Duration::from_millis(200))
        .unwrap();
    assert!(
        red.try_lock_for(Duration::from_millis(600), None)
            .await
            .unwrap()
            .is_none()
    );
    servers[4].unpause().await.unwrap();
    // Node 3 was granted and rolled back; node 4 timed out and was rolled
    // back once it answered; nodes 0..3 keep only the rival's field.
    wait_until_keys_left(&servers, NAME, &[0, 1, 2], "the failed attempt rolled back").await;
    for s in &servers[..3] {
        let mut conn = raw(&s.url()).await;
        let n: u64 = redis::cmd("HLEN")
            .arg(NAME)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(n, 1, "only the rival's field");
    }
    drop(rival_guards);
}

/// A round that can only fail through its per-node timeouts: the rival
/// holds 2 nodes, 2 more are frozen, 1 grants. The grant is released, and
/// both frozen nodes, once they answer, are rolled back too.
#[tokio::test]
async fn timed_out_nodes_are_rolled_back_when_they_answer() {
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    warm(&nodes).await;
    let rival_guards = rival_holds(&nodes[..2]).await;
    let before = all_command_calls(&servers).await;
    servers[3].pause().await.unwrap();
    servers[4].pause().await.unwrap();
    let red = client()
        .red_lock_on(&nodes, NAME)
        .unwrap()
        .with_node_timeout(Duration::from_millis(200))
        .unwrap();
    let outcome = red
        .try_lock_for(Duration::from_millis(100), Some(LONG_LEASE))
        .await;
    // 1 grant, 2 taken, 2 timeouts: the round is lost; contention (not
    // node failures alone) made it so, hence no error.
    assert!(matches!(outcome, Ok(None)), "{outcome:?}");
    assert!(
        !exists(&servers[2].url(), NAME).await,
        "the one grant was released"
    );
    servers[3].unpause().await.unwrap();
    servers[4].unpause().await.unwrap();
    wait_until_keys_left(&servers, NAME, &[0, 1], "frozen nodes rolled back").await;
    let sent = scripts_since(&servers, &before).await;
    assert!(
        sent[3] >= 2 && sent[4] >= 2,
        "acquire and rollback reached both frozen nodes: {sent:?}"
    );
    drop(rival_guards);
}

/// Dropping the acquire future in the middle of the fan-out: after the
/// background rollback, no key is left.
#[tokio::test]
async fn cancelled_mid_fan_out_leaves_no_key() {
    let servers = servers(5).await;
    let nodes = nodes(&servers);
    // Leases of a minute: only the rollback clears the keys in time.
    let red = long_lease_client().red_lock_on(&nodes, NAME).unwrap();
    for cut_us in [0u64, 50, 100, 200, 300, 500, 800, 1200, 2000] {
        let attempt = red.clone();
        let task = tokio::spawn(async move {
            let g = attempt.lock().await.unwrap();
            std::future::pending::<()>().await;
            drop(g);
        });
        tokio::time::sleep(Duration::from_micros(cut_us)).await;
        task.abort();
        let _ = task.await;
        let why = format!("cut at {cut_us} us");
        assert_rolled_back(&servers, NAME, &why).await;
    }
}

/// The cut that surely lands mid-fan-out: a majority is frozen, the two
/// live nodes have granted and the round waits for a quorum it cannot get
/// yet. Dropped there, the grants are released at once and the frozen
/// nodes are rolled back when they resume (the lease is a minute: only the
/// rollback clears them in time).
#[tokio::test]
async fn cancelled_while_waiting_for_frozen_nodes_leaves_no_key() {
    let mut servers = servers(5).await;
    let nodes = nodes(&servers);
    warm(&nodes).await;
    let red = client()
        .red_lock_on(&nodes, NAME)
        .unwrap()
        .with_node_timeout(Duration::from_secs(5))
        .unwrap();
    for s in &mut servers[2..] {
        s.pause().await.unwrap();
    }
    let acquire = tokio::spawn(async move { red.lock_with_lease(LONG_LEASE).await });
    wait_until_keys_left(&servers[..2], NAME, &[0, 1], "the two live nodes grant").await;
    assert!(!acquire.is_finished(), "still waiting for a quorum");
    acquire.abort();
    assert!(acquire.await.unwrap_err().is_cancelled());
    assert_rolled_back(&servers[..2], NAME, "grants released after the cut").await;
    for s in &mut servers[2..] {
        s.unpause().await.unwrap();
    }
    assert_rolled_back(&servers, NAME, "the frozen nodes rolled back").await;
}

#[tokio::test]
async fn lost_fires_below_quorum_only() {
    init_tracing();
    let servers = servers(5).await;
    let nodes = nodes(&servers);
    let client = client(); // 1 s watchdog
    let red = client.red_lock_on(&nodes, NAME).unwrap();
    let guard = red.lock().await.unwrap();
    // A minority (2) deleted underneath: still held by 3 >= quorum.
    for s in &servers[..2] {
        let mut conn = raw(&s.url()).await;
        redis::cmd("DEL")
            .arg(NAME)
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
    }
    assert!(
        tokio::time::timeout(WATCHDOG * 2, guard.lost())
            .await
            .is_err(),
        "a minority lost is not lost"
    );
    // One more: 2 < 3.
    let mut conn = raw(&servers[2].url()).await;
    redis::cmd("DEL")
        .arg(NAME)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    tokio::time::timeout(WATCHDOG * 3, guard.lost())
        .await
        .expect("lost() once below quorum");
    // Told by renewals that found the lock gone, not by the fallback that
    // fires once the last confirmed TTLs may have run out.
    assert_eq!(
        guard.valid_until(),
        None,
        "lost() fired because renewals found the lock gone on a majority"
    );
    // Unlock releases what is left and reports what a single-node lock
    // would: not held (on a majority), naming the nodes where it was gone.
    match guard.unlock().await {
        Err(Error::NotHeld { nodes, .. }) => {
            for s in &servers[..3] {
                assert!(nodes.contains(&addr(s)), "{} named in {nodes:?}", addr(s));
            }
        }
        other => panic!("expected NotHeld, got {other:?}"),
    }
    assert!(keys_left(&servers, NAME).await.is_empty());
}

/// Issue 34, defect 5: a RedLock over 3 nodes, 3 s watchdog; 2 of the 3
/// nodes are killed. Once `lost()` has fired, `valid_until()` is no longer
/// ahead and `nodes()` lists only nodes whose hold is still proven (fewer
/// than the quorum): the three agree. Before the fix, `valid_until()` still
/// lay ~2 s ahead and `nodes()` named all three right after `lost()`.
#[tokio::test]
async fn lost_valid_until_and_nodes_agree() {
    let mut servers = servers(3).await;
    let nodes = nodes(&servers);
    let client = client_with_watchdog(Duration::from_secs(3));
    let red = client.red_lock_on(&nodes, NAME).unwrap();
    let guard = red.lock().await.unwrap();
    assert_eq!(guard.nodes().len(), 3);
    assert!(guard.valid_until().is_some());
    for s in &mut servers[..2] {
        s.kill().await.unwrap();
    }
    tokio::time::timeout(PATIENCE, guard.lost())
        .await
        .expect("lost() once 2 of 3 nodes stop answering renewals");
    let now = std::time::Instant::now();
    if let Some(until) = guard.valid_until() {
        assert!(
            until <= now,
            "lost() fired, yet valid_until() lies {:?} ahead",
            until - now
        );
    }
    let proven = guard.nodes();
    assert!(
        proven.len() < red.quorum() && !proven.contains(&addr(&servers[0])),
        "lost() fired, yet nodes() lists {proven:?}"
    );
    // And it stays so: the surviving node's renewals go on succeeding.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        guard
            .valid_until()
            .is_none_or(|until| until <= std::time::Instant::now())
    );
    assert!(guard.nodes().len() < red.quorum());
    drop(guard);
}

/// The three lock types are interchangeable behind `DistributedLock`.
#[tokio::test]
async fn the_three_lock_types_are_interchangeable() {
    async fn exercise<L: multilock::DistributedLock>(lock: L) {
        let lock = lock.with_owner(multilock::Owner::new("interchangeable").unwrap());
        let guard = lock.lock().await.unwrap();
        assert!(lock.is_locked().await.unwrap());
        assert!(lock.is_held_by_current_owner().await.unwrap());
        let again = lock.try_lock().await.unwrap().expect("re-entry");
        assert_eq!(lock.hold_count().await.unwrap(), 2);
        again.unlock().await.unwrap();
        guard.unlock().await.unwrap();
        let leased = lock.lock_with_lease(Duration::from_secs(5)).await.unwrap();
        assert!(lock.remaining_ttl().await.unwrap().unwrap() <= Duration::from_secs(5));
        drop(leased);
        let guard = lock
            .try_lock_for(Duration::from_secs(2), None)
            .await
            .unwrap()
            .expect("free");
        assert!(lock.force_unlock().await.unwrap());
        assert!(!lock.is_locked().await.unwrap());
        assert!(guard.unlock().await.is_err(), "force-unlocked underneath");
    }
    let servers = servers(3).await;
    let nodes = nodes(&servers);
    let client = client();
    exercise(client.lock(&nodes[0], "single").unwrap()).await;
    exercise(client.multi_lock_on(&nodes, "multi").unwrap()).await;
    exercise(client.red_lock_on(&nodes, "red").unwrap()).await;
    for name in ["single", "multi", "red"] {
        assert!(keys_left(&servers, name).await.is_empty(), "{name}");
    }
}

// ---------------------------------------------------------------------------
// Regressions of defects an audit reproduced: each failed before its fix.

/// The same on every node of a RedLock.
#[tokio::test]
async fn a_short_reentry_does_not_cut_a_red_lock() {
    let servers = servers(3).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    // One owner for both acquires: the second re-enters the first.
    let red = client()
        .red_lock_on(&nodes, "cut-red")
        .unwrap()
        .with_owner(Owner::new("job").unwrap());
    let outer = red.lock_with_lease(Duration::from_secs(10)).await.unwrap();
    red.lock_with_lease(Duration::from_millis(200))
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let rival = Client::new().red_lock_on(&nodes, "cut-red").unwrap();
    assert!(
        rival.try_lock().await.unwrap().is_none(),
        "a second client got a majority within the outer lease"
    );
    for s in &servers {
        assert!(pttl(&s.url(), "cut-red").await > 5_000);
    }
    outer.unlock().await.unwrap();
}

/// Defect 7: A and B hold, C is another client's, B is frozen. A released,
/// B did not confirm: no quorum confirmed the release, and B is named as
/// unconfirmed (`NoQuorum`). It is not `NotHeld`: C was never this
/// guard's, and nothing said the lock had run out on a quorum.
#[tokio::test]
async fn an_unlock_that_a_frozen_holder_leaves_unconfirmed_is_no_quorum() {
    let mut servers = servers(3).await;
    let nodes = nodes(&servers);
    let rival = Client::new()
        .lock(&nodes[2], NAME)
        .unwrap()
        .with_owner(multilock::Owner::new("rival").unwrap())
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let client = Client::new();
    let red = client
        .red_lock_on(&nodes, NAME)
        .unwrap()
        .with_owner(multilock::Owner::new("ours").unwrap());
    let guard = red
        .try_lock_for(Duration::from_secs(2), Some(LONG_LEASE))
        .await
        .unwrap()
        .expect("A and B are a quorum");
    assert_eq!(guard.nodes(), vec![addr(&servers[0]), addr(&servers[1])]);
    let frozen = addr(&servers[1]);
    servers[1].pause().await.unwrap();
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), guard.unlock()).await;
    let took = started.elapsed();
    servers[1].unpause().await.unwrap();
    match outcome.expect("unlock returns") {
        Err(Error::NoQuorum(q)) => assert!(
            q.failures.iter().any(|f| f.node == frozen
                && match &f.cause {
                    multilock::FailureCause::NoAnswer => true,
                    multilock::FailureCause::Failed(err) => !matches!(err, Error::NotHeld { .. }),
                    _ => false,
                }),
            "B ({frozen}) named as unconfirmed: {q}"
        ),
        other => panic!(
            "A released, B ({frozen}) frozen, C never held: expected NoQuorum naming B, \
             got after {took:?}: {other:?}"
        ),
    }
    rival.unlock().await.unwrap();
}
