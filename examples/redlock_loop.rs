//! One task taking and releasing a RedLock over N nodes in a loop, beside
//! a bare connection per node sending Redisson 3.24+'s protocol fanned out
//! to all of them: the same work as the benchmark's section (a), without
//! the rest of the benchmark, for a profile of the multi-node path.
//!
//! `cargo run --release --example redlock_loop` starts 5 redis-servers and
//! runs both in blocks of 500 lock+unlocks, taking turns for 6 s;
//! `-- NODES SECONDS [ours|limit|turns [BLOCK]]` changes the node count and
//! the length, and runs one of them alone (`ours`, `limit`: for `perf
//! record`) or both in turns (`turns`, the default) of BLOCK lock+unlocks.
//! The loop runs in a task of its own, as the benchmark's. It prints the mean and median
//! lock+unlock of each, and this process's CPU per lock+unlock when one
//! runs alone (`/proc/self/stat`, user + system). Figures: `BENCHMARKS.md`.

use std::time::{Duration, Instant};

use futures::future::join_all;
use multilock::{Client, Node, RedLock};
use multilock_testkit::{RedisProcess, TestServer, process_cpu_seconds, redisson};
use redis::aio::MultiplexedConnection;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LEASE: Duration = Duration::from_secs(30);
/// Lock+unlocks per turn unless given: long enough that each side runs
/// warm (the benchmark's section (a) takes turns of 50).
const BLOCK: usize = 500;

#[tokio::main]
async fn main() -> Result {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let secs: f64 = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(6.0);
    let mode = match args.get(2).map_or("turns", String::as_str) {
        "ours" => "ours",
        "limit" => "limit",
        "turns" => "turns",
        other => return Err(format!("mode {other:?}: ours, limit or turns").into()),
    };
    let block: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(BLOCK);
    if block == 0 {
        return Err("the block must be at least one lock+unlock".into());
    }
    let mut servers = Vec::with_capacity(n);
    for _ in 0..n {
        servers.push(RedisProcess::start().await?);
    }
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let nodes = urls
        .iter()
        .map(|url| Node::new(url))
        .collect::<multilock::Result<Vec<Node>>>()?;
    let red = Client::new().red_lock_on(&nodes, "redlock-loop")?;
    let mut bare = Vec::with_capacity(n);
    for url in &urls {
        // RESP3 and TCP_NODELAY, as this crate's connections.
        let info =
            redis::IntoConnectionInfo::into_connection_info(format!("{url}?protocol=resp3"))?
                .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        bare.push(
            redis::Client::open(info)?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    // Connections made and scripts loaded on both sides.
    ours_once(&red).await?;
    limit_once(&bare).await?;

    let stop_at = Instant::now() + Duration::from_secs_f64(secs);
    let cpu_before = process_cpu_seconds().map(|(user, system)| user + system)?;
    // In a task of its own, as the benchmark's section (a) runs: a worker
    // thread, where the main thread's `block_on` is not one.
    let timed = tokio::spawn(async move {
        let (mut ours, mut limit) = (Vec::new(), Vec::new());
        while Instant::now() < stop_at {
            if mode != "limit" {
                for _ in 0..block {
                    let started = Instant::now();
                    ours_once(&red).await?;
                    ours.push(started.elapsed());
                }
            }
            if mode != "ours" {
                for _ in 0..block {
                    let started = Instant::now();
                    limit_once(&bare).await?;
                    limit.push(started.elapsed());
                }
            }
        }
        Result::Ok((ours, limit))
    });
    let (mut ours, mut limit) = timed.await??;
    let cpu = process_cpu_seconds().map(|(user, system)| user + system)? - cpu_before;
    println!("{n} nodes, {secs} s, {mode}:");
    for (label, samples) in [("RedLock", &mut ours), ("Redisson 3.24+ limit", &mut limit)] {
        if samples.is_empty() {
            continue;
        }
        samples.sort_unstable();
        let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
        let median = samples[samples.len() / 2];
        let cpu = if mode == "turns" {
            String::new()
        } else {
            format!(", CPU {:.1} µs", cpu * 1e6 / samples.len() as f64)
        };
        println!(
            "  {label}: {} lock+unlocks, mean {:.1} µs, median {:.1} µs{cpu}",
            samples.len(),
            mean.as_secs_f64() * 1e6,
            median.as_secs_f64() * 1e6
        );
    }
    Ok(())
}

async fn ours_once(red: &RedLock) -> Result {
    red.lock_with_lease(LEASE).await?.unlock().await?;
    Ok(())
}

/// Redisson 3.24+'s lock+unlock on every node at once: the acquires, then
/// the releases with their latch, and each latch's `DEL`, not awaited.
async fn limit_once(conns: &[MultiplexedConnection]) -> Result {
    const NAME: &str = "redlock-loop:limit";
    const FIELD: &str = "bare:1";
    let taken = join_all(conns.iter().map(|conn| async move {
        redisson::acquire(NAME, FIELD, LEASE)
            .invoke_async::<Option<i64>>(&mut conn.clone())
            .await
    }))
    .await;
    for reply in taken {
        if let Some(ttl) = reply? {
            return Err(format!("{NAME} was taken ({ttl} ms)").into());
        }
    }
    let request = redisson::new_request_id();
    let released = join_all(conns.iter().map(|conn| {
        let request = &request;
        async move {
            let released = redisson::release(NAME, FIELD, request, LEASE)
                .invoke_async::<Option<i64>>(&mut conn.clone())
                .await?;
            let mut delete = redisson::delete_latch(NAME, request);
            delete.set_no_response(true);
            delete.exec_async(&mut conn.clone()).await?;
            redis::RedisResult::Ok(released)
        }
    }))
    .await;
    for reply in released {
        if reply? != Some(1) {
            return Err(format!("{NAME} was not released").into());
        }
    }
    Ok(())
}
