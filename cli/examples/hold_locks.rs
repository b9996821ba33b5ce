//! Something for `multilock` to look at: holds a few locks of every kind on
//! the node at the given URL until Ctrl-C, as a service under load would.
//!
//! ```sh
//! cargo run -p multilock-cli --example hold_locks -- redis://127.0.0.1:6379 &
//! multilock inspect orders:42 --node redis://127.0.0.1:6379
//! ```
//!
//! - `orders:42`: a reentrant lock held twice by owner `task-17`, fenced;
//! - `tickets`: a fair lock held by `task-1`, with `task-2` and `task-3`
//!   queued behind it;
//! - `catalog`: a read-write lock read by `task-4` (twice) and `task-5`.

use std::time::Duration;

use multilock::{Client, Lock, Node, Owner};

fn owned(lock: &Lock, owner: &str) -> multilock::Result<Lock> {
    Ok(lock.with_owner(Owner::new(owner)?))
}

/// How many wait in the fair lock's queue.
async fn queued(fair: &Lock) -> multilock::Result<usize> {
    let inspection = fair.inspect().await?;
    Ok(inspection.nodes[0]
        .state
        .as_ref()
        .map_or(0, |state| state.queue.len()))
}

#[tokio::main]
async fn main() -> multilock::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let node = Node::new(&url)?;
    let client = Client::builder().build()?;

    let orders = owned(&client.lock(&node, "orders:42")?.with_fencing(), "task-17")?;
    let _outer = orders.lock().await?;
    let _inner = orders.lock().await?;

    let tickets = client.fair_lock(&node, "tickets")?;
    let _head = owned(&tickets, "task-1")?.lock().await?;
    let mut waiters = Vec::new();
    for (place, owner) in ["task-2", "task-3"].into_iter().enumerate() {
        let waiter = owned(&tickets, owner)?;
        waiters.push(tokio::spawn(async move { waiter.lock().await }));
        // Queued in this order: the next asks once this one is in line.
        while queued(&tickets).await? <= place {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let catalog = client.read_write_lock(&node, "catalog")?;
    let reader = owned(catalog.read(), "task-4")?;
    let _r1 = reader.lock().await?;
    let _r2 = reader.lock().await?;
    let _r3 = owned(catalog.read(), "task-5")?.lock().await?;

    println!("holding orders:42, tickets (2 waiting) and catalog (2 readers); Ctrl-C to release");
    tokio::signal::ctrl_c().await.ok();
    Ok(())
}
