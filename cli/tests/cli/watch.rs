//! `multilock watch`: each change a line with a timestamp: grants,
//! re-entries, renewals, waiters and releases.

use std::time::Duration;

use multilock::{Client, Node, Owner};
use multilock_testkit::{RedisProcess, TestServer};

use crate::common::{LONG_LEASE, Watch, args, node_args};

/// Whether `line` starts with an RFC 3339 UTC timestamp with milliseconds.
fn stamped(line: &str) -> bool {
    let stamp = line.split_whitespace().next().unwrap_or("");
    stamp.len() == 24
        && stamp.ends_with('Z')
        && stamp.as_bytes()[10] == b'T'
        && stamp.as_bytes()[4] == b'-'
        && stamp.as_bytes()[19] == b'.'
}

#[tokio::test]
async fn a_grant_and_a_release_then_it_exits() {
    let server = RedisProcess::start().await.unwrap();
    let node = Node::new(&server.url()).unwrap();
    let mut watch = Watch::start(&args(
        &[
            "watch",
            "orders:42",
            "--interval",
            "100ms",
            "--changes",
            "2",
        ],
        &node_args(&server.url()),
    ));
    let start = watch.line_with(" state ").await;
    assert!(start.contains("free"), "{start}");

    let client = Client::new();
    let lock = client
        .lock(&node, "orders:42")
        .unwrap()
        .with_owner(Owner::new("job-7").unwrap());
    let guard = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let grant = watch.line_with(" grant ").await;
    assert!(stamped(&grant), "{grant}");
    assert!(grant.contains(&format!("{}:job-7", client.id())), "{grant}");
    assert!(grant.contains("holds 1"), "{grant}");
    guard.unlock().await.unwrap();
    let release = watch.line_with(" release ").await;
    assert!(stamped(&release), "{release}");
    assert_eq!(watch.exit_code().await, Some(0));
}

#[tokio::test]
async fn re_entries_renewals_and_waiters_as_json_lines() {
    let server = RedisProcess::start().await.unwrap();
    let node = Node::new(&server.url()).unwrap();
    let mut watch = Watch::start(&args(
        &["watch", "jobs", "--interval", "100ms", "--json"],
        &node_args(&server.url()),
    ));
    watch.line_with(r#""event":"state""#).await;

    // A watchdog of 3 s renews every second: the TTL goes up.
    let client = Client::builder()
        .watchdog_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let fair = client.fair_lock(&node, "jobs").unwrap();
    let holder = fair.with_owner(Owner::new("holder").unwrap());
    let outer = holder.lock().await.unwrap();
    let grant: serde_json::Value =
        serde_json::from_str(&watch.line_with(r#""event":"grant""#).await).unwrap();
    assert_eq!(grant["field"], format!("{}:holder", client.id()).as_str());
    assert_eq!(grant["node"], server.url().trim_start_matches("redis://"));
    let inner = holder.lock().await.unwrap();
    let count = watch.line_with(r#""event":"count""#).await;
    assert!(count.contains("1 -> 2"), "{count}");
    watch.line_with(r#""event":"renewal""#).await;

    let waiter = fair.with_owner(Owner::new("waiter").unwrap());
    let waiting =
        tokio::spawn(async move { waiter.try_lock_for(Duration::from_secs(20), None).await });
    let queued = watch.line_with(r#""event":"waiter""#).await;
    assert!(queued.contains(":waiter"), "{queued}");
    inner.unlock().await.unwrap();
    outer.unlock().await.unwrap();
    let left = watch.line_with(r#""event":"left""#).await;
    assert!(
        left.contains("granted") || left.contains("gave up"),
        "{left}"
    );
    waiting
        .await
        .unwrap()
        .unwrap()
        .expect("granted")
        .unlock()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_node_going_down_and_coming_back() {
    let mut server = RedisProcess::start().await.unwrap();
    let mut watch = Watch::start(&args(
        &[
            "watch",
            "orders:1",
            "--interval",
            "100ms",
            "--timeout",
            "1s",
            "--changes",
            "2",
        ],
        &node_args(&server.url()),
    ));
    watch.line_with(" state ").await;
    server.kill().await.unwrap();
    let down = watch.line_with(" down ").await;
    assert!(down.contains("no answer"), "{down}");
    server.restart().await.unwrap();
    watch.line_with(" up ").await;
    assert_eq!(watch.exit_code().await, Some(0));
}
