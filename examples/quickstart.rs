//! Quick start: a reentrant lock, a RedLock over three nodes, fencing.
//!
//! `cargo run --example quickstart` starts its own redis-server processes;
//! `cargo run --example quickstart -- redis://host:port ...` uses yours.

use std::time::Duration;

use multilock::testkit::{RedisProcess, TestServer};
use multilock::{Client, Node};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut urls: Vec<String> = std::env::args().skip(1).collect();
    let mut _servers = Vec::new();
    if urls.is_empty() {
        _servers = RedisProcess::start_many(3).await?;
        urls = _servers.iter().map(|s| s.url()).collect();
        println!("started redis-server on {}", urls.join(", "));
    }
    let nodes = urls
        .iter()
        .map(|u| Node::new(u))
        .collect::<Result<Vec<_>, _>>()?;
    let client = Client::new();

    // A single-node reentrant lock, renewed by the watchdog while held.
    let lock = client.lock(&nodes[0], "orders:42")?;
    let outer = lock.lock().await?;
    let inner = lock.lock().await?; // same task: re-entered
    println!("held {} times on {}", lock.hold_count().await?, lock.node());
    inner.unlock().await?;
    outer.unlock().await?;

    // Another task cannot enter while we hold it.
    let guard = lock.lock_with_lease(Duration::from_secs(10)).await?;
    let other = lock.clone();
    let got = tokio::spawn(async move { other.try_lock().await }).await??;
    println!("another task got it while held: {}", got.is_some());
    guard.unlock().await?;

    // A RedLock over every node: a majority must grant.
    if nodes.len() >= 3 {
        let red = client.red_lock_on(&nodes, "orders:42")?.with_fencing();
        let guard = red.lock().await?;
        println!(
            "RedLock held on {} of {} nodes, fencing token {:?}",
            guard.nodes().len(),
            nodes.len(),
            guard.fencing_token()
        );
        guard.unlock().await?;
    }
    println!("done");
    Ok(())
}
