//! `multilock list --match`: only lock hashes, among many keys of other
//! kinds whose names match too, on a server and on every shard of a
//! Cluster.

use std::collections::BTreeSet;

use multilock::{Client, Node, redis};
use multilock_testkit::{RedisCluster, RedisProcess, TestServer, key_slot, redisson};

use crate::common::{LONG_LEASE, args, node_args, raw, run_expecting};

/// 10,000 keys under `prefix` that are no locks: strings, lists, and
/// hashes, some with a lock-like field whose value is no count. `tag` puts
/// them in one Cluster slot.
async fn noise(url: &str, prefix: &str, count: usize) {
    let mut pipe = redis::pipe();
    for i in 0..count {
        let key = format!("{prefix}:noise:{i}");
        match i % 4 {
            0 => pipe.set(&key, "1").ignore(),
            1 => pipe.rpush(&key, "a").ignore(),
            2 => pipe
                .hset_multiple(&key, &[("name", "x"), ("count", "3")])
                .ignore(),
            _ => pipe
                .hset(
                    &key,
                    "6f0c9a5e-1b2c-4d3e-8f90-a1b2c3d4e5f6:1",
                    "not a count",
                )
                .ignore(),
        };
    }
    let () = pipe.query_async(&mut raw(url).await).await.unwrap();
}

fn listed(json: &serde_json::Value) -> Vec<(String, String, String)> {
    json["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|lock| {
            let field = |name: &str| lock[name].as_str().unwrap().to_owned();
            (field("name"), field("node"), field("kind"))
        })
        .collect()
}

#[tokio::test]
async fn only_the_locks_among_ten_thousand_other_keys() {
    let server = RedisProcess::start().await.unwrap();
    let url = server.url();
    noise(&url, "orders", 10_000).await;
    let node = Node::new(&url).unwrap();
    let client = Client::new();
    let mut guards = Vec::new();
    for i in 0..5 {
        let lock = client.lock(&node, format!("orders:lock:{i}")).unwrap();
        guards.push(lock.lock_with_lease(LONG_LEASE).await.unwrap());
    }
    let rw = client.read_write_lock(&node, "orders:rw").unwrap();
    guards.push(rw.read().lock_with_lease(LONG_LEASE).await.unwrap());
    let other = client.lock(&node, "billing:1").unwrap();
    guards.push(other.lock_with_lease(LONG_LEASE).await.unwrap());
    let java = "6f0c9a5e-1b2c-4d3e-8f90-a1b2c3d4e5f6:57";
    let _: Option<i64> = redisson::acquire("orders:java", java, LONG_LEASE)
        .invoke_async(&mut raw(&url).await)
        .await
        .unwrap();

    let json = run_expecting(
        &args(&["list", "--match", "orders:*", "--json"], &node_args(&url)),
        0,
    )
    .await
    .json();
    let addr = url.trim_start_matches("redis://").to_owned();
    let mut expected: Vec<(String, String, String)> = (0..5)
        .map(|i| (format!("orders:lock:{i}"), addr.clone(), "lock".to_owned()))
        .collect();
    expected.push(("orders:java".into(), addr.clone(), "lock".into()));
    expected.push(("orders:rw".into(), addr.clone(), "rw".into()));
    expected.sort();
    assert_eq!(listed(&json), expected);
    assert_eq!(json["errors"], serde_json::json!([]));

    // Without --match: every lock; as a table.
    let table = run_expecting(&args(&["list"], &node_args(&url)), 0).await;
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{}", table.stdout);
    assert_eq!(lines.len(), 1 + 8, "{}", table.stdout);
    assert!(table.stdout.contains("billing:1"), "{}", table.stdout);
}

#[tokio::test]
async fn every_shard_of_a_cluster() {
    let cluster = RedisCluster::start().await.unwrap();
    let seeds = cluster.seed_urls();
    // A hash tag per primary, so that noise and locks land on each shard.
    let mut tags: Vec<(String, usize)> = Vec::new();
    for i in 0.. {
        let tag = format!("t{i}");
        let primary = cluster.primary_for_slot(key_slot(&tag)).await.unwrap();
        if !tags.iter().any(|(_, seen)| *seen == primary) {
            tags.push((tag, primary));
        }
        if tags.len() == 3 {
            break;
        }
    }
    let node = Node::cluster(seeds.clone()).build().unwrap();
    let client = Client::new();
    let mut guards = Vec::new();
    let mut expected = BTreeSet::new();
    for (tag, primary) in &tags {
        let url = cluster.nodes()[*primary].url();
        noise(&url, &format!("orders:{{{tag}}}"), 10_000 / 3).await;
        for i in 0..3 {
            let name = format!("orders:{{{tag}}}:lock:{i}");
            let lock = client.lock(&node, name.clone()).unwrap();
            guards.push(lock.lock_with_lease(LONG_LEASE).await.unwrap());
            expected.insert((name, url.trim_start_matches("redis://").to_owned()));
        }
    }

    let nodes: Vec<String> = ["--cluster".to_owned()]
        .into_iter()
        .chain(seeds.iter().take(2).flat_map(|url| node_args(url)))
        .collect();
    let json = run_expecting(&args(&["list", "--match", "orders:*", "--json"], &nodes), 0)
        .await
        .json();
    let found: BTreeSet<(String, String)> = listed(&json)
        .into_iter()
        .map(|(name, node, kind)| {
            assert_eq!(kind, "lock");
            (name, node)
        })
        .collect();
    assert_eq!(found, expected);
    let shards: BTreeSet<&String> = found.iter().map(|(_, node)| node).collect();
    assert_eq!(shards.len(), 3, "locks found on every primary");
}
