//! (i) Redis Cluster: a `Node::cluster` against the limit, a bare redis-rs
//! cluster connection sending the crate's own script calls.
//!
//! One `RedisCluster` of the test kit (3 primaries, 3 replicas, all on this
//! machine). Ours: a `Node::cluster` (default settings: one multiplexed
//! connection per shard) and a `Client`, `lock_with_lease` then `unlock` of
//! names spread over the three shards. The limit: one
//! `redis::cluster_async::ClusterConnection` (RESP3, TCP_NODELAY; it routes
//! each script call by its first key's slot) sending the same acquire and
//! the same release, publishing with `spublish` as ours does on Redis 7+
//! (`multilock_testkit::bare_lock_unlock`). Beside it,
//! the same calls on a bare `MultiplexedConnection` per primary, each name
//! sent to its slot's primary as the map stood at the start: the way ours
//! reaches a shard, without its client.
//!
//! Two cases: one task doing lock+unlock one after the other, cycling over
//! [`NAMES`] names (latency); and [`MANY_KEYS_TASKS`] tasks, each on a name
//! of its own, lock+unlock in a loop (throughput; the CPU per lock+unlock
//! here and on the primaries, and the primaries' socket reads and writes).
//! Both in rounds that take turns between the contenders, so that drift in
//! the machine's state hits them all alike.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use multilock::{Client, Lock, Node};
use multilock_testkit::protocol;
use multilock_testkit::{RedisCluster, bare_lock_unlock, key_slot};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use tokio::task::JoinSet;

use crate::contenders::{DRAIN_LIMIT, join_within};
use crate::report::{Cell, Report, Table, Unit, group};
use crate::stats::{Latencies, STATS, median, nanos, quartiles};
use crate::uncontended::process_cpu;
use crate::{BenchResult, LEASE, MANY_KEYS_TASKS, Settings, bare_connection, cpu_seconds};

/// Names the one-task case cycles over: every shard gets its turn.
const NAMES: usize = 48;
/// The contenders, in the order they take turns.
const SIDES: [&str; 3] = [
    "multilock",
    "bare ClusterConnection",
    "bare connection per shard",
];
const OURS: usize = 0;
/// The limit the targets are held to.
const BARE: usize = 1;
const SHARDS: usize = 2;
/// Primaries at the start: nodes 0-2 of the kit's cluster.
const PRIMARIES: usize = 3;
/// Prefix of the servers' socket reads and writes among their commands.
const IO: &str = "io:";

/// One contender's lock+unlock of one name.
#[derive(Clone)]
enum Side {
    Ours(Lock),
    Cluster(Bare<ClusterConnection>),
    Shard(Bare<MultiplexedConnection>),
}

/// The crate's acquire and sharded release on a bare connection.
#[derive(Clone)]
struct Bare<C> {
    conn: C,
    name: String,
    field: String,
}

impl<C: ConnectionLike + Clone> Bare<C> {
    async fn lock_unlock(&self) -> BenchResult {
        let mut conn = self.conn.clone();
        bare_lock_unlock(&mut conn, &self.name, &self.field, LEASE).await?;
        Ok(())
    }
}

impl Side {
    async fn lock_unlock(&self) -> BenchResult {
        match self {
            Side::Ours(lock) => lock.lock_with_lease(LEASE).await?.unlock().await?,
            Side::Cluster(bare) => bare.lock_unlock().await?,
            Side::Shard(bare) => bare.lock_unlock().await?,
        }
        Ok(())
    }
}

/// The contenders, ready to make locks of the names in `owners`.
struct Sides {
    client: Client,
    node: Node,
    cluster: ClusterConnection,
    /// A bare connection to each primary (nodes 0-2).
    shards: Vec<MultiplexedConnection>,
    /// The primary of each name's slot at the start.
    owners: HashMap<String, usize>,
    field: String,
}

impl Sides {
    fn side(&self, who: usize, name: String) -> BenchResult<Side> {
        let field = self.field.clone();
        Ok(match who {
            OURS => Side::Ours(self.client.lock(&self.node, name)?),
            BARE => Side::Cluster(Bare {
                conn: self.cluster.clone(),
                name,
                field,
            }),
            _ => {
                let owner = self.owners.get(&name).copied();
                let owner = owner.ok_or_else(|| format!("no shard known for {name}"))?;
                Side::Shard(Bare {
                    conn: self.shards[owner].clone(),
                    name,
                    field,
                })
            }
        })
    }
}

/// The name of contender `who`'s lock `i` in case `case`.
fn name(case: &str, who: usize, i: usize) -> String {
    format!("bench:cluster:{case}:{who}:{i}")
}

pub async fn cluster(settings: &Settings, report: &mut Report) -> BenchResult {
    let cluster = RedisCluster::start().await?;
    let seeds = cluster.seed_urls();
    let node = Node::cluster(seeds.clone()).build()?;
    let bare = redis::cluster::ClusterClient::builder(seeds)
        .use_protocol(redis::ProtocolVersion::RESP3)
        .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
        .build()?;
    let mut shards = Vec::new();
    // The meter's connections to the primaries: INFO only.
    let mut primaries = Vec::new();
    for node in &cluster.nodes()[..PRIMARIES] {
        shards.push(bare_connection(&node.url()).await?);
        let client = redis::Client::open(node.url())?;
        primaries.push(client.get_multiplexed_async_connection().await?);
    }
    let names = (0..SIDES.len()).flat_map(|who| {
        let sequential = (0..NAMES).map(move |i| name("seq", who, i));
        sequential.chain((0..MANY_KEYS_TASKS).map(move |i| name("many", who, i)))
    });
    let owners = owners(names, &cluster).await?;
    let sides = Sides {
        client: Client::new(),
        node,
        cluster: bare.get_async_connection().await?,
        shards,
        owners,
        field: protocol::field(&uuid::Uuid::new_v4().to_string(), "limit"),
    };
    let mut table = Table::new(
        "(i) Redis Cluster: lock+unlock through Node::cluster",
        &format!(
            "The test kit's RedisCluster (3 primaries, 3 replicas, on this machine). \
             multilock: Node::cluster (one multiplexed connection per shard), \
             `lock_with_lease` + `unlock`. The limit: one redis-rs cluster_async \
             ClusterConnection (RESP3, TCP_NODELAY) sending the crate's acquire and its \
             release with `spublish`; beside it the same calls on a bare \
             MultiplexedConnection per primary, each name sent to its slot's primary. One \
             task: lock+unlock one after the other, cycling over {NAMES} names on all \
             shards, {} rounds taking turns ({} timed calls each after {} warm-up). \
             {MANY_KEYS_TASKS} tasks: each on a name of its own, {} rounds of {} ms taking \
             turns, medians over the rounds (each run's first tenth a warm-up). Per \
             lock+unlock: server CPU = the 3 primaries' INFO cpu; client CPU = this \
             process's threads' (schedstat); socket reads and writes = the primaries' INFO \
             stats total_reads_processed and total_writes_processed (replication's \
             included)",
            settings.rounds,
            settings.iterations,
            settings.warmup,
            settings.many_keys_rounds.0,
            settings.many_keys_rounds.1.as_millis(),
        ),
        &SIDES[1..],
    );
    let others = |figures: &[f64]| figures[1..].iter().map(|f| Some(Cell::of(*f))).collect();

    // One task, lock+unlock one after the other.
    let mut cycles = Vec::new();
    for who in 0..SIDES.len() {
        let locks = (0..NAMES).map(|i| sides.side(who, name("seq", who, i)));
        cycles.push(locks.collect::<BenchResult<Vec<Side>>>()?);
    }
    let per_shard = spread((0..NAMES).map(|i| name("seq", OURS, i)), &sides.owners);
    let latencies = time_sequential(cycles, settings).await?;
    for (stat, pick) in STATS {
        let figures: Vec<f64> = latencies.iter().map(pick).collect();
        table.row(
            format!("1 task, lock+unlock {stat}, µs"),
            Unit::Micros,
            Cell::of(figures[OURS]),
            others(&figures),
        );
    }
    let p50 = |who: usize| latencies[who].p50();
    let p99 = |who: usize| latencies[who].p99();
    report.target(
        "(i)",
        "cluster lock+unlock p50 ≤ 1.10 × a bare ClusterConnection sending the same scripts",
        format!(
            "{:.1} µs vs {:.1} µs: {:.2}× (p99 {:.1} vs {:.1} µs; bare connection per shard: \
             p50 {:.1} µs; names per primary {per_shard})",
            p50(OURS),
            p50(BARE),
            p50(OURS) / p50(BARE),
            p99(OURS),
            p99(BARE),
            p50(SHARDS),
        ),
        p50(OURS) <= 1.10 * p50(BARE),
    );

    // K tasks, each on its own name.
    let (rounds, run_for) = settings.many_keys_rounds;
    let mut runs: [Vec<Run>; SIDES.len()] = Default::default();
    // Per contender, the primaries' command and socket counts, and the
    // lock+unlocks they were for.
    let mut counts: [BTreeMap<String, u64>; SIDES.len()] = Default::default();
    let mut ops = [0; SIDES.len()];
    for round in 0..rounds {
        for turn in 0..SIDES.len() {
            let who = (round + turn) % SIDES.len();
            let make = |i: usize| sides.side(who, name("many", who, i));
            let before = (
                cpu_of(&primaries).await?,
                counts_of(&primaries).await?,
                process_cpu()?.as_secs_f64(),
            );
            let (rate, done) = many_locks(make, MANY_KEYS_TASKS, run_for).await?;
            let here = process_cpu()?.as_secs_f64() - before.2;
            let servers = cpu_of(&primaries).await? - before.0;
            for (what, n) in counts_of(&primaries).await? {
                let earlier = before.1.get(&what).copied().unwrap_or(0);
                *counts[who].entry(what).or_insert(0) += n.saturating_sub(earlier);
            }
            ops[who] += done;
            let per_op = |seconds: f64| seconds * 1e6 / done.max(1) as f64;
            runs[who].push(Run {
                rate,
                servers: per_op(servers),
                here: per_op(here),
            });
        }
    }
    let medians = |pick: fn(&Run) -> f64| -> Vec<f64> {
        let each = runs
            .iter()
            .map(|runs| runs.iter().map(pick).collect::<Vec<_>>());
        each.map(|values| median(&values)).collect()
    };
    let case = format!("{MANY_KEYS_TASKS} tasks on their own names");
    let rate = medians(|r| r.rate);
    type Figure = (&'static str, Unit, fn(&Run) -> f64);
    const FIGURES: [Figure; 3] = [
        ("lock+unlock/s", Unit::PerSecond, |r| r.rate),
        ("server CPU per lock+unlock, µs", Unit::Micros, |r| {
            r.servers
        }),
        ("client CPU per lock+unlock, µs", Unit::Micros, |r| r.here),
    ];
    for (figure, unit, pick) in FIGURES {
        let figures = medians(pick);
        let row = format!("{case}: {figure}");
        table.row(row, unit, Cell::of(figures[OURS]), others(&figures));
    }
    let per_op = |who: usize, n: u64| n as f64 / ops[who].max(1) as f64;
    for io in ["reads", "writes"] {
        let key = format!("{IO}total_{io}_processed");
        let figures: Vec<f64> = (0..SIDES.len())
            .map(|who| per_op(who, counts[who].get(&key).copied().unwrap_or(0)))
            .collect();
        let row = format!("{case}: server socket {io} per lock+unlock");
        table.row(row, Unit::Count, Cell::of(figures[OURS]), others(&figures));
    }
    report.tables.push(table);

    let ratios: Vec<f64> = runs[OURS]
        .iter()
        .zip(&runs[BARE])
        .map(|(ours, bare)| ours.rate / bare.rate)
        .collect();
    let listed = |who: usize| {
        let rates = runs[who].iter().map(|r| group(r.rate));
        rates.collect::<Vec<_>>().join(", ")
    };
    let spread = quartiles(&ratios).map_or(String::new(), |(low, high)| {
        format!(", middle half {low:.2}–{high:.2}×")
    });
    report.notes.push(format!(
        "(i) {case}, {rounds} rounds of {} ms: lock+unlock/s of multilock {}; of the bare \
         ClusterConnection {}; of the bare connection per shard {}. Paired rounds' ratios, \
         multilock ÷ bare ClusterConnection: {} (median {:.2}×{spread}; of the medians \
         {:.2}×, against the bare connection per shard {:.2}×).",
        run_for.as_millis(),
        listed(OURS),
        listed(BARE),
        listed(SHARDS),
        ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
        median(&ratios),
        rate[OURS] / rate[BARE],
        rate[OURS] / rate[SHARDS],
    ));
    let ratio = median(&ratios);
    let client = medians(|r| r.here);
    report.target(
        "(i)",
        format!("{case}: lock+unlock/s ≥ 0.9 × a bare ClusterConnection sending the same scripts"),
        format!(
            "{}/s vs {}/s (bare connection per shard {}/s; medians of {rounds} rounds); paired \
             rounds' median {ratio:.2}×{spread}; client CPU per lock+unlock {:.2} µs vs {:.2} \
             µs",
            group(rate[OURS]),
            group(rate[BARE]),
            group(rate[SHARDS]),
            client[OURS],
            client[BARE],
        ),
        ratio >= 0.9,
    );
    for (who, side) in SIDES.iter().enumerate() {
        let mut listed: Vec<(&String, &u64)> = counts[who]
            .iter()
            .filter(|(what, n)| **n > 0 && !what.starts_with(IO))
            .collect();
        listed.sort_by_key(|(_, n)| std::cmp::Reverse(**n));
        let total: u64 = listed.iter().map(|(_, n)| **n).sum();
        let listed: Vec<String> = listed
            .iter()
            .map(|(what, n)| format!("{what} {:.3}", per_op(who, **n)))
            .collect();
        report.notes.push(format!(
            "(i) {case}, {side}: commands the primaries ran per lock+unlock (INFO \
             commandstats, scripts' own commands and the meter's INFO included): {:.2}: {}.",
            per_op(who, total),
            listed.join(", ")
        ));
    }
    Ok(())
}

/// One contender's run of the many-names case, per lock+unlock where not a
/// rate.
#[derive(Clone, Copy)]
struct Run {
    rate: f64,
    /// CPU of the primaries, µs.
    servers: f64,
    /// CPU of this process, µs.
    here: f64,
}

/// The primary (node index) of each name's slot, asked once per slot.
async fn owners(
    names: impl Iterator<Item = String>,
    cluster: &RedisCluster,
) -> BenchResult<HashMap<String, usize>> {
    let mut by_slot = HashMap::new();
    let mut owners = HashMap::new();
    for name in names {
        let slot = key_slot(&name);
        let primary = match by_slot.get(&slot) {
            Some(&primary) => primary,
            None => *by_slot
                .entry(slot)
                .or_insert(cluster.primary_for_slot(slot).await?),
        };
        if primary >= PRIMARIES {
            return Err(format!("slot {slot} moved to node {primary} before the run").into());
        }
        owners.insert(name, primary);
    }
    Ok(owners)
}

/// How many of `names` each primary serves, as "a/b/c".
fn spread(names: impl Iterator<Item = String>, owners: &HashMap<String, usize>) -> String {
    let mut per_primary = [0; PRIMARIES];
    for name in names {
        per_primary[owners[&name]] += 1;
    }
    let listed: Vec<String> = per_primary.iter().map(|n| n.to_string()).collect();
    listed.join("/")
}

/// Lock+unlock one after the other: per contender, a warm-up over its
/// names, then rounds taking turns, each contender cycling over its names.
async fn time_sequential(
    sides: Vec<Vec<Side>>,
    settings: &Settings,
) -> BenchResult<Vec<Latencies>> {
    let (warmup, iterations, rounds) = (settings.warmup, settings.iterations, settings.rounds);
    // In a task of its own: the crate's default owner is the task.
    let task = tokio::spawn(async move {
        for locks in &sides {
            for i in 0..warmup.max(locks.len()) {
                locks[i % locks.len()].lock_unlock().await?;
            }
        }
        let per_round = iterations.div_ceil(rounds);
        let mut samples = vec![Vec::with_capacity(per_round * rounds); sides.len()];
        let mut next = vec![0; sides.len()];
        for round in 0..rounds {
            for turn in 0..sides.len() {
                let who = (round + turn) % sides.len();
                let locks = &sides[who];
                for _ in 0..per_round {
                    let lock = &locks[next[who] % locks.len()];
                    next[who] += 1;
                    let started = Instant::now();
                    lock.lock_unlock().await?;
                    samples[who].push(nanos(started.elapsed()));
                }
            }
        }
        BenchResult::Ok(samples.into_iter().map(Latencies::new).collect())
    });
    task.await?
}

/// K tasks, each on its own lock, lock+unlock in a loop: lock+unlocks per
/// second after a warm-up tenth, and how many over the whole run.
async fn many_locks(
    make: impl Fn(usize) -> BenchResult<Side>,
    tasks: usize,
    run_for: Duration,
) -> BenchResult<(f64, usize)> {
    let start = Instant::now();
    let counted_from = start + run_for / 10;
    let stop_at = start + run_for;
    let (done, all) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut set = JoinSet::new();
    for i in 0..tasks {
        let side = make(i)?;
        let (done, all) = (done.clone(), all.clone());
        set.spawn(async move {
            while Instant::now() < stop_at {
                side.lock_unlock().await?;
                all.fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                if now >= counted_from && now < stop_at {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
            BenchResult::Ok(())
        });
    }
    join_within(set, DRAIN_LIMIT).await?;
    let rate = done.load(Ordering::Relaxed) as f64 / (stop_at - counted_from).as_secs_f64();
    Ok((rate, all.load(Ordering::Relaxed)))
}

/// The commands the servers ran so far, summed over them, those rejected
/// (a redirect) or failed under names of their own; and their reads and
/// writes of client sockets (replication's included), prefixed [`IO`].
async fn counts_of(servers: &[MultiplexedConnection]) -> BenchResult<BTreeMap<String, u64>> {
    let mut total = BTreeMap::new();
    for conn in servers {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn.clone())
            .await?;
        let lines = info
            .lines()
            .filter_map(|l| l.trim().strip_prefix("cmdstat_"));
        for (command, fields) in lines.filter_map(|stats| stats.split_once(':')) {
            for (field, n) in fields.split(',').filter_map(|f| f.split_once('=')) {
                let what = match field {
                    "calls" => command.to_owned(),
                    "rejected_calls" | "failed_calls" => format!("{command} ({field})"),
                    _ => continue,
                };
                *total.entry(what).or_insert(0) += n.parse::<u64>().unwrap_or(0);
            }
        }
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut conn.clone())
            .await?;
        for io in ["total_reads_processed", "total_writes_processed"] {
            let n = info
                .lines()
                .find_map(|l| l.strip_prefix(io)?.strip_prefix(':'));
            let n = n.and_then(|n| n.trim().parse::<u64>().ok()).unwrap_or(0);
            *total.entry(format!("{IO}{io}")).or_insert(0) += n;
        }
    }
    Ok(total)
}

/// The servers' CPU time so far (user + system, seconds), summed.
async fn cpu_of(servers: &[MultiplexedConnection]) -> BenchResult<f64> {
    let mut total = 0.0;
    for conn in servers {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut conn.clone())
            .await?;
        total += cpu_seconds(&info)?;
    }
    Ok(total)
}
