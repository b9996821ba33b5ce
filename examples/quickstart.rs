//! Quick start: a reentrant lock, a RedLock over three nodes, fencing.
//!
//! `cargo run --example quickstart` starts its own redis-server processes;
//! `cargo run --example quickstart -- redis://host:port ...` uses yours.

use std::time::Duration;

use multilock::{Client, Node};
use multilock_testkit::{RedisProcess, TestServer};

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
    // Re-entry is asked for: the code run under the lock re-enters it.
    let lock = client.lock(&nodes[0], "orders:42")?;
    let count = lock
        .run_locked(|_| async {
            let inner = lock.lock().await?; // inside the hold's scope: re-entered
            let count = lock.hold_count().await?;
            inner.unlock().await?;
            Ok::<_, multilock::Error>(count)
        })
        .await??;
    println!("held {count} times on {}", lock.node());

    // Anyone else waits while we hold it: another task, and another future
    // of this very task.
    let guard = lock.lock_with_lease(Duration::from_secs(10)).await?;
    let other = lock.clone();
    let got = tokio::spawn(async move { other.try_lock().await }).await??;
    println!("another task got it while held: {}", got.is_some());
    println!(
        "another future of this task got it while held: {}",
        lock.try_lock().await?.is_some()
    );
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
