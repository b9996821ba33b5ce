//! Hold warnings (`ClientBuilder::hold_warning`, `with_hold_warning`): a
//! guard still held when its warning is due logs one warning naming the
//! lock, its owner and its nodes; a guard released, dropped or lost before
//! then logs none. A RedLock's guard warns once for its whole hold.
//!
//! Each test runs on a current-thread runtime of its own, under a
//! subscriber installed on that thread: the warning's task runs there too,
//! and no other test's events reach the capture.

use std::time::{Duration, Instant};

use crate::common::*;
use multilock::{Client, Error, Guard};
use multilock_testkit::TestServer;

/// The warning's message, as the log line shows it.
const WARNING: &str = "held longer than its hold warning";

/// Runs `test` on a current-thread runtime while this thread's warnings
/// are captured.
fn with_warnings_captured<F: Future<Output = ()>>(test: impl FnOnce(Captured) -> F) {
    let (captured, _default) = Captured::install("multilock=warn");
    current_thread_runtime().block_on(test(captured));
}

/// Polls until `deadline` (the captured lines checked every 50 ms) and
/// fails at the first warning seen: none may come before it.
async fn no_warning_until(captured: &Captured, deadline: Instant, why: &str) {
    loop {
        let warnings = captured.lines(WARNING);
        assert!(warnings.is_empty(), "{why}: {warnings:?}");
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The one warning `guard` logged, checked to name its lock, its owner and
/// each of `nodes`.
fn the_warning_of(captured: &Captured, guard: &Guard, nodes: &[String]) -> String {
    let warnings = captured.lines(WARNING);
    assert_eq!(warnings.len(), 1, "exactly one warning: {warnings:?}");
    let warning = warnings[0].clone();
    assert!(
        warning.contains(&format!("lock={}", guard.name())),
        "{warning}"
    );
    assert!(
        warning.contains(&format!("owner={}", guard.owner())),
        "{warning}"
    );
    for node in nodes {
        assert!(warning.contains(node.as_str()), "{node} missing: {warning}");
    }
    warning
}

#[test]
fn a_long_hold_warns_once() {
    with_warnings_captured(|captured| async move {
        let server = server().await;
        let lock = client()
            .lock(&node(&server), "hold_warning:long")
            .unwrap()
            .with_hold_warning(Duration::from_millis(300))
            .unwrap();
        let guard = lock.lock().await.unwrap();
        // Five times the warning, across several renewals.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let warning = the_warning_of(&captured, &guard, &[addr(&server)]);
        assert!(warning.contains("WARN"), "{warning}");
        guard.unlock().await.unwrap();
    });
}

/// A re-entry's guard is a guard of its own: each of the two warns once.
#[test]
fn each_guard_of_a_reentered_hold_warns_once() {
    with_warnings_captured(|captured| async move {
        let server = server().await;
        let client = Client::builder()
            .watchdog_timeout(WATCHDOG)
            .hold_warning(Duration::from_millis(300))
            .build()
            .unwrap();
        let lock = client
            .lock(&node(&server), "hold_warning:reentered")
            .unwrap();
        let lock = lock.with_owner(lock.owner());
        let outer = lock.lock().await.unwrap();
        let inner = lock.lock().await.unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(captured.count(WARNING), 2, "{}", captured.text());
        inner.unlock().await.unwrap();
        outer.unlock().await.unwrap();
    });
}

/// With a lease of a minute, the key of a hold released at once would
/// still be proven when the warning is due: only the abort on unlock (or
/// drop) keeps it quiet.
#[test]
fn a_short_hold_never_warns() {
    with_warnings_captured(|captured| async move {
        let server = server().await;
        let warning = Duration::from_secs(2);
        let lock = long_lease_client()
            .lock(&node(&server), "hold_warning:short")
            .unwrap()
            .with_hold_warning(warning)
            .unwrap();
        let acquired = Instant::now();
        lock.lock().await.unwrap().unlock().await.unwrap();
        let past = acquired + warning + Duration::from_secs(1);
        no_warning_until(&captured, past, "a hold unlocked at once").await;
    });
}

#[test]
fn a_guard_dropped_before_its_warning_never_warns() {
    with_warnings_captured(|captured| async move {
        let server = server().await;
        let warning = Duration::from_secs(1);
        let lock = long_lease_client()
            .lock(&node(&server), "hold_warning:dropped")
            .unwrap()
            .with_hold_warning(warning)
            .unwrap();
        let acquired = Instant::now();
        drop(lock.lock().await.unwrap());
        wait_absent(
            &server.url(),
            lock.name(),
            PATIENCE,
            "the dropped guard's release",
        )
        .await;
        let past = acquired + warning + Duration::from_secs(1);
        no_warning_until(&captured, past, "a guard dropped at once").await;
    });
}

/// A hold taken away (forced open by someone else) is lost, not held too
/// long.
#[test]
fn a_lost_hold_never_warns() {
    with_warnings_captured(|captured| async move {
        let server = server().await;
        let warning = Duration::from_secs(2);
        let lock = client()
            .lock(&node(&server), "hold_warning:lost")
            .unwrap()
            .with_hold_warning(warning)
            .unwrap();
        let acquired = Instant::now();
        let guard = lock.lock().await.unwrap();
        assert!(lock.force_unlock().await.unwrap());
        tokio::time::timeout(PATIENCE, guard.lost())
            .await
            .expect("the next renewal finds the key gone");
        assert!(
            acquired.elapsed() < warning,
            "precondition: lost before the warning was due"
        );
        let past = acquired + warning + Duration::from_secs(1);
        no_warning_until(&captured, past, "a lost hold").await;
        drop(guard);
    });
}

/// A RedLock's guard warns once for its whole hold, naming every node
/// that holds it, though each of its parts has the client's warning.
#[test]
fn a_red_lock_warns_once_for_its_whole_hold() {
    with_warnings_captured(|captured| async move {
        let servers = servers(3).await;
        let nodes: Vec<_> = servers.iter().map(node).collect();
        let client = Client::builder()
            .watchdog_timeout(WATCHDOG)
            .hold_warning(Duration::from_millis(300))
            .build()
            .unwrap();
        let red = client.red_lock_on(&nodes, "hold_warning:red").unwrap();
        let guard = red.lock().await.unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let addrs: Vec<String> = servers.iter().map(addr).collect();
        the_warning_of(&captured, &guard, &addrs);
        guard.unlock().await.unwrap();

        // Its own setting overrides the parts'.
        let later = red.with_hold_warning(Duration::from_secs(2)).unwrap();
        let acquired = Instant::now();
        later.lock().await.unwrap().unlock().await.unwrap();
        let past = acquired + Duration::from_secs(3);
        tokio::time::sleep(past.saturating_duration_since(Instant::now())).await;
        assert_eq!(captured.count(WARNING), 1, "{}", captured.text());
    });
}

#[test]
fn hold_warnings_are_checked() {
    let node = multilock::Node::new("redis://127.0.0.1:1").unwrap();
    let zero = Client::builder().hold_warning(Duration::ZERO).build();
    assert!(matches!(zero, Err(Error::InvalidArgument(_))), "{zero:?}");
    let client = Client::new();
    let lock = client.lock(&node, "k").unwrap();
    let zero = lock.with_hold_warning(Duration::ZERO);
    assert!(matches!(zero, Err(Error::InvalidArgument(_))), "{zero:?}");
    let red = client.red_lock(vec![lock.clone()]).unwrap();
    let zero = red.with_hold_warning(Duration::ZERO);
    assert!(
        matches!(zero, Err(Error::InvalidArgument(_))),
        "{:?}",
        zero.err()
    );
    // A composite warns once for its hold: its parts must agree on when.
    let other = multilock::Node::new("redis://127.0.0.1:2").unwrap();
    let warned = client.lock(&other, "k").unwrap();
    let warned = warned.with_hold_warning(Duration::from_secs(1)).unwrap();
    let mixed = client.red_lock(vec![lock, warned]);
    assert!(
        matches!(mixed, Err(Error::InvalidArgument(_))),
        "{:?}",
        mixed.err()
    );
}
