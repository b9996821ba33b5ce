//! K tasks, each on a name of its own, taking and releasing it in a loop
//! through a Redis Cluster: the benchmark's section (i) with 64 tasks,
//! without the rest of the benchmark, for a profile of the cluster path.
//!
//! `cargo run --release --example cluster_loop` starts the test kit's
//! cluster (3 primaries, 3 replicas) and runs 64 tasks for 4 rounds of 1 s
//! per contender, taking turns; `-- TASKS SECONDS [CONTENDER]` changes the
//! task count and the round's length, and runs one contender alone for
//! that long (for `perf record`). It prints each contender's lock+unlocks
//! per second and this process's CPU per lock+unlock (`/proc/self/stat`,
//! user + system), the median of its rounds. Figures: `BENCHMARKS.md`.
//!
//! The contenders:
//! - `ours`: a `Node::cluster` and a `Client`, `lock_with_lease` + `unlock`;
//! - `shards`: the crate's acquire and sharded release on a bare
//!   `MultiplexedConnection` per primary (RESP3, `TCP_NODELAY`), each name
//!   sent to its slot's primary: the way ours reaches a shard, without its
//!   client;
//! - `cluster`: the same calls on one redis-rs `ClusterConnection`, which
//!   hands every request to one task that forwards it to the shard's
//!   multiplexed connection (the benchmark's limit).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use multilock::{Client, Lock, Node};
use multilock_testkit::protocol;
use multilock_testkit::{RedisCluster, bare_lock_unlock, process_cpu_seconds};
use redis::aio::{ConnectionLike, MultiplexedConnection};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LEASE: Duration = Duration::from_secs(30);
const CONTENDERS: [&str; 3] = ["ours", "shards", "cluster"];
const ROUNDS: usize = 4;

#[tokio::main]
async fn main() -> Result {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tasks: usize = args.first().map(|s| s.parse()).transpose()?.unwrap_or(64);
    let secs: f64 = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(1.0);
    let alone = args.get(2).cloned();
    if let Some(who) = &alone
        && !CONTENDERS.contains(&who.as_str())
    {
        return Err(format!("contender {who:?}: one of {CONTENDERS:?}").into());
    }
    let cluster = RedisCluster::start().await?;
    let node = Node::cluster(cluster.seed_urls()).build()?;
    let client = Client::new();
    let nodelay = redis::io::tcp::TcpSettings::default().set_nodelay(true);
    let mut shards = Vec::new();
    for primary in &cluster.nodes()[..3] {
        let url = format!("{}?protocol=resp3", primary.url());
        let info =
            redis::IntoConnectionInfo::into_connection_info(url)?.set_tcp_settings(nodelay.clone());
        let client = redis::Client::open(info)?;
        shards.push(client.get_multiplexed_async_connection().await?);
    }
    let whole = redis::cluster::ClusterClient::builder(cluster.seed_urls())
        .use_protocol(redis::ProtocolVersion::RESP3)
        .tcp_settings(nodelay)
        .build()?
        .get_async_connection()
        .await?;
    let field = protocol::field(&uuid::Uuid::new_v4().to_string(), "bare");
    let mut sides: Vec<Vec<Side>> = vec![Vec::new(); CONTENDERS.len()];
    for i in 0..tasks {
        let name = format!("cluster-loop:{i}");
        let owner = cluster.primary_for_key(&name).await?;
        sides[0].push(Side::Ours(client.lock(&node, name.clone())?));
        sides[1].push(Side::Shards(Bare::new(
            shards[owner].clone(),
            &name,
            &field,
        )));
        sides[2].push(Side::Cluster(Bare::new(whole.clone(), &name, &field)));
    }
    // Connections made and scripts loaded everywhere.
    for side in sides.iter().flatten() {
        side.lock_unlock().await?;
    }
    let (rounds, who): (usize, Vec<usize>) = match &alone {
        Some(one) => (1, vec![CONTENDERS.iter().position(|c| c == one).unwrap()]),
        None => (ROUNDS, (0..CONTENDERS.len()).collect()),
    };
    let mut figures = vec![Vec::new(); CONTENDERS.len()];
    for _ in 0..rounds {
        for &w in &who {
            figures[w].push(run(&sides[w], Duration::from_secs_f64(secs)).await?);
        }
    }
    println!("{tasks} tasks, {rounds} round(s) of {secs} s per contender (medians):");
    for &w in &who {
        let median = |pick: fn(&(f64, f64)) -> f64| {
            let mut values: Vec<f64> = figures[w].iter().map(pick).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        println!(
            "  {:>8}: {:>7.0} lock+unlock/s, client CPU {:.2} µs per lock+unlock",
            CONTENDERS[w],
            median(|f| f.0),
            median(|f| f.1)
        );
    }
    Ok(())
}

/// Every side in a task of its own for `length`: (lock+unlocks per second,
/// this process's CPU µs per lock+unlock).
async fn run(sides: &[Side], length: Duration) -> Result<(f64, f64)> {
    let stop_at = Instant::now() + length;
    let done = Arc::new(AtomicUsize::new(0));
    let cpu_before = process_cpu_seconds().map(|(user, system)| user + system)?;
    let mut set = tokio::task::JoinSet::new();
    for side in sides {
        let (side, done) = (side.clone(), done.clone());
        set.spawn(async move {
            while Instant::now() < stop_at {
                side.lock_unlock().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Result::Ok(())
        });
    }
    while let Some(finished) = set.join_next().await {
        finished??;
    }
    let cpu = process_cpu_seconds().map(|(user, system)| user + system)? - cpu_before;
    let done = done.load(Ordering::Relaxed).max(1) as f64;
    Ok((done / length.as_secs_f64(), cpu * 1e6 / done))
}

/// One task's lock+unlock, by one contender.
#[derive(Clone)]
enum Side {
    Ours(Lock),
    Shards(Bare<MultiplexedConnection>),
    Cluster(Bare<redis::cluster_async::ClusterConnection>),
}

impl Side {
    async fn lock_unlock(&self) -> Result {
        match self {
            Side::Ours(lock) => lock.lock_with_lease(LEASE).await?.unlock().await?,
            Side::Shards(bare) => bare.lock_unlock().await?,
            Side::Cluster(bare) => bare.lock_unlock().await?,
        }
        Ok(())
    }
}

/// The crate's acquire and sharded release on a bare connection.
#[derive(Clone)]
struct Bare<C> {
    conn: C,
    name: String,
    field: String,
}

impl<C: ConnectionLike + Clone> Bare<C> {
    fn new(conn: C, name: &str, field: &str) -> Bare<C> {
        Bare {
            conn,
            name: name.to_owned(),
            field: field.to_owned(),
        }
    }

    async fn lock_unlock(&self) -> Result {
        let mut conn = self.conn.clone();
        bare_lock_unlock(&mut conn, &self.name, &self.field, LEASE).await?;
        Ok(())
    }
}
