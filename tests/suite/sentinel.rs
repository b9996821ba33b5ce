//! A node that is a Sentinel group's primary (`Node::sentinel`), on a real
//! group of processes (primary, 2 replicas, 3 sentinels): locking as on a
//! plain node, following `SENTINEL FAILOVER` and a killed primary (never
//! writing the old primary once the switch is known, waiters moving along),
//! typed errors when no sentinel answers, and the builder's checks.

use std::time::{Duration, Instant};

use multilock::{Client, Error, Lock, Node, Owner, Unavailable};
use multilock_testkit::{GroupMember, SentinelGroup, TestServer};

use crate::common::*;

/// How long acquires may keep going to the old primary after the sentinels
/// agree on the new one: the node polls them every second. Far below the
/// 10-20 s the demoted primary stays writable, so a node that never
/// switches fails here instead of being rescued by the demotion.
pub(crate) const SWITCH: Duration = Duration::from_secs(6);

/// The node's connect and reply timeouts.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) async fn group() -> SentinelGroup {
    init_tracing();
    SentinelGroup::start()
        .await
        .unwrap_or_else(|err| panic!("cannot start a Sentinel group: {err}"))
}

/// A node following `group`'s primary.
pub(crate) fn sentinel_node(group: &SentinelGroup) -> Node {
    Node::sentinel(group.master_name(), group.sentinel_urls())
        .connect_timeout(NODE_TIMEOUT)
        .response_timeout(NODE_TIMEOUT)
        .build()
        .unwrap()
}

/// How the node of `group` is named: its master name and the lowest
/// sentinel address.
fn node_name(group: &SentinelGroup) -> String {
    let urls = group.sentinel_urls();
    let lowest = urls.iter().map(|u| u.trim_start_matches("redis://")).min();
    format!("sentinel/mymaster@{}", lowest.unwrap())
}

/// Takes and releases `lock` until its key shows on the data node at `url`
/// while held (a direct query): the node's requests go there now. Panics
/// after `limit`. Returns how long it took.
pub(crate) async fn wait_until_lands_on(lock: &Lock, url: &str, limit: Duration) -> Duration {
    let started = Instant::now();
    eventually(
        limit,
        |seen: &String| format!("{} never reached {url}: {seen}", lock.name()),
        || async {
            let guard = lock
                .lock_with_lease(LONG_LEASE)
                .await
                .map_err(|e| format!("acquire: {e}"))?;
            let there = exists(url, lock.name()).await;
            guard.unlock().await.map_err(|e| format!("unlock: {e}"))?;
            match there {
                true => Ok(()),
                false => Err("held elsewhere (the old primary)".to_owned()),
            }
        },
    )
    .await;
    started.elapsed()
}

/// Waits until `key` is on every data node in `nodes` (replicated).
async fn wait_replicated(group: &SentinelGroup, nodes: &[usize], key: &str) {
    for &i in nodes {
        let url = group.data_nodes()[i].url();
        eventually(
            PATIENCE,
            |_: &()| format!("{key} not replicated to {url}"),
            || async {
                if exists(&url, key).await {
                    Ok(())
                } else {
                    Err(())
                }
            },
        )
        .await;
    }
}

/// Locking on a Sentinel node works as on a plain one, on the primary: the
/// key is there, re-entry counts, and a waiter is woken by the release.
/// The holder's lease is a minute: only the unlock message can wake the
/// waiter within the bound.
#[tokio::test]
async fn lock_unlock_reentry_and_wakeup_on_the_primary() {
    let group = group().await;
    let primary = group.data_nodes()[group.primary().await.unwrap()].url();
    let node = sentinel_node(&group);
    assert_eq!(node.addr(), node_name(&group));
    // One owner for both acquires: the second re-enters the first.
    let lock = long_lease_client()
        .lock(&node, "s-basic")
        .unwrap()
        .with_owner(Owner::new("job").unwrap());

    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    assert!(
        exists(&primary, "s-basic").await,
        "the key is on the primary"
    );
    inner.unlock().await.unwrap();
    assert!(lock.is_locked().await.unwrap(), "1 of 2 holds left");
    outer.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    assert!(!exists(&primary, "s-basic").await);

    let holder = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let other = Client::new().lock(&node, "s-basic").unwrap();
    assert!(other.try_lock().await.unwrap().is_none(), "held by another");
    let waiter = tokio::spawn(async move {
        let guard = other
            .try_lock_for(Duration::from_secs(30), Some(LONG_LEASE))
            .await
            .unwrap()
            .expect("granted within the wait");
        let at = Instant::now();
        guard.unlock().await.unwrap();
        at
    });
    wait_for_listeners(&primary, "s-basic", 1).await;
    let released = Instant::now();
    holder.unlock().await.unwrap();
    let granted = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("woken by the release, not by the holder's 60 s lease")
        .unwrap();
    let handoff = granted - released;
    assert!(handoff < Duration::from_secs(3), "handoff took {handoff:?}");
}

/// `SENTINEL FAILOVER` while a lock is held: acquires reach the new primary
/// within [`SWITCH`], the hold taken before the failover is released there,
/// and once the switch is known not one more script call reaches the old
/// primary, which stays a writable primary for 10-20 s.
#[tokio::test]
async fn after_sentinel_failover_requests_go_to_the_new_primary_only() {
    let group = group().await;
    let old = group.primary().await.unwrap();
    let old_url = group.data_nodes()[old].url();
    let node = sentinel_node(&group);
    let client = Client::new();
    let held = client
        .lock(&node, "s-held")
        .unwrap()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let replicas: Vec<usize> = (0..3).filter(|&i| i != old).collect();
    wait_replicated(&group, &replicas, "s-held").await;

    let new = group.failover().await.unwrap();
    assert_ne!(new, old);
    let new_url = group.data_nodes()[new].url();
    let probe = client.lock(&node, "s-probe").unwrap();
    let took = wait_until_lands_on(&probe, &new_url, SWITCH).await;
    tracing::info!(?took, "acquires reached the new primary");

    let old_before = script_calls(&old_url).await;
    let new_before = script_calls(&new_url).await;
    held.unlock()
        .await
        .expect("the hold taken before the failover is released on the new primary");
    assert!(!exists(&new_url, "s-held").await);
    let burst = client.lock(&node, "s-burst").unwrap();
    for _ in 0..30 {
        let guard = burst.lock_with_lease(LONG_LEASE).await.unwrap();
        assert!(exists(&new_url, "s-burst").await, "held on the new primary");
        guard.unlock().await.unwrap();
    }
    let old_written = script_calls(&old_url).await - old_before;
    assert_eq!(
        old_written, 0,
        "script calls on the old primary after the switch"
    );
    let new_written = script_calls(&new_url).await - new_before;
    assert!(
        new_written >= 61,
        "{new_written} script calls on the new primary"
    );
}

/// The primary is killed (SIGKILL) while a lock is held: the next attempt
/// fails at once with a typed error (no primary takes over within the
/// sentinels' 1 s down-after), attempts never hang, and one succeeds on the
/// promoted replica within 30 s.
#[tokio::test]
async fn a_killed_primary_is_replaced_and_errors_are_typed_meanwhile() {
    let mut group = group().await;
    let node = sentinel_node(&group);
    let client = Client::new();
    let held = client
        .lock(&node, "s-killed")
        .unwrap()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let probe = client.lock(&node, "s-after-kill").unwrap();
    let old = group.kill_primary().await.unwrap();
    let killed_at = Instant::now();

    // Within the sentinels' 1 s down-after no primary can take over.
    let first = tokio::time::timeout(Duration::from_secs(10), probe.try_lock())
        .await
        .expect("no hang");
    let first = first.expect_err("no primary runs");
    assert!(first.is_node_unavailable(), "{first:?}");
    let mut errors = vec![first.to_string()];
    let guard = loop {
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "no acquire within 30 s of the kill; errors: {errors:?}"
        );
        let attempt = tokio::time::timeout(Duration::from_secs(10), probe.try_lock())
            .await
            .expect("an attempt returns (typed error or outcome), never hangs");
        match attempt {
            Ok(Some(guard)) => break guard,
            Ok(None) => panic!("s-after-kill is free, yet reported held"),
            Err(err @ Error::NodeUnavailable { .. }) => errors.push(err.to_string()),
            Err(err) => panic!("an untyped failure while the primary is down: {err:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = killed_at.elapsed();
    tracing::info!(?took, errors = errors.len(), "acquired after the kill");
    let new = group.wait_for_failover(old).await.unwrap();
    let new_url = group.data_nodes()[new].url();
    assert!(
        exists(&new_url, "s-after-kill").await,
        "held on the new primary"
    );
    guard.unlock().await.unwrap();
    drop(held);
}

/// A waits out a `SENTINEL FAILOVER` holding a lock with a minute's lease,
/// B waits for it. Once the node's requests reach the new primary, A
/// releases there: B must be woken through its subscription, which must
/// have moved to the new primary (the old one gets no unlock message, and
/// stays a primary for 10-20 s), long before A's lease would end.
#[tokio::test]
async fn a_waiter_moves_with_the_failover_and_is_woken_on_the_new_primary() {
    let group = group().await;
    let old = group.primary().await.unwrap();
    let old_url = group.data_nodes()[old].url();
    let node = sentinel_node(&group);
    let a = Client::new().lock(&node, "s-wait").unwrap();
    let b = Client::new().lock(&node, "s-wait").unwrap();
    let held = a.lock_with_lease(LONG_LEASE).await.unwrap();
    let waiter = tokio::spawn(async move {
        let guard = b
            .try_lock_for(Duration::from_secs(30), Some(LONG_LEASE))
            .await
            .unwrap();
        (Instant::now(), guard)
    });
    wait_for_listeners(&old_url, "s-wait", 1).await;

    let new = group.failover().await.unwrap();
    let new_url = group.data_nodes()[new].url();
    wait_replicated(&group, &[new], "s-wait").await;
    // The node knows the switch: A's release goes to the new primary.
    let probe = Client::new().lock(&node, "s-wait-probe").unwrap();
    wait_until_lands_on(&probe, &new_url, SWITCH).await;
    assert!(
        !waiter.is_finished(),
        "B must not get the lock while A holds"
    );

    let released = Instant::now();
    held.unlock().await.unwrap();
    let (granted, guard) = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("B woken on the new primary, not by A's 60 s lease")
        .unwrap();
    let guard = guard.expect("B acquired within its wait");
    let handoff = granted - released;
    tracing::info!(?handoff, "B woken on the new primary");
    assert!(handoff < Duration::from_secs(3), "handoff took {handoff:?}");
    assert!(
        exists(&new_url, "s-wait").await,
        "B holds on the new primary"
    );
    guard.unlock().await.unwrap();
}

/// No sentinel runs and the node never connected: no primary to go to.
/// `try_lock` reports it at once, typed and naming the node; a wait goes
/// on through it (Sentinel naming no primary yet is part of the wait):
/// `try_lock_for` ends empty at its deadline, and `lock()` waits until the
/// sentinels are back, then is granted.
#[tokio::test]
async fn with_every_sentinel_down_try_lock_reports_no_primary_and_waits_go_on() {
    let mut group = group().await;
    group.kill_sentinels().await.unwrap();
    let node = sentinel_node(&group);
    let lock = Client::new().lock(&node, "s-nobody").unwrap();
    let bound = Duration::from_secs(10);

    let started = Instant::now();
    let err = tokio::time::timeout(bound, lock.try_lock())
        .await
        .expect("no hang")
        .unwrap_err();
    let took = started.elapsed();
    match &err {
        Error::NodeUnavailable {
            node,
            reason: Unavailable::NoPrimary,
            ..
        } => assert_eq!(*node, node_name(&group)),
        other => panic!("expected NoPrimary, got {other:?}"),
    }
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let waiting = lock.clone();
    let waiter = tokio::spawn(async move { waiting.lock_with_lease(LONG_LEASE).await });
    let bounded = tokio::time::timeout(bound, lock.try_lock_for(Duration::from_secs(1), None))
        .await
        .expect("no hang");
    assert!(matches!(bounded, Ok(None)), "{bounded:?}");
    assert!(!waiter.is_finished(), "lock() ended while no sentinel ran");
    for sentinel in 0..3 {
        group
            .restart(GroupMember::Sentinel(sentinel))
            .await
            .unwrap();
    }
    let guard = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("granted once the sentinels are back")
        .unwrap()
        .unwrap();
    guard.unlock().await.unwrap();
}

/// The builder refuses what cannot work, and neither the data nodes'
/// password nor a sentinel URL's ever shows in `Debug` output or errors.
#[tokio::test]
async fn builder_errors_and_no_password_in_output() {
    let invalid = |result: multilock::Result<Node>, what: &str| match result {
        Err(Error::InvalidArgument(msg)) => msg,
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    let urls = ["redis://127.0.0.1:26379"];
    invalid(Node::sentinel("", urls).build(), "empty master name");
    invalid(
        Node::sentinel("mymaster", Vec::<String>::new()).build(),
        "no sentinel URL",
    );
    for (what, builder) in [
        (
            "password",
            Node::builder("redis://127.0.0.1:6379").password("x"),
        ),
        (
            "username",
            Node::builder("redis://127.0.0.1:6379").username("u"),
        ),
        (
            "database",
            Node::builder("redis://127.0.0.1:6379").database(1),
        ),
    ] {
        invalid(builder.build(), &format!("{what} on a URL node"));
    }
    invalid(
        Node::sentinel("mymaster", ["http://127.0.0.1:26379"]).build(),
        "a sentinel URL that is not redis://",
    );

    const DATA_SECRET: &str = "data-hunter2";
    const SENTINEL_SECRET: &str = "sentinel-hunter2";
    let leaks = |text: &str| text.contains(DATA_SECRET) || text.contains(SENTINEL_SECRET);
    // A closed port: nobody answers there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sentinel_url = format!("redis://:{SENTINEL_SECRET}@127.0.0.1:{port}");
    let builder = Node::sentinel("mymaster", [sentinel_url.clone()])
        .password(DATA_SECRET)
        .connect_timeout(NODE_TIMEOUT)
        .response_timeout(NODE_TIMEOUT);
    assert!(!leaks(&format!("{builder:?}")), "{builder:?}");
    let bad = Node::sentinel("", [sentinel_url.clone()]).password(DATA_SECRET);
    let msg = invalid(bad.build(), "empty master name, with secrets");
    assert!(!leaks(&msg), "{msg}");
    let bad = Node::sentinel("m", [format!("http://:{SENTINEL_SECRET}@h:1")]);
    let msg = invalid(bad.password(DATA_SECRET).build(), "bad URL, with secrets");
    assert!(!leaks(&msg), "{msg}");

    let node = builder.build().unwrap();
    assert!(!leaks(&format!("{node:?} {node}")), "{node:?}");
    let lock = Client::new().lock(&node, "s-secret").unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), lock.try_lock())
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(err.is_node_unavailable(), "{err:?}");
    let shown = format!("{err} {err:?} {:?}", std::error::Error::source(&err));
    assert!(!leaks(&shown), "{shown}");
    assert!(!leaks(&format!("{lock:?}")));
}
