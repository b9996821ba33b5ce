//! Metrics (feature `metrics`): a scripted sequence of grants, contention,
//! a wait, renewals, releases, a lost hold and a suspect node, checked
//! against what a recorder received.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use crate::common::*;
use multilock::Client;
use multilock_testkit::TestServer;

/// The process's recorder (one per process, as the facade allows).
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("no other recorder in the suite");
        snapshotter
    })
}

/// What was recorded for `node` (other tests' nodes left out), by metric
/// name and labels other than `node`.
fn recorded_for(node: &str) -> HashMap<String, DebugValue> {
    recorded_for_each(&[Some(node)]).pop().unwrap()
}

/// [`recorded_for`] each of `nodes`, from one snapshot (a snapshot drains
/// what it read); `None`: what has no `node` label.
fn recorded_for_each(nodes: &[Option<&str>]) -> Vec<HashMap<String, DebugValue>> {
    let snapshot = snapshotter().snapshot().into_vec();
    nodes
        .iter()
        .map(|node| {
            snapshot
                .iter()
                .filter(|(key, ..)| {
                    key.key()
                        .labels()
                        .find(|l| l.key() == "node")
                        .map(|l| l.value())
                        == *node
                })
                .map(|(key, _, _, value)| {
                    let mut labels: Vec<String> = key
                        .key()
                        .labels()
                        .filter(|l| l.key() != "node")
                        .map(|l| format!("{}={}", l.key(), l.value()))
                        .collect();
                    labels.sort();
                    (
                        format!("{}{{{}}}", key.key().name(), labels.join(",")),
                        copied(value),
                    )
                })
                .collect()
        })
        .collect()
}

/// A copy of what a snapshot read (`DebugValue` is not `Clone`).
fn copied(value: &DebugValue) -> DebugValue {
    match value {
        DebugValue::Counter(n) => DebugValue::Counter(*n),
        DebugValue::Gauge(g) => DebugValue::Gauge(*g),
        DebugValue::Histogram(samples) => DebugValue::Histogram(samples.clone()),
    }
}

/// Held by each test here: a snapshot drains every counter and gauge of
/// the process's one recorder, so two tests taking snapshots at once would
/// take each other's counts.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn counter(recorded: &HashMap<String, DebugValue>, metric: &str) -> u64 {
    match recorded.get(metric) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        other => panic!("{metric} is {other:?}"),
    }
}

#[tokio::test]
async fn a_scripted_sequence_is_recorded() {
    let _alone = ONE_AT_A_TIME.lock().await;
    snapshotter();
    let mut server = server().await;
    let node = node(&server);
    let addr = addr(&server);
    let watchdog = Duration::from_millis(600);
    let a = client_with_watchdog(watchdog)
        .lock(&node, "metered")
        .unwrap();
    let b = client_with_watchdog(watchdog)
        .lock(&node, "metered")
        .unwrap();

    // A takes it; B finds it taken, then waits for it.
    let held = a.lock().await.unwrap();
    assert!(b.try_lock().await.unwrap().is_none());
    let waiter = tokio::spawn(async move {
        b.try_lock_for(PATIENCE, None)
            .await
            .unwrap()
            .expect("granted once A lets go")
    });
    wait_for_listeners(&server.url(), "metered", 1).await;
    held.unlock().await.unwrap();
    let b_held = waiter.await.unwrap();
    // B is renewed at least once, then releases.
    tokio::time::sleep(watchdog).await;
    b_held.unlock().await.unwrap();

    // C's hold is taken away: the renewal finds it gone.
    let c = client_with_watchdog(watchdog).lock(&node, "taken").unwrap();
    let c_held = c.lock().await.unwrap();
    assert!(
        Client::new()
            .lock(&node, "taken")
            .unwrap()
            .force_unlock()
            .await
            .unwrap()
    );
    tokio::time::timeout(PATIENCE, c_held.lost())
        .await
        .expect("lost");
    drop(c_held);

    // The node freezes: a request times out, it is suspect; then healthy.
    server.pause().await.unwrap();
    assert!(a.try_lock().await.is_err());
    server.unpause().await.unwrap();
    wait_healthy(&node).await;

    let recorded = recorded_for(&addr);
    // Attempts: A's grant, B's refusal, B's grant(s) while waiting (B's
    // wait may take more than one), C's grant, A's timed-out attempt.
    let attempts = counter(&recorded, "multilock_attempts_total{kind=lock}");
    assert!(
        (5..=8).contains(&attempts),
        "{attempts} attempts: {recorded:#?}"
    );
    assert_eq!(
        counter(&recorded, "multilock_grants_total{kind=lock}"),
        3,
        "{recorded:#?}"
    );
    assert!(counter(&recorded, "multilock_contended_attempts_total{kind=lock}") >= 1);
    // A and B released; C's hold was over, so nothing was sent for it.
    assert_eq!(
        counter(&recorded, "multilock_releases_total{kind=lock}"),
        2,
        "{recorded:#?}"
    );
    assert!(
        counter(&recorded, "multilock_renewals_total{}") >= 1,
        "{recorded:#?}"
    );
    assert_eq!(
        counter(&recorded, "multilock_lost_holds_total{}"),
        1,
        "{recorded:#?}"
    );
    assert_eq!(
        counter(
            &recorded,
            "multilock_node_health_changes_total{state=suspect}"
        ),
        1,
        "{recorded:#?}"
    );
    assert_eq!(
        counter(
            &recorded,
            "multilock_node_health_changes_total{state=healthy}"
        ),
        1,
        "{recorded:#?}"
    );
    assert_eq!(
        recorded.get("multilock_held{kind=lock}"),
        Some(&DebugValue::Gauge(0.0.into())),
        "every hold given back: {recorded:#?}"
    );
    match recorded.get("multilock_acquire_seconds{kind=lock}") {
        Some(DebugValue::Histogram(samples)) => assert_eq!(samples.len(), 3, "{samples:?}"),
        other => panic!("acquire latency: {other:?}"),
    }
    match recorded.get("multilock_wait_seconds{kind=lock}") {
        // Only B waited.
        Some(DebugValue::Histogram(samples)) => assert_eq!(samples.len(), 1, "{samples:?}"),
        other => panic!("wait time: {other:?}"),
    }
}

/// A RedLock's parts count under `kind=red_lock`, each with its node (its
/// acquisition under no node), and a lock of its own on the same node
/// still under `kind=lock`: a part's metrics are its quorum lock's, not
/// those of the lock it was made from.
#[tokio::test]
async fn a_red_lock_counts_its_parts_under_its_own_kind() {
    let _alone = ONE_AT_A_TIME.lock().await;
    snapshotter();
    let servers = servers(3).await;
    let nodes: Vec<_> = servers.iter().map(node).collect();
    let client = client();
    let alone = client.lock(&nodes[0], "metered-alone").unwrap();
    let red = client
        .red_lock(
            nodes
                .iter()
                .map(|node| client.lock(node, "metered-red").unwrap())
                .collect(),
        )
        .unwrap();
    red.lock_with_lease(PATIENCE)
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    alone
        .lock_with_lease(PATIENCE)
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();

    let addrs: Vec<String> = servers.iter().map(addr).collect();
    let mut nodes: Vec<Option<&str>> = addrs.iter().map(|a| Some(a.as_str())).collect();
    nodes.push(None);
    let mut recorded = recorded_for_each(&nodes);
    // The RedLock's acquisition has no one node. (Other tests of this
    // process may record RedLock acquisitions too: at least this one.)
    let without_node = recorded.pop().unwrap();
    match without_node.get("multilock_acquire_seconds{kind=red_lock}") {
        Some(DebugValue::Histogram(samples)) => assert!(!samples.is_empty()),
        other => panic!("the RedLock's acquire latency: {other:?}"),
    }
    for (at, recorded) in recorded.into_iter().enumerate() {
        assert!(
            !recorded.contains_key("multilock_acquire_seconds{kind=red_lock}"),
            "a RedLock's acquisition is no node's: {recorded:#?}"
        );
        let kinds = if at == 0 {
            ["red_lock", "lock"].as_slice()
        } else {
            &["red_lock"]
        };
        for kind in kinds {
            for metric in ["attempts", "grants", "releases"] {
                let name = format!("multilock_{metric}_total{{kind={kind}}}");
                assert_eq!(counter(&recorded, &name), 1, "{name}: {recorded:#?}");
            }
            assert_eq!(
                recorded.get(&format!("multilock_held{{kind={kind}}}")),
                Some(&DebugValue::Gauge(0.0.into())),
                "{recorded:#?}"
            );
        }
        if at > 0 {
            assert_eq!(counter(&recorded, "multilock_attempts_total{kind=lock}"), 0);
        }
    }
}

/// A Sentinel node counts its switches of primary: the first one it
/// learns, then the one a `SENTINEL FAILOVER` promotes (each snapshot
/// counts what came since the last).
#[cfg(feature = "sentinel")]
#[tokio::test]
async fn a_sentinel_node_counts_its_switches_of_primary() {
    use crate::sentinel::{SWITCH, sentinel_node, wait_until_lands_on};
    let _alone = ONE_AT_A_TIME.lock().await;
    snapshotter();
    let group = multilock_testkit::SentinelGroup::start().await.unwrap();
    let node = sentinel_node(&group);
    let lock = long_lease_client().lock(&node, "metrics-switch").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    let switches = |recorded: &HashMap<String, DebugValue>| {
        counter(recorded, "multilock_primary_switches_total{}")
    };
    assert_eq!(switches(&recorded_for(node.addr())), 1);
    let promoted = group.failover().await.unwrap();
    let new_primary = group.data_nodes()[promoted].url();
    wait_until_lands_on(&lock, &new_primary, SWITCH).await;
    assert_eq!(switches(&recorded_for(node.addr())), 1);
}

/// A guard held past its hold warning counts once; a guard released
/// before it does not count.
#[tokio::test]
async fn a_hold_warning_is_counted_once_per_guard() {
    let _alone = ONE_AT_A_TIME.lock().await;
    snapshotter();
    let server = server().await;
    let node = node(&server);
    recorded_for(&addr(&server));
    let client = Client::builder()
        .watchdog_timeout(WATCHDOG)
        .hold_warning(Duration::from_millis(300))
        .build()
        .unwrap();
    let lock = client.lock(&node, "metered-warning").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    let held = lock.lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    held.unlock().await.unwrap();
    let recorded = recorded_for(&addr(&server));
    assert_eq!(
        counter(&recorded, "multilock_hold_warnings_total{kind=lock}"),
        1,
        "{recorded:#?}"
    );
}
