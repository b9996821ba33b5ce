//! Redisson's lock family on one node: a fair queue served in order, and a
//! read-write lock with readers in parallel and a writer alone.
//!
//! `cargo run --example lock_family` starts its own redis-server;
//! `cargo run --example lock_family -- redis://host:port` uses yours.

use std::sync::Arc;
use std::time::{Duration, Instant};

use multilock::{Client, Node};
use multilock_testkit::{RedisProcess, TestServer};
use tokio::sync::Mutex;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut _server = None;
    let url = match std::env::args().nth(1) {
        Some(url) => url,
        None => {
            let server = RedisProcess::start().await?;
            let url = server.url();
            _server = Some(server);
            url
        }
    };
    let node = Node::new(&url)?;
    let client = Client::new();

    // A fair lock: five tasks queue behind a holder and are served in the
    // order they asked, whatever order the runtime wakes them in.
    let tickets = client.fair_lock(&node, "example:tickets")?;
    let holder = tickets.lock_with_lease(Duration::from_secs(30)).await?;
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for customer in 1..=5 {
        let tickets = client.fair_lock(&node, "example:tickets")?;
        let served = served.clone();
        waiters.push(tokio::spawn(async move {
            let guard = tickets.lock_with_lease(Duration::from_secs(30)).await?;
            served.lock().await.push(customer);
            guard.unlock().await
        }));
        // Let this customer queue before the next one arrives.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    holder.unlock().await?;
    for waiter in waiters {
        waiter.await??;
    }
    println!(
        "fair lock: served in the order they queued: {:?}",
        served.lock().await
    );

    // A read-write lock: four readers hold it at once; the writer waits for
    // the last of them, then holds it alone.
    let prices = client.read_write_lock(&node, "example:prices")?;
    let started = Instant::now();
    let mut readers = Vec::new();
    for reader in 1..=4 {
        let prices = prices.clone();
        readers.push(tokio::spawn(async move {
            let guard = prices
                .read()
                .lock_with_lease(Duration::from_secs(30))
                .await?;
            println!(
                "  reader {reader} in at {:>4} ms",
                started.elapsed().as_millis()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
            guard.unlock().await
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let writing = prices
        .write()
        .lock_with_lease(Duration::from_secs(30))
        .await?;
    println!(
        "  writer in at {:>4} ms, after every reader left",
        started.elapsed().as_millis()
    );
    writing.unlock().await?;
    for reader in readers {
        reader.await??;
    }
    println!("read-write lock: readers in parallel, the writer alone");
    Ok(())
}
