//! The client's own CPU per lock+unlock, against a bare connection with the
//! same socket: 64 tasks, each on its own lock on one node, in a closed loop.
//!
//! `cargo run --release --example client_cpu` starts its own redis-server;
//! `cargo run --release --example client_cpu -- redis://host:port` uses
//! yours (`-- URL SECONDS ROUNDS` to change the run; `-- URL SECONDS
//! ROUNDS 0,2` runs only those contenders, by their place below: for a
//! profile of one; `-- URL SECONDS ROUNDS 3,4 2300` adds 2,300 ns of busy
//! work to each lock+unlock of the last contender: what a client path's
//! extra microseconds cost in throughput).
//!
//! Five contenders take turns, each round in a new order: this crate with
//! `TCP_NODELAY` (the default, as Redisson sets it) and with Nagle's
//! algorithm (`NodeBuilder::tcp_nodelay(false)`), and a bare redis-rs
//! `MultiplexedConnection`, cloned to the 64 tasks, sending Redisson
//! 3.24+'s acquire and latched release and the latch's `DEL` without
//! awaiting it, with each of the two sockets (redis-rs's default is
//! Nagle's); last, the bare connection under Nagle's algorithm sending
//! this crate's own scripts, so that what this crate's client path costs
//! is told apart from what its scripts save. Client CPU is this process's
//! user and system time (`/proc/self/stat`) over each run, per
//! lock+unlock: the server is another process. Figures: `BENCHMARKS.md`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use multilock::{Client, Node};
use multilock_testkit::{
    RedisProcess, TestServer, bare_lock_unlock, process_cpu_seconds, redisson,
};
use redis::aio::MultiplexedConnection;
use tokio::task::JoinSet;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const TASKS: usize = 64;
const LEASE: Duration = Duration::from_secs(30);
/// The place of the bare connection sending this crate's scripts.
const CRATE_SCRIPTS: usize = 4;
const CONTENDERS: [&str; 5] = [
    "multilock, TCP_NODELAY",
    "bare connection, TCP_NODELAY",
    "multilock, Nagle",
    "bare connection, Nagle",
    "crate scripts, bare, Nagle",
];

#[tokio::main]
async fn main() -> Result {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let _server;
    let url = match args.first() {
        Some(url) => url.clone(),
        None => {
            _server = RedisProcess::start().await?;
            _server.url()
        }
    };
    let secs: f64 = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(3.0);
    let rounds: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(3);
    let run_for = Duration::from_secs_f64(secs);
    let only: Vec<usize> = match args.get(3) {
        Some(list) => list
            .split(',')
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()?,
        None => (0..CONTENDERS.len()).collect(),
    };
    let busy_work = Duration::from_nanos(args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(0));

    let client = Client::new();
    let nodes = [
        Node::new(&url)?,
        Node::builder(url.clone()).tcp_nodelay(false).build()?,
    ];
    let bare = [
        bare_connection(&url, true).await?,
        bare_connection(&url, false).await?,
    ];
    println!(
        "{TASKS} tasks, each on its own lock; {rounds} rounds of {secs} s, in turns; \
         client CPU per lock+unlock (user + system)"
    );
    // Per contender: (lock+unlocks per second, user µs, system µs) per round.
    let mut runs: [Vec<(f64, f64, f64)>; CONTENDERS.len()] = Default::default();
    for round in 0..rounds {
        for turn in 0..CONTENDERS.len() {
            let who = (round + turn) % CONTENDERS.len();
            if !only.contains(&who) {
                continue;
            }
            let done = Arc::new(AtomicUsize::new(0));
            let stop_at = Instant::now() + run_for;
            let before = process_cpu_seconds()?;
            let started = Instant::now();
            let mut tasks = JoinSet::new();
            for i in 0..TASKS {
                let name = format!("client-cpu:{round}:{who}:{i}");
                let done = done.clone();
                if who.is_multiple_of(2) && who != CRATE_SCRIPTS {
                    let lock = client.lock(&nodes[who / 2], name)?;
                    tasks.spawn(async move {
                        while Instant::now() < stop_at {
                            lock.lock_with_lease(LEASE).await?.unlock().await?;
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Result::Ok(())
                    });
                } else {
                    // A bare connection: Redisson's protocol on either
                    // socket, or this crate's scripts under Nagle's.
                    let own_scripts = who == CRATE_SCRIPTS;
                    let mut conn = bare[if own_scripts { 1 } else { who / 2 }].clone();
                    tasks.spawn(async move {
                        let field = format!("{}:bare", uuid::Uuid::new_v4());
                        while Instant::now() < stop_at {
                            if own_scripts {
                                bare_lock_unlock(&mut conn, &name, &field, LEASE).await?;
                                spin(busy_work);
                            } else {
                                redisson_lock_unlock(&conn, &name, &field).await?;
                            }
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Result::Ok(())
                    });
                }
            }
            while let Some(joined) = tasks.join_next().await {
                joined??;
            }
            let elapsed = started.elapsed().as_secs_f64();
            let (user, system) = process_cpu_seconds()?;
            let ops = done.load(Ordering::Relaxed).max(1) as f64;
            runs[who].push((
                ops / elapsed,
                (user - before.0) * 1e6 / ops,
                (system - before.1) * 1e6 / ops,
            ));
        }
    }
    println!(
        "{:<30} {:>12} {:>12} {:>10} {:>10}",
        "contender", "lock+unlock/s", "client µs", "user µs", "system µs"
    );
    let medians: Vec<(f64, f64)> = runs
        .iter()
        .zip(CONTENDERS)
        .map(|(runs, name)| {
            if runs.is_empty() {
                return (f64::NAN, f64::NAN);
            }
            let rate = median(runs.iter().map(|r| r.0));
            let user = median(runs.iter().map(|r| r.1));
            let system = median(runs.iter().map(|r| r.2));
            let cpu = median(runs.iter().map(|r| r.1 + r.2));
            println!("{name:<30} {rate:>12.0} {cpu:>12.2} {user:>10.2} {system:>10.2}");
            (rate, cpu)
        })
        .collect();
    for (ours, bare, against) in [
        (0, 1, "TCP_NODELAY  multilock ÷ bare connection"),
        (2, 3, "Nagle        multilock ÷ bare connection"),
        (
            2,
            CRATE_SCRIPTS,
            "Nagle        multilock ÷ its scripts, bare",
        ),
    ] {
        if runs[ours].is_empty() || runs[bare].is_empty() {
            continue;
        }
        println!(
            "{against}: throughput {:.2}×, client CPU {:.2}×",
            medians[ours].0 / medians[bare].0,
            medians[ours].1 / medians[bare].1
        );
    }
    Ok(())
}

/// A bare connection to `url`, with or without `TCP_NODELAY`.
async fn bare_connection(url: &str, nodelay: bool) -> Result<MultiplexedConnection> {
    let info = redis::IntoConnectionInfo::into_connection_info(url)?
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(nodelay));
    Ok(redis::Client::open(info)?
        .get_multiplexed_async_connection()
        .await?)
}

/// Redisson 3.24+'s lock+unlock on a free lock: the acquire, the release
/// with its latch, and the latch's `DEL`, not awaited.
async fn redisson_lock_unlock(conn: &MultiplexedConnection, name: &str, field: &str) -> Result {
    let taken: Option<i64> = redisson::acquire(name, field, LEASE)
        .invoke_async(&mut conn.clone())
        .await?;
    if let Some(ttl) = taken {
        return Err(format!("{name} was taken ({ttl} ms)").into());
    }
    let request = redisson::new_request_id();
    let released: Option<i64> = redisson::release(name, field, &request, LEASE)
        .invoke_async(&mut conn.clone())
        .await?;
    if released != Some(1) {
        return Err(format!("{name} was not released: {released:?}").into());
    }
    let mut delete = redisson::delete_latch(name, &request);
    delete.set_no_response(true);
    delete.exec_async(&mut conn.clone()).await?;
    Ok(())
}

/// Busy work on this thread for `time`, as a client path's own code is.
fn spin(time: Duration) {
    if time.is_zero() {
        return;
    }
    let started = Instant::now();
    while started.elapsed() < time {
        std::hint::spin_loop();
    }
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}
