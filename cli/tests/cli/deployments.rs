//! Every subcommand against a server, a Sentinel group and a Cluster:
//! watch sees the grant, inspect and list find the holder, unlock deletes
//! it (and watch sees the release), a second unlock finds nothing.

use multilock::{Client, Node, Owner};
use multilock_testkit::{RedisCluster, RedisProcess, SentinelGroup, TestServer};

use crate::common::{LONG_LEASE, Watch, args, node_args, run_expecting};

/// The four subcommands on lock `name`, reached through `nodes` (the
/// CLI's arguments) and `node` (the same deployment, for the holder).
async fn every_subcommand(nodes: &[String], node: &Node, name: &str) {
    let mut watch = Watch::start(&args(
        &["watch", name, "--interval", "100ms", "--changes", "2"],
        nodes,
    ));
    let start = watch.line_with(" state ").await;
    assert!(start.contains("free"), "{start}");

    let client = Client::new();
    let lock = client
        .lock(node, name)
        .unwrap()
        .with_owner(Owner::new("ops").unwrap());
    let _guard = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let field = format!("{}:ops", client.id());
    let grant = watch.line_with(" grant ").await;
    assert!(grant.contains(&field), "{grant}");

    let json = run_expecting(&args(&["inspect", name, "--json"], nodes), 0)
        .await
        .json();
    assert_eq!(json["verdict"]["state"], "held", "{json}");
    let holder = &json["nodes"][0]["holders"][0];
    assert_eq!(holder["client_id"], client.id());
    assert_eq!(holder["owner"], "ops");
    assert_eq!(json["nodes"][0]["node"], node.addr());

    let list = run_expecting(&args(&["list", "--match", name, "--json"], nodes), 0)
        .await
        .json();
    let names: Vec<&str> = list["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|lock| lock["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, [name], "{list}");

    run_expecting(&args(&["unlock", name, "--force", "--yes"], nodes), 0).await;
    assert!(!lock.is_locked().await.unwrap());
    watch.line_with(" release ").await;
    assert_eq!(watch.exit_code().await, Some(0));
    run_expecting(&args(&["unlock", name, "--force", "--yes"], nodes), 3).await;
}

#[tokio::test]
async fn standalone() {
    let server = RedisProcess::start().await.unwrap();
    let node = Node::new(&server.url()).unwrap();
    every_subcommand(&node_args(&server.url()), &node, "deploy:standalone").await;
}

#[tokio::test]
async fn sentinel() {
    let group = SentinelGroup::start().await.unwrap();
    let urls = group.sentinel_urls();
    let node = Node::sentinel(group.master_name(), urls.clone())
        .build()
        .unwrap();
    let nodes: Vec<String> = ["--sentinel".to_owned(), group.master_name().to_owned()]
        .into_iter()
        .chain(urls.iter().flat_map(|url| node_args(url)))
        .collect();
    every_subcommand(&nodes, &node, "deploy:sentinel").await;
}

#[tokio::test]
async fn cluster() {
    let cluster = RedisCluster::start().await.unwrap();
    let seeds = cluster.seed_urls();
    let node = Node::cluster(seeds.clone()).build().unwrap();
    let nodes: Vec<String> = ["--cluster".to_owned()]
        .into_iter()
        .chain(seeds.iter().flat_map(|url| node_args(url)))
        .collect();
    every_subcommand(&nodes, &node, "deploy:cluster").await;
}
