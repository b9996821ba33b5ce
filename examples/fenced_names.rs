//! What a client keeps per fenced name: one lock and unlock per distinct
//! name, as a service that fences one name per order does.
//!
//! Three `redis-server` processes, one client, a RedLock of the three per
//! name, `lock_with_lease` and `unlock` once each, from 16 tasks at once.
//! It runs the plain RedLock first, then `with_fencing()` twice (new names
//! each time), and prints the
//! process's resident memory (RSS) as the names go by, then once the client
//! has been idle for longer than it remembers a name (10 s). Last, it drops
//! every `Node` and lock, keeps the client, and counts the connections
//! still open to the servers.
//!
//! ```text
//! cargo run --release --example fenced_names              # 100,000 names each
//! cargo run --release --example fenced_names -- 20000     # fewer
//! ```

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use multilock::{Client, Node};
use multilock_testkit::{RedisProcess, TestServer};

const TASKS: usize = 16;
const LEASE: Duration = Duration::from_secs(10);
/// How long the client remembers a fenced name nobody uses, and a margin.
const IDLE: Duration = Duration::from_secs(15);

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let names: usize = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 100_000,
    };
    let servers = RedisProcess::start_many(3).await?;
    let client = Client::new();
    println!("{names} distinct names per run, {TASKS} tasks, 3 nodes\n");
    println!(
        "| run | names done | elapsed | RSS (MB) | growth since 10% (MB) | bytes per name since 10% |"
    );
    println!("|---|---|---|---|---|---|");
    // Fenced twice: the second run reuses what the first one let go.
    for (run_label, fencing) in [
        ("plain", false),
        ("with_fencing()", true),
        ("with_fencing() again", true),
    ] {
        run(&client, &servers, names, run_label, fencing).await?;
    }
    // Sockets close as their drivers notice: poll for a while.
    let dropped = Instant::now();
    loop {
        let mut open = 0;
        for server in &servers {
            open += connected_clients(&server.url()).await? - 1;
        }
        if open == 0 || dropped.elapsed() > Duration::from_secs(10) {
            println!(
                "\nconnections open to the servers {:.1} s after every Node and lock was dropped: {open}",
                dropped.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One run of `names` names: the table's rows.
async fn run(
    client: &Client,
    servers: &[RedisProcess],
    names: usize,
    label: &str,
    fencing: bool,
) -> Result<(), Box<dyn Error>> {
    let nodes: Vec<Node> = servers
        .iter()
        .map(|s| Node::new(&s.url()))
        .collect::<Result<_, _>>()?;
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (client, nodes, next) = (client.clone(), nodes.clone(), next.clone());
            let prefix = label.to_owned();
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= names {
                        break Ok::<(), multilock::Error>(());
                    }
                    let mut red = client.red_lock_on(&nodes, format!("{prefix}:order:{i}"))?;
                    if fencing {
                        red = red.with_fencing();
                    }
                    red.lock_with_lease(LEASE).await?.unlock().await?;
                }
            })
        })
        .collect();
    let mut baseline = None;
    let mut reported = 0;
    while reported < 10 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let done = next.load(Ordering::Relaxed).min(names);
        if done * 10 >= (reported + 1) * names {
            reported += 1;
            let rss = rss_kb()?;
            let base = *baseline.get_or_insert((done, rss));
            let grown = rss as f64 - base.1 as f64;
            let per_name = if done > base.0 {
                format!("{:.0}", grown * 1024.0 / (done - base.0) as f64)
            } else {
                "–".into()
            };
            println!(
                "| {label} | {done} | {:.1} s | {:.1} | {:+.1} | {per_name} |",
                started.elapsed().as_secs_f64(),
                rss as f64 / 1024.0,
                grown / 1024.0,
            );
        }
    }
    for task in tasks {
        task.await??;
    }
    tokio::time::sleep(IDLE).await;
    let rss = rss_kb()?;
    println!(
        "| {label} | idle {} s | {:.1} s | {:.1} | {:+.1} | |",
        IDLE.as_secs(),
        started.elapsed().as_secs_f64(),
        rss as f64 / 1024.0,
        (rss as f64 - baseline.map_or(0, |b| b.1) as f64) / 1024.0,
    );
    Ok(())
}

/// The process's resident memory, in kB.
fn rss_kb() -> Result<u64, Box<dyn Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .ok_or("no VmRSS in /proc/self/status")?;
    Ok(line.trim().trim_end_matches("kB").trim().parse()?)
}

/// The `connected_clients` of the server at `url`, the asking connection
/// included.
async fn connected_clients(url: &str) -> Result<u64, Box<dyn Error>> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut conn)
        .await?;
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .ok_or("no connected_clients")?;
    Ok(line.trim().parse()?)
}
