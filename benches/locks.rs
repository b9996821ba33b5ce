//! Lock benchmarks: multilock against rslock and against "the limit".
//!
//! ```text
//! cargo bench --bench locks                            # full run, about 2 minutes
//! MULTILOCK_BENCH_SMOKE=1 cargo bench --bench locks    # smoke run, a few seconds (CI)
//! cargo bench --bench locks -- --smoke                 # the same
//! ```
//!
//! The program starts its own `redis-server` processes (five; the 1- and
//! 3-node figures use the first one and the first three) and measures every
//! contender on the same processes in the same run:
//!
//! - **multilock**: this crate's `Lock`, `MultiLock` and `RedLock`;
//! - **rslock** 0.10: the Rust Redlock peer (`SET NX PX` to acquire, a
//!   compare-and-delete script to release, retries instead of waiting);
//! - **the limit**: one bare redis-rs `MultiplexedConnection` per node sending
//!   the crate's own acquire and release script calls by EVALSHA, built by the
//!   crate's protocol module (`multilock::testkit::protocol`), so the scripts,
//!   keys and arguments are the crate's: the cost of the protocol alone. On one
//!   node the two calls go one after the other; on several, each goes to all
//!   nodes at once (`join_all`).
//!
//! What is measured, in order:
//!
//! - (a) uncontended lock+unlock latency on 1, 3 and 5 nodes, and the CPU
//!   each lock+unlock uses in this process and on the servers;
//! - (b) one contended lock: K tasks acquire and release it in a loop, either
//!   tight (the releaser races the waiters: throughput and fairness) or
//!   handing off (hold 1 ms, then step back: every grant goes to a waiter).
//!   The hand-off is the time from one holder's release completing to the
//!   next holder's grant, both read from one monotonic clock; rslock runs
//!   with its default retries and with the best retry delay of a sweep;
//! - (c) many keys: K tasks on K different locks, acquisitions per second;
//! - (d) scale: server connections and this process's memory with 10,000
//!   tasks waiting on one lock; watchdog renewal calls per node per tick with
//!   10,000 locks held, and the latency of a lock+unlock meanwhile;
//! - (e) Redis commands per uncontended lock+unlock: sent on the wire
//!   (MONITOR), executed including the commands scripts run (`INFO
//!   commandstats`), and the server time they take.
//!
//! The report goes to stdout and `target/bench/results.md`, the latency CDFs
//! to `target/bench/latency_cdf.svg` (both under `$CARGO_TARGET_DIR` when set).

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::join_all;
use multilock::testkit::protocol::{self, RENEW_BATCH_SIZE};
use multilock::testkit::{RedisProcess, TestServer};
use multilock::{Client, Guard, Lock, MultiLock, Node, RedLock};
use redis::aio::MultiplexedConnection;
use redis::{FromRedisValue, RedisResult, ScriptInvocation};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;

type BenchResult<T = ()> = Result<T, Box<dyn Error + Send + Sync>>;

/// Lease of every acquisition (multilock's lease, rslock's TTL, the
/// limit's): far longer than any run, so nothing expires.
const LEASE: Duration = Duration::from_secs(30);
/// Server processes started; the 1- and 3-node cases use the first ones.
const SERVERS: usize = 5;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("benchmark failed: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> BenchResult {
    let settings = Settings::from_env();
    let started = Instant::now();
    eprintln!(
        "starting {SERVERS} redis-server processes ({} run)",
        settings.name()
    );
    let servers = Servers::start(SERVERS).await?;
    let mut report = Report::default();

    let progress = |step: &str| eprintln!("[{:6.1} s] {step}", started.elapsed().as_secs_f64());
    progress("(a) uncontended lock+unlock");
    let rtt = uncontended(&settings, &servers, &mut report).await?;
    progress("(b) contended hand-off");
    contended(&settings, &servers, rtt, &mut report).await?;
    progress("(c) many keys");
    many_keys(&settings, &servers, &mut report).await?;
    progress("(d) scale: waiters, then locks held under the watchdog");
    let mut scale = Table::new(
        "(d) Scale",
        "reference: the expected value, or the same figure with nothing held",
        &["reference"],
    );
    waiters(&settings, &servers, &mut scale, &mut report).await?;
    held_under_watchdog(&settings, &servers, &mut scale, &mut report).await?;
    report.tables.push(scale);
    progress("(e) commands per lock+unlock");
    commands(&settings, &servers, &mut report).await?;

    progress("done");
    report.header = machine_line(&servers, &settings, started.elapsed()).await;
    report.publish()
}

// ---------------------------------------------------------------------------
// Settings

/// How much to measure: the full run, or the smoke run CI does.
struct Settings {
    smoke: bool,
    /// Uncontended lock+unlock: untimed warm-up per contender, then timed
    /// iterations split into rounds that alternate between the contenders, so
    /// that drift in the machine's state hits every contender alike.
    warmup: usize,
    iterations: usize,
    rounds: usize,
    /// Task counts K of the contended and many-keys cases, and how long each
    /// case runs (its first tenth is a warm-up, not counted).
    tasks: Vec<usize>,
    run_for: Duration,
    /// rslock retry delays tried for its tuned figures (with unlimited
    /// retries); the tuned column shows the one with the lowest hand-off p50.
    rslock_delays: Vec<Duration>,
    /// Tasks waiting on one lock.
    waiters: usize,
    /// Locks held under the watchdog, and its timeout (renewal every third).
    held_locks: usize,
    watchdog_timeout: Duration,
    /// Lock+unlock per contender while counting commands.
    command_iterations: usize,
}

impl Settings {
    fn from_env() -> Settings {
        let smoke = std::env::var("MULTILOCK_BENCH_SMOKE").is_ok_and(|v| !v.is_empty() && v != "0")
            || std::env::args().any(|arg| arg == "--smoke");
        if smoke {
            Settings {
                smoke,
                warmup: 20,
                iterations: 200,
                rounds: 2,
                tasks: vec![4, 16],
                run_for: Duration::from_millis(150),
                rslock_delays: vec![Duration::from_millis(1)],
                waiters: 500,
                held_locks: 1_200,
                watchdog_timeout: Duration::from_millis(300),
                command_iterations: 50,
            }
        } else {
            Settings {
                smoke,
                warmup: 300,
                iterations: 4_000,
                rounds: 8,
                tasks: vec![8, 64],
                run_for: Duration::from_millis(1500),
                rslock_delays: [1, 5, 20].map(Duration::from_millis).to_vec(),
                waiters: 10_000,
                held_locks: 10_000,
                watchdog_timeout: Duration::from_secs(3),
                command_iterations: 500,
            }
        }
    }

    fn name(&self) -> &'static str {
        if self.smoke { "smoke" } else { "full" }
    }
}

// ---------------------------------------------------------------------------
// The servers

/// The redis-server processes every contender runs against, with one admin
/// connection to each for INFO (it sends nothing else).
struct Servers {
    urls: Vec<String>,
    admin: Vec<MultiplexedConnection>,
    /// Killed when dropped.
    _processes: Vec<RedisProcess>,
}

impl Servers {
    async fn start(n: usize) -> BenchResult<Servers> {
        let processes = RedisProcess::start_many(n).await?;
        let urls: Vec<String> = processes.iter().map(TestServer::url).collect();
        let mut admin = Vec::with_capacity(n);
        for url in &urls {
            let client = redis::Client::open(url.as_str())?;
            admin.push(client.get_multiplexed_async_connection().await?);
        }
        Ok(Servers {
            urls,
            admin,
            _processes: processes,
        })
    }

    /// multilock nodes for the first `n` servers (default settings).
    fn nodes(&self, n: usize) -> BenchResult<Vec<Node>> {
        Ok(self.urls[..n]
            .iter()
            .map(|url| Node::new(url))
            .collect::<multilock::Result<_>>()?)
    }

    /// An rslock manager over the first `n` servers, default retries.
    fn rslock(&self, n: usize) -> rslock::LockManager {
        rslock::LockManager::new(self.urls[..n].to_vec())
    }

    /// The limit's connections to the first `n` servers: RESP3, like the
    /// crate's.
    async fn bare_connections(&self, n: usize) -> BenchResult<Vec<MultiplexedConnection>> {
        let mut conns = Vec::with_capacity(n);
        for url in &self.urls[..n] {
            let client = redis::Client::open(format!("{url}/?protocol=resp3"))?;
            conns.push(client.get_multiplexed_async_connection().await?);
        }
        Ok(conns)
    }

    async fn query<T: FromRedisValue>(&self, node: usize, cmd: &redis::Cmd) -> BenchResult<T> {
        Ok(cmd.query_async(&mut self.admin[node].clone()).await?)
    }

    async fn info(&self, node: usize, section: &str) -> BenchResult<String> {
        self.query(node, redis::cmd("INFO").arg(section)).await
    }

    /// `calls` per command from `INFO commandstats`.
    async fn command_stats(&self, node: usize) -> BenchResult<BTreeMap<String, CommandStat>> {
        Ok(parse_command_stats(&self.info(node, "commandstats").await?))
    }

    /// EVALSHA's stats on each of the first `n` servers.
    async fn evalsha_stats(&self, n: usize) -> BenchResult<Vec<CommandStat>> {
        let mut stats = Vec::with_capacity(n);
        for node in 0..n {
            let all = self.command_stats(node).await?;
            stats.push(all.get("evalsha").copied().unwrap_or_default());
        }
        Ok(stats)
    }

    /// CPU time the server has used so far (user + system), in seconds.
    async fn cpu_seconds(&self, node: usize) -> BenchResult<f64> {
        cpu_seconds(&self.info(node, "cpu").await?)
    }

    /// Meters the CPU of this process and of the first `n` servers.
    fn cpu_meter(&self, n: usize) -> CpuMeter {
        CpuMeter {
            servers: self.admin[..n].to_vec(),
        }
    }

    async fn connected_clients(&self, node: usize) -> BenchResult<u64> {
        let info = self.info(node, "clients").await?;
        info_field(&info, "connected_clients")
            .ok_or_else(|| "INFO clients has no connected_clients".into())
    }

    /// Connections subscribed to at least one channel or pattern.
    async fn subscription_connections(&self, node: usize) -> BenchResult<usize> {
        let list: String = self.query(node, redis::cmd("CLIENT").arg("LIST")).await?;
        Ok(list
            .lines()
            .filter(|line| {
                line.split(' ').any(|kv| {
                    kv.strip_prefix("sub=")
                        .or_else(|| kv.strip_prefix("psub="))
                        .is_some_and(|n| n != "0")
                })
            })
            .count())
    }
}

/// A server's CPU time (user + system, seconds) from its `INFO cpu`.
fn cpu_seconds(info: &str) -> BenchResult<f64> {
    let field = |name: &str| -> BenchResult<f64> {
        info.lines()
            .find_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse()
                    .ok()
            })
            .ok_or_else(|| format!("INFO cpu has no {name}").into())
    };
    Ok(field("used_cpu_user")? + field("used_cpu_sys")?)
}

fn info_field(info: &str, field: &str) -> Option<u64> {
    info.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == field).then(|| value.trim().parse().ok())?
    })
}

/// One line of `INFO commandstats`.
#[derive(Clone, Copy, Default)]
struct CommandStat {
    calls: u64,
    /// Server time spent in the command (for a script: the whole script).
    usec: u64,
}

/// `cmdstat_evalsha:calls=12,usec=345,...` lines, by command.
fn parse_command_stats(info: &str) -> BTreeMap<String, CommandStat> {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
                    .parse()
                    .ok()
            };
            let stat = CommandStat {
                calls: field("calls")?,
                usec: field("usec")?,
            };
            Some((name.to_owned(), stat))
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The contenders

/// Something that locks and unlocks: this crate, rslock, or the limit.
#[derive(Clone)]
enum Contender {
    /// This crate; `lease: None` takes the lock under the watchdog.
    Multilock {
        lock: AnyLock,
        lease: Option<Duration>,
    },
    Rslock {
        manager: rslock::LockManager,
        resource: String,
    },
    Limit(Limit),
}

/// The crate's three interchangeable lock types.
#[derive(Clone)]
enum AnyLock {
    Single(Lock),
    Multi(MultiLock),
    Red(RedLock),
}

/// A hold, handed back to the contender that made it.
enum Held {
    Guard(Guard),
    Rslock(rslock::Lock),
    Limit,
}

impl Contender {
    fn multilock(lock: AnyLock) -> Contender {
        Contender::Multilock {
            lock,
            lease: Some(LEASE),
        }
    }

    /// Acquires, waiting as long as it takes (the limit makes one attempt:
    /// it is only measured on free locks).
    async fn acquire(&self) -> BenchResult<Held> {
        Ok(match self {
            Contender::Multilock { lock, lease } => Held::Guard(lock.acquire(*lease).await?),
            Contender::Rslock { manager, resource } => {
                Held::Rslock(manager.acquire_no_guard(resource.as_str(), LEASE).await?)
            }
            Contender::Limit(limit) => {
                limit.acquire().await?;
                Held::Limit
            }
        })
    }

    async fn release(&self, held: Held) -> BenchResult {
        match (self, held) {
            (_, Held::Guard(guard)) => guard.unlock().await?,
            // Best effort by design: rslock reports nothing.
            (_, Held::Rslock(lock)) => lock.release().await,
            (Contender::Limit(limit), Held::Limit) => limit.release().await?,
            (_, Held::Limit) => unreachable!("only the limit makes a limit hold"),
        }
        Ok(())
    }

    async fn lock_unlock(&self) -> BenchResult {
        let held = self.acquire().await?;
        self.release(held).await
    }
}

impl AnyLock {
    async fn acquire(&self, lease: Option<Duration>) -> multilock::Result<Guard> {
        match (self, lease) {
            (AnyLock::Single(lock), Some(lease)) => lock.lock_with_lease(lease).await,
            (AnyLock::Single(lock), None) => lock.lock().await,
            (AnyLock::Multi(lock), Some(lease)) => lock.lock_with_lease(lease).await,
            (AnyLock::Multi(lock), None) => lock.lock().await,
            (AnyLock::Red(lock), Some(lease)) => lock.lock_with_lease(lease).await,
            (AnyLock::Red(lock), None) => lock.lock().await,
        }
    }
}

/// The limit: a bare connection per node sending the crate's acquire and
/// release script calls, as the crate's protocol module builds them, and
/// nothing else.
#[derive(Clone)]
struct Limit {
    conns: Vec<MultiplexedConnection>,
    name: String,
    field: String,
}

impl Limit {
    fn new(conns: Vec<MultiplexedConnection>, name: String) -> Limit {
        Limit {
            conns,
            field: protocol::field(&uuid::Uuid::new_v4().to_string(), "limit"),
            name,
        }
    }

    async fn acquire(&self) -> BenchResult {
        let invocation = protocol::acquire(&self.name, &self.field, LEASE);
        for reply in self.on_every_node::<Option<i64>>(&invocation).await {
            if let Some(pttl) = reply? {
                return Err(format!("the limit found {} taken (PTTL {pttl} ms)", self.name).into());
            }
        }
        Ok(())
    }

    async fn release(&self) -> BenchResult {
        // A fresh request id per release, as the crate does.
        let request_id = uuid::Uuid::new_v4().to_string();
        let invocation = protocol::release(&self.name, &self.field, LEASE, &request_id);
        for reply in self.on_every_node::<Option<i64>>(&invocation).await {
            if reply? != Some(1) {
                return Err(format!("the limit did not hold {}", self.name).into());
            }
        }
        Ok(())
    }

    /// One node: the call alone. Several: to all of them at once.
    async fn on_every_node<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Vec<RedisResult<T>> {
        if let [conn] = self.conns.as_slice() {
            return vec![invocation.invoke_async(&mut conn.clone()).await];
        }
        join_all(self.conns.iter().map(|conn| {
            let mut conn = conn.clone();
            async move { invocation.invoke_async(&mut conn).await }
        }))
        .await
    }
}

// ---------------------------------------------------------------------------
// Latencies

/// Latency samples, sorted, in nanoseconds.
#[derive(Clone, Default)]
struct Latencies(Vec<u64>);

impl Latencies {
    fn new(mut nanos: Vec<u64>) -> Latencies {
        nanos.sort_unstable();
        Latencies(nanos)
    }

    /// The `q` quantile (nearest rank), in µs.
    fn quantile(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let rank = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1] as f64 / 1e3
    }

    fn p50(&self) -> f64 {
        self.quantile(0.50)
    }

    fn p99(&self) -> f64 {
        self.quantile(0.99)
    }

    fn max(&self) -> f64 {
        self.quantile(1.0)
    }

    fn mean(&self) -> f64 {
        let sum: u64 = self.0.iter().sum();
        sum as f64 / self.0.len().max(1) as f64 / 1e3
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// CPU time used so far by this process and by some of the servers.
#[derive(Clone, Copy, Default)]
struct CpuTime {
    client: Duration,
    servers: Duration,
}

/// Reads [`CpuTime`]: this process's threads from `/proc/self/task/*/schedstat`
/// (nanoseconds on a CPU), each server from `INFO cpu` (user + system,
/// microseconds). Read between batches only, so the reads cost nothing timed.
#[derive(Clone)]
struct CpuMeter {
    servers: Vec<MultiplexedConnection>,
}

impl CpuMeter {
    async fn read(&mut self) -> BenchResult<CpuTime> {
        let mut servers = 0.0;
        for conn in &mut self.servers {
            let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
            servers += cpu_seconds(&info)?;
        }
        Ok(CpuTime {
            client: process_cpu()?,
            servers: Duration::from_secs_f64(servers),
        })
    }
}

/// CPU time of this process's live threads (Linux, as the rest of the
/// program's /proc readings).
fn process_cpu() -> BenchResult<Duration> {
    let mut nanos = 0;
    for task in std::fs::read_dir("/proc/self/task")? {
        // A thread that just ended has no file any more: it counts as zero.
        let Ok(stat) = std::fs::read_to_string(task?.path().join("schedstat")) else {
            continue;
        };
        nanos += stat
            .split_whitespace()
            .next()
            .and_then(|on_cpu| on_cpu.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(Duration::from_nanos(nanos))
}

/// One contender's uncontended run: latencies, and the CPU its lock+unlocks
/// used in this process and on the servers.
#[derive(Clone, Default)]
struct Timed {
    latencies: Latencies,
    cpu: CpuTime,
}

impl Timed {
    /// CPU per lock+unlock (µs): (this process, the servers).
    fn cpu_per_op(&self) -> (f64, f64) {
        let ops = self.latencies.0.len().max(1) as f64;
        (
            self.cpu.client.as_secs_f64() * 1e6 / ops,
            self.cpu.servers.as_secs_f64() * 1e6 / ops,
        )
    }

    /// Cores busy on average while it ran: all the CPU it used ÷ its time.
    fn cores_busy(&self) -> f64 {
        let (client, servers) = self.cpu_per_op();
        (client + servers) / self.latencies.mean()
    }
}

/// Times `contenders` doing lock+unlock one after the other, in alternating
/// rounds, and meters the CPU each one's batches use. Runs in a task of its
/// own (the crate's default owner is the task).
async fn time_lock_unlock(
    contenders: Vec<Contender>,
    mut meter: CpuMeter,
    warmup: usize,
    iterations: usize,
    rounds: usize,
) -> BenchResult<Vec<Timed>> {
    let task = tokio::spawn(async move {
        for contender in &contenders {
            for _ in 0..warmup {
                contender.lock_unlock().await?;
            }
        }
        let per_round = iterations.div_ceil(rounds);
        let mut samples = vec![Vec::with_capacity(per_round * rounds); contenders.len()];
        let mut cpu = vec![CpuTime::default(); contenders.len()];
        for _ in 0..rounds {
            for ((contender, samples), cpu) in contenders.iter().zip(&mut samples).zip(&mut cpu) {
                let before = meter.read().await?;
                for _ in 0..per_round {
                    let started = Instant::now();
                    contender.lock_unlock().await?;
                    samples.push(nanos(started.elapsed()));
                }
                let after = meter.read().await?;
                cpu.client += after.client.saturating_sub(before.client);
                cpu.servers += after.servers.saturating_sub(before.servers);
            }
        }
        BenchResult::Ok(
            samples
                .into_iter()
                .zip(cpu)
                .map(|(samples, cpu)| Timed {
                    latencies: Latencies::new(samples),
                    cpu,
                })
                .collect(),
        )
    });
    task.await?
}

/// Times lock+unlock of one contender, one after the other, for `run_for`.
async fn time_lock_unlock_for(contender: Contender, run_for: Duration) -> BenchResult<Latencies> {
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let mut samples = Vec::new();
        while started.elapsed() < run_for {
            let op = Instant::now();
            contender.lock_unlock().await?;
            samples.push(nanos(op.elapsed()));
        }
        BenchResult::Ok(Latencies::new(samples))
    });
    task.await?
}

// ---------------------------------------------------------------------------
// (a) Uncontended

/// Uncontended lock+unlock on 1, 3 and 5 nodes. Returns one round trip (half
/// the limit's 1-node lock+unlock p50), the unit of the hand-off target.
async fn uncontended(
    settings: &Settings,
    servers: &Servers,
    report: &mut Report,
) -> BenchResult<f64> {
    let client = Client::new();
    let nodes = servers.nodes(SERVERS)?;
    let mut table = Table::new(
        "(a) Uncontended lock+unlock, µs",
        "multilock with a 30 s lease unless marked watchdog; rslock `lock` + `unlock`; \
         the limit: EVALSHA acquire then EVALSHA release (fanned out to all nodes at once \
         when there are several)",
        &["limit", "rslock"],
    );
    let mut cpu_table = Table::new(
        "(a) Uncontended: CPU per lock+unlock",
        "CPU used per lock+unlock by this process (all threads, /proc/self/task/*/schedstat) \
         and by the servers in use (sum of INFO cpu); cores busy = both ÷ the mean \
         latency. Near the machine's core count, the latency is bound by CPU, not by the \
         network",
        &["limit", "rslock"],
    );
    let mut round_trip = f64::NAN;
    for n in [1, 3, 5] {
        let name = |what: &str| format!("bench:uncontended:{n}:{what}");
        let mut ours: Vec<(String, Contender)> = Vec::new();
        if n == 1 {
            let lock = client.lock(&nodes[0], name("lock"))?;
            ours.push(("Lock".into(), Contender::multilock(AnyLock::Single(lock))));
            let lock = client.lock(&nodes[0], name("lock-watchdog"))?;
            let watchdog = Contender::Multilock {
                lock: AnyLock::Single(lock),
                lease: None,
            };
            ours.push(("Lock (watchdog)".into(), watchdog));
        } else {
            let multi = client.multi_lock_on(&nodes[..n], &name("multi"))?;
            ours.push((
                "MultiLock".into(),
                Contender::multilock(AnyLock::Multi(multi)),
            ));
            let red = client.red_lock_on(&nodes[..n], &name("red"))?;
            ours.push(("RedLock".into(), Contender::multilock(AnyLock::Red(red))));
        }
        let limit = Contender::Limit(Limit::new(
            servers.bare_connections(n).await?,
            name("limit"),
        ));
        let rslock = Contender::Rslock {
            manager: servers.rslock(n),
            resource: name("rslock"),
        };
        let mut contenders: Vec<Contender> = ours.iter().map(|(_, c)| c.clone()).collect();
        contenders.extend([limit, rslock]);
        let mut timed = time_lock_unlock(
            contenders,
            servers.cpu_meter(n),
            settings.warmup,
            settings.iterations,
            settings.rounds,
        )
        .await?;
        let rslock = timed.pop().unwrap_or_default();
        let limit = timed.pop().unwrap_or_default();
        let nodes_label = if n == 1 {
            "1 node".to_owned()
        } else {
            format!("{n} nodes")
        };
        cpu_rows(
            &mut cpu_table,
            &nodes_label,
            ours.iter().map(|(label, _)| label.as_str()).zip(&timed),
            &limit,
            &rslock,
        );
        let red_lock = ours.iter().position(|(label, _)| label == "RedLock");
        if let (true, Some(red), Some((one_node, _, _))) = (
            n == SERVERS,
            red_lock.and_then(|i| timed.get(i)),
            report.uncontended.get(&1),
        ) {
            let one_node = one_node.first().map_or(f64::NAN, Latencies::p50);
            let floor = cpu_floor_note(&format!("{nodes_label}, RedLock"), red, one_node);
            report.notes.push(floor);
        }
        let (rslock, limit) = (rslock.latencies, limit.latencies);
        let timed: Vec<Latencies> = timed.into_iter().map(|t| t.latencies).collect();
        if n == 1 {
            round_trip = limit.p50() / 2.0;
        }

        let mut panel = Panel::new(format!("Uncontended lock+unlock, {nodes_label}"));
        for ((label, _), latencies) in ours.iter().zip(&timed) {
            for (stat, pick) in STATS {
                table.row(
                    format!("{nodes_label}, {label}: {stat}"),
                    Unit::Micros,
                    Cell::of(pick(latencies)),
                    vec![Some(Cell::of(pick(&limit))), Some(Cell::of(pick(&rslock)))],
                );
            }
            panel.add(format!("multilock {label}"), latencies.clone());
        }
        panel.add("the limit (bare EVALSHA)".into(), limit.clone());
        panel.add("rslock".into(), rslock.clone());
        report.panels.push(panel);
        report.uncontended.insert(n, (timed, limit, rslock));
    }
    report.tables.push(table);
    report.tables.push(cpu_table);
    report.round_trip = round_trip;
    Ok(round_trip)
}

/// Why a latency cannot go lower on this machine: the CPU one lock+unlock
/// needs, spread over every core, is a floor under it.
fn cpu_floor_note(what: &str, timed: &Timed, one_node_p50: f64) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (here, servers) = timed.cpu_per_op();
    let floor = (here + servers) / cores as f64;
    let servers_floor = servers / cores as f64;
    format!(
        "(a) {what}: one lock+unlock needs {servers:.0} µs of CPU on the servers and \
         {here:.0} µs here; spread over {cores} cores that is at least {floor:.0} µs, \
         {:.2}× the 1-node Lock p50 (the servers' share alone: {:.2}×), whatever the client \
         does. With one host per node, the nodes' work runs side by side instead.",
        floor / one_node_p50,
        servers_floor / one_node_p50,
    )
}

/// The CPU rows of one node count: per multilock series, CPU per lock+unlock
/// here and on the servers, and the cores that kept busy.
fn cpu_rows<'a>(
    table: &mut Table,
    nodes: &str,
    ours: impl Iterator<Item = (&'a str, &'a Timed)>,
    limit: &Timed,
    rslock: &Timed,
) {
    type Figure = (&'static str, Unit, fn(&Timed) -> f64);
    const FIGURES: [Figure; 3] = [
        ("CPU here, µs", Unit::Micros, |t| t.cpu_per_op().0),
        ("CPU of the servers, µs", Unit::Micros, |t| {
            t.cpu_per_op().1
        }),
        ("cores busy", Unit::Count, Timed::cores_busy),
    ];
    for (label, timed) in ours {
        for (figure, unit, pick) in FIGURES {
            table.row(
                format!("{nodes}, {label}: {figure}"),
                unit,
                Cell::of(pick(timed)),
                vec![Some(Cell::of(pick(limit))), Some(Cell::of(pick(rslock)))],
            );
        }
    }
}

type Stat = (&'static str, fn(&Latencies) -> f64);
const STATS: [Stat; 3] = [
    ("p50", Latencies::p50),
    ("p99", Latencies::p99),
    ("mean", Latencies::mean),
];

// ---------------------------------------------------------------------------
// (b) Contended hand-off

/// One hold in a contended run.
struct Hold {
    task: usize,
    granted: Instant,
    released: Instant,
}

/// The outcome of K tasks fighting over one lock.
struct Contention {
    /// Hand-offs to another task: its grant after the previous holder's
    /// release completed.
    handoffs: Latencies,
    /// Of those, grants that came before the previous holder had its release
    /// reply (counted as zero).
    early: usize,
    /// Share of grants that went straight back to the task that had just
    /// released (barging), in %.
    regrants: f64,
    per_second: f64,
    /// Grants over the whole run, warm-up and drain included.
    grants: u64,
    /// Server CPU per grant, µs (set by the caller, who reads INFO cpu).
    server_cpu: f64,
}

/// How long the tasks of a finished case get to leave (each needs one more
/// grant after the end of the run).
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// How the tasks of a contended case loop.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pace {
    /// Release at once and acquire again at once: the releaser races the
    /// waiters.
    Tight,
    /// Hold for [`HOLD`], release, then step back until another task was
    /// granted: every grant goes to a task that was already waiting, so the
    /// hand-off is the waiters' wake-up alone.
    HandOff,
}

/// How long a hand-off loop holds the lock: long enough for every other
/// task to be parked when it is released.
const HOLD: Duration = Duration::from_millis(1);

/// K tasks acquire and release one lock in a loop for `run_for`; the first
/// tenth is warm-up.
async fn contend(
    contender: &Contender,
    tasks: usize,
    run_for: Duration,
    pace: Pace,
) -> BenchResult<Contention> {
    let start = Instant::now();
    let counted_from = start + run_for / 10;
    let stop_at = start + run_for;
    let holds = Arc::new(Mutex::new(Vec::new()));
    let (grants, _) = watch::channel(0u64);
    let grants = Arc::new(grants);
    let mut set = JoinSet::new();
    for task in 0..tasks {
        let contender = contender.clone();
        let holds = holds.clone();
        let grants = grants.clone();
        set.spawn(async move {
            let mut others = grants.subscribe();
            loop {
                let held = contender.acquire().await?;
                let granted = Instant::now();
                let mut grant = 0;
                grants.send_modify(|count| {
                    *count += 1;
                    grant = *count;
                });
                if pace == Pace::HandOff {
                    tokio::time::sleep(HOLD).await;
                }
                contender.release(held).await?;
                let released = Instant::now();
                if granted >= stop_at {
                    return BenchResult::Ok(());
                }
                if granted >= counted_from {
                    let mut holds = holds.lock().expect("no task panics holding it");
                    holds.push(Hold {
                        task,
                        granted,
                        released,
                    });
                }
                if pace == Pace::HandOff {
                    // Bounded: near the end, the others may have left.
                    let next = others.wait_for(|count| *count > grant);
                    let _ = tokio::time::timeout(Duration::from_millis(500), next).await;
                }
            }
        });
    }
    join_within(set, DRAIN_LIMIT).await?;

    let mut holds = std::mem::take(&mut *holds.lock().expect("no task panics holding it"));
    holds.sort_unstable_by_key(|hold| hold.granted);
    let (mut early, mut regrants, mut gaps) = (0, 0, Vec::with_capacity(holds.len()));
    for pair in holds.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        if after.task == before.task {
            regrants += 1;
            continue;
        }
        gaps.push(
            match after.granted.checked_duration_since(before.released) {
                Some(gap) => nanos(gap),
                None => {
                    early += 1;
                    0
                }
            },
        );
    }
    Ok(Contention {
        handoffs: Latencies::new(gaps),
        early,
        regrants: 100.0 * regrants as f64 / holds.len().saturating_sub(1).max(1) as f64,
        per_second: holds.len() as f64 / (stop_at - counted_from).as_secs_f64(),
        grants: *grants.borrow(),
        server_cpu: f64::NAN,
    })
}

/// [`contend`] on the first server, with the server's CPU time per grant.
async fn contend_on(
    servers: &Servers,
    contender: &Contender,
    tasks: usize,
    run_for: Duration,
    pace: Pace,
) -> BenchResult<Contention> {
    let cpu_before = servers.cpu_seconds(0).await?;
    let mut run = contend(contender, tasks, run_for, pace).await?;
    let cpu = servers.cpu_seconds(0).await? - cpu_before;
    run.server_cpu = cpu * 1e6 / run.grants.max(1) as f64;
    Ok(run)
}

/// A row of the contended table: its name, unit, and how to read it.
type Figure = (&'static str, Unit, fn(&Contention) -> f64);

/// Awaits every task of `set`, at most `limit`; the first error wins.
async fn join_within(mut set: JoinSet<BenchResult>, limit: Duration) -> BenchResult {
    let all = async {
        while let Some(joined) = set.join_next().await {
            joined??;
        }
        BenchResult::Ok(())
    };
    match tokio::time::timeout(limit, all).await {
        Ok(result) => result,
        Err(_) => Err(format!("tasks still running after {limit:?}").into()),
    }
}

async fn contended(
    settings: &Settings,
    servers: &Servers,
    round_trip: f64,
    report: &mut Report,
) -> BenchResult {
    let client = Client::new();
    let node = Node::new(&servers.urls[0])?;
    let delays: Vec<String> = settings
        .rslock_delays
        .iter()
        .map(|d| format!("{} ms", d.as_millis()))
        .collect();
    let mut table = Table::new(
        "(b) Contended: K tasks on one lock (1 node), acquire → release in a loop",
        &format!(
            "tight loop: each task releases at once and acquires again at once; hand-off loop: \
             each task holds 1 ms, releases, and steps back until another task was granted, so \
             every grant goes to a parked waiter. Hand-off = another task's grant after the \
             holder's release completed (one clock); re-grants = grants straight back to the \
             task that had just released; a round trip = half the limit's 1-node lock+unlock \
             p50 ({round_trip:.1} µs); Redis CPU = the server's user+system CPU time over the \
             run (INFO cpu) per grant; rslock tuned = unlimited retries and the retry delay, \
             of {}, with the lowest hand-off p50",
            delays.join(", ")
        ),
        &["1 round trip", "rslock default", "rslock tuned"],
    );
    for &k in &settings.tasks {
        for pace in [Pace::Tight, Pace::HandOff] {
            let case = match pace {
                Pace::Tight => format!("K={k}, tight loop"),
                Pace::HandOff => format!("K={k}, hand-off loop"),
            };
            let name = |who: &str| format!("bench:handoff:{case}:{who}");
            let ours = client.lock(&node, name("multilock"))?;
            let ours = Contender::multilock(AnyLock::Single(ours));
            let ours = contend_on(servers, &ours, k, settings.run_for, pace).await?;
            let default = Contender::Rslock {
                manager: servers.rslock(1),
                resource: name("rslock"),
            };
            let default = contend_on(servers, &default, k, settings.run_for, pace).await?;
            let mut tuned: Option<(Duration, Contention)> = None;
            for &delay in &settings.rslock_delays {
                let mut manager = servers.rslock(1);
                manager.set_retry(u32::MAX, delay);
                let contender = Contender::Rslock {
                    manager,
                    resource: name(&format!("rslock-{}", delay.as_millis())),
                };
                let run = contend_on(servers, &contender, k, settings.run_for, pace).await?;
                report.notes.push(format!(
                    "(b) {case}, rslock retry delay {delay:?}: hand-off p50 {:.1} µs, p99 \
                     {:.1} µs, {} acquisitions/s, {:.0} % re-grants, Redis CPU {:.1} µs per \
                     acquisition.",
                    run.handoffs.p50(),
                    run.handoffs.p99(),
                    group(run.per_second),
                    run.regrants,
                    run.server_cpu
                ));
                if tuned
                    .as_ref()
                    .is_none_or(|(_, best)| run.handoffs.p50() < best.handoffs.p50())
                {
                    tuned = Some((delay, run));
                }
            }

            let mut figures: Vec<Figure> = vec![
                ("hand-off p50 (µs)", Unit::Micros, |c| c.handoffs.p50()),
                ("hand-off p99 (µs)", Unit::Micros, |c| c.handoffs.p99()),
                ("acquisitions/s", Unit::PerSecond, |c| c.per_second),
                ("Redis CPU per acquisition (µs)", Unit::Micros, |c| {
                    c.server_cpu
                }),
            ];
            if pace == Pace::Tight {
                figures.push(("re-grants (%)", Unit::Percent, |c| c.regrants));
            }
            for (figure, unit, pick) in figures {
                let rtt = figure.starts_with("hand-off").then(|| Cell::of(round_trip));
                let tuned = tuned.as_ref().map(|(delay, run)| {
                    Cell::noted(pick(run), format!("{} ms", delay.as_millis()))
                });
                table.row(
                    format!("{case}: {figure}"),
                    unit,
                    Cell::of(pick(&ours)),
                    vec![rtt, Some(Cell::of(pick(&default))), tuned],
                );
            }
            report.notes.push(format!(
                "(b) {case}: {} of {} multilock hand-offs (rslock default: {} of {}) were \
                 granted before the previous holder had its release reply: counted as zero.",
                ours.early,
                ours.handoffs.0.len(),
                default.early,
                default.handoffs.0.len(),
            ));
            if pace == Pace::HandOff && settings.tasks.last() == Some(&k) {
                let mut panel = Panel::new(format!("Contended hand-off, {case}, 1 node"));
                panel.add("multilock Lock".into(), ours.handoffs.clone());
                panel.add("rslock default".into(), default.handoffs.clone());
                if let Some((delay, run)) = &tuned {
                    let label = format!("rslock tuned ({} ms)", delay.as_millis());
                    panel.add(label, run.handoffs.clone());
                }
                report.panels.push(panel);
            }
            report.handoffs.push((case, ours));
        }
    }
    report.tables.push(table);
    Ok(())
}

// ---------------------------------------------------------------------------
// (c) Many keys

/// K tasks, each on its own lock, lock+unlock in a loop; acquisitions per
/// second after a warm-up tenth.
async fn many_locks(
    make: impl Fn(usize) -> BenchResult<Contender>,
    tasks: usize,
    run_for: Duration,
) -> BenchResult<f64> {
    let start = Instant::now();
    let counted_from = start + run_for / 10;
    let stop_at = start + run_for;
    let done = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for i in 0..tasks {
        let contender = make(i)?;
        let done = done.clone();
        set.spawn(async move {
            while Instant::now() < stop_at {
                contender.lock_unlock().await?;
                let now = Instant::now();
                if now >= counted_from && now < stop_at {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
            BenchResult::Ok(())
        });
    }
    join_within(set, DRAIN_LIMIT).await?;
    Ok(done.load(Ordering::Relaxed) as f64 / (stop_at - counted_from).as_secs_f64())
}

async fn many_keys(settings: &Settings, servers: &Servers, report: &mut Report) -> BenchResult {
    let mut table = Table::new(
        "(c) Many keys: K tasks, each on its own lock, acquisitions/s",
        "1 node: Lock; 5 nodes: RedLock. Each contender shares one client / manager / set of \
         connections between its tasks",
        &["limit", "rslock"],
    );
    let client = Client::new();
    for n in [1, 5] {
        let nodes = servers.nodes(n)?;
        let conns = servers.bare_connections(n).await?;
        let manager = servers.rslock(n);
        for &k in &settings.tasks {
            let name = |who: &str, i: usize| format!("bench:many:{n}:{k}:{who}:{i}");
            let ours = many_locks(
                |i| {
                    let lock = if n == 1 {
                        AnyLock::Single(client.lock(&nodes[0], name("ours", i))?)
                    } else {
                        AnyLock::Red(client.red_lock_on(&nodes, &name("ours", i))?)
                    };
                    Ok(Contender::multilock(lock))
                },
                k,
                settings.run_for,
            )
            .await?;
            let limit = many_locks(
                |i| {
                    Ok(Contender::Limit(Limit::new(
                        conns.clone(),
                        name("limit", i),
                    )))
                },
                k,
                settings.run_for,
            )
            .await?;
            let rslock = many_locks(
                |i| {
                    Ok(Contender::Rslock {
                        manager: manager.clone(),
                        resource: name("rslock", i),
                    })
                },
                k,
                settings.run_for,
            )
            .await?;
            let what = if n == 1 {
                "1 node, Lock"
            } else {
                "5 nodes, RedLock"
            };
            table.row(
                format!("{what}, K={k}"),
                Unit::PerSecond,
                Cell::of(ours),
                vec![Some(Cell::of(limit)), Some(Cell::of(rslock))],
            );
        }
    }
    report.tables.push(table);
    Ok(())
}

// ---------------------------------------------------------------------------
// (d) Scale

/// This process's resident memory, from /proc/self/status.
fn rss_kib() -> BenchResult<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS in /proc/self/status".into())
}

/// Many tasks waiting on one lock: the server's connections and this
/// process's memory while they wait, then how fast they drain.
async fn waiters(
    settings: &Settings,
    servers: &Servers,
    table: &mut Table,
    report: &mut Report,
) -> BenchResult {
    let w = settings.waiters;
    let client = Client::new();
    let node = Node::new(&servers.urls[0])?;
    let lock = client.lock(&node, "bench:waiters")?;
    let holder = lock.lock_with_lease(Duration::from_secs(300)).await?;
    let clients_before = servers.connected_clients(0).await?;
    let rss_before = rss_kib()?;
    let evalsha_before = servers.evalsha_stats(1).await?[0].calls;

    let drained = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for _ in 0..w {
        let lock = lock.clone();
        let drained = drained.clone();
        set.spawn(async move {
            lock.lock_with_lease(LEASE).await?.unlock().await?;
            drained.fetch_add(1, Ordering::Relaxed);
            BenchResult::Ok(())
        });
    }
    // Parked: every waiter made its first attempt, and no acquire came for
    // 100 ms.
    let parking = Instant::now();
    let mut last = evalsha_before;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let calls = servers.evalsha_stats(1).await?[0].calls;
        if calls - evalsha_before >= w as u64 && calls == last {
            break;
        }
        if parking.elapsed() > Duration::from_secs(30) {
            let note = format!("(d) the {w} waiters were still trying after 30 s");
            report.notes.push(note);
            break;
        }
        last = calls;
    }
    let clients_during = servers.connected_clients(0).await?;
    let subscribed = servers.subscription_connections(0).await?;
    let rss_during = rss_kib()?;

    let released = Instant::now();
    holder.unlock().await?;
    join_within(
        set,
        Duration::from_secs(if settings.smoke { 30 } else { 120 }),
    )
    .await?;
    let drain = released.elapsed();

    let label = |what: &str| format!("{} waiters on one lock: {what}", group(w as f64));
    table.row(
        label("subscription connections on the node"),
        Unit::Whole,
        Cell::of(subscribed as f64),
        vec![Some(Cell::noted(1.0, "one per node"))],
    );
    table.row(
        label("server connections added by the waiters"),
        Unit::Whole,
        Cell::of(clients_during.saturating_sub(clients_before) as f64),
        vec![Some(Cell::noted(
            (multilock::DEFAULT_POOL_SIZE + 1) as f64,
            "at most pool + subscription",
        ))],
    );
    table.row(
        label("this process's RSS growth per waiter, KiB (high-water mark of the burst)"),
        Unit::KiB,
        Cell::of(rss_during.saturating_sub(rss_before) as f64 / w as f64),
        vec![None],
    );
    table.row(
        label("drain, one grant after another (grants/s)"),
        Unit::PerSecond,
        Cell::of(w as f64 / drain.as_secs_f64()),
        vec![None],
    );
    report.subscriptions = Some((w, subscribed));
    report.notes.push(format!(
        "(d) {w} waiters: connected_clients {clients_before} before (the holder's pooled \
         connection included) → {clients_during} while waiting; RSS {rss_before} → \
         {rss_during} KiB; drained in {:.2} s.",
        drain.as_secs_f64()
    ));
    Ok(())
}

/// Many RedLocks held on 3 nodes under a short watchdog: renewal calls per
/// node per tick, then lock+unlock latency on one of those nodes meanwhile.
async fn held_under_watchdog(
    settings: &Settings,
    servers: &Servers,
    table: &mut Table,
    report: &mut Report,
) -> BenchResult {
    const NODES: usize = 3;
    let held = settings.held_locks;
    let period = settings.watchdog_timeout / 3;
    let client = Client::builder()
        .watchdog_timeout(settings.watchdog_timeout)
        .build()?;
    let nodes = servers.nodes(NODES)?;

    // Each node's renewal timer starts with its first grant, just after t0.
    let t0 = Instant::now();
    let guards: Vec<Guard> = futures::stream::iter(0..held)
        .map(|i| {
            let red = client.red_lock_on(&nodes, &format!("bench:held:{i}"));
            async move { red?.lock().await }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<multilock::Result<_>>()?;

    // Count over two periods that start half-way between ticks.
    let ticks_so_far = (t0.elapsed().as_secs_f64() / period.as_secs_f64()).ceil();
    let window_start = t0 + period.mul_f64(ticks_so_far + 0.5);
    tokio::time::sleep_until(window_start.into()).await;
    let before = servers.evalsha_stats(NODES).await?;
    tokio::time::sleep(period * 2).await;
    let after = servers.evalsha_stats(NODES).await?;
    let per_tick: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a.calls - b.calls) as f64 / 2.0)
        .collect();
    let (calls, usec) = before
        .iter()
        .zip(&after)
        .fold((0, 0), |(calls, usec), (b, a)| {
            (calls + a.calls - b.calls, usec + a.usec - b.usec)
        });
    let worst = per_tick.iter().copied().fold(0.0, f64::max);
    let expected = held.div_ceil(RENEW_BATCH_SIZE) as f64;
    table.row(
        format!(
            "{} RedLocks held on {NODES} nodes: renewal calls per node per tick (worst node)",
            group(held as f64)
        ),
        Unit::Count,
        Cell::of(worst),
        vec![Some(Cell::noted(
            expected,
            format!("locks / {RENEW_BATCH_SIZE}"),
        ))],
    );
    report.renewals = Some((held, worst, expected));
    report.notes.push(format!(
        "(d) renewal calls per tick by node: {per_tick:?} (watchdog {:?}, tick {period:?}); \
         server time per renewal call {:.0} µs: a node's round of {} calls keeps it busy \
         for {:.1} ms.",
        settings.watchdog_timeout,
        usec as f64 / calls.max(1) as f64,
        held.div_ceil(RENEW_BATCH_SIZE),
        usec as f64 / calls.max(1) as f64 * held.div_ceil(RENEW_BATCH_SIZE) as f64 / 1e3,
    ));

    // A lock+unlock under the same watchdog, on a node renewing `held` locks.
    let probe = Contender::Multilock {
        lock: AnyLock::Single(client.lock(&nodes[0], "bench:held:probe")?),
        lease: None,
    };
    let probed = time_lock_unlock_for(probe, period * 2).await?;
    let idle = report
        .uncontended
        .get(&1)
        .and_then(|(ours, _, _)| ours.get(1))
        .cloned()
        .unwrap_or_default();
    let stats: [Stat; 3] = [
        ("p50", Latencies::p50),
        ("p99", Latencies::p99),
        ("max", Latencies::max),
    ];
    for (stat, pick) in stats {
        table.row(
            format!(
                "Lock (watchdog) lock+unlock while {} locks are renewed on its node: {stat} (µs)",
                group(held as f64)
            ),
            Unit::Micros,
            Cell::of(pick(&probed)),
            vec![Some(Cell::noted(pick(&idle), "nothing held"))],
        );
    }

    let failed = futures::stream::iter(guards)
        .map(Guard::unlock)
        .buffer_unordered(64)
        .filter(|result| std::future::ready(result.is_err()))
        .count()
        .await;
    if failed > 0 {
        report.notes.push(format!(
            "(d) {failed} of {held} held RedLocks failed to unlock."
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// (e) Commands per lock+unlock

/// Commands that only the measurement itself sends.
const MEASUREMENT_COMMANDS: [&str; 3] = ["info", "echo", "monitor"];

/// A MONITOR connection to one server. MONITOR tells the commands clients
/// send from the commands scripts run (shown as coming from "lua"); INFO
/// commandstats counts both alike.
struct Monitor {
    lines: Lines<BufReader<TcpStream>>,
}

impl Monitor {
    async fn start(url: &str) -> BenchResult<Monitor> {
        let mut stream = TcpStream::connect(url.trim_start_matches("redis://")).await?;
        stream.write_all(b"MONITOR\r\n").await?;
        let mut lines = BufReader::new(stream).lines();
        match lines.next_line().await? {
            Some(line) if line == "+OK" => Ok(Monitor { lines }),
            other => Err(format!("MONITOR answered {other:?}").into()),
        }
    }

    /// Adds the commands clients sent, by name, to `sent`, up to the line
    /// that carries `marker`.
    async fn collect(mut self, marker: &str, sent: &mut BTreeMap<String, u64>) -> BenchResult {
        // `+1700000000.123456 [0 127.0.0.1:50000] "evalsha" "…" …`, or
        // `[0 lua]` for a command run by a script.
        while let Some(line) = self.lines.next_line().await? {
            if line.contains(marker) {
                return Ok(());
            }
            let Some((source, command)) = line.split_once("] ") else {
                continue;
            };
            let name = command.split('"').nth(1).unwrap_or_default().to_lowercase();
            if !source.ends_with(" lua") && !MEASUREMENT_COMMANDS.contains(&name.as_str()) {
                *sent.entry(name).or_default() += 1;
            }
        }
        Err("the MONITOR connection closed".into())
    }
}

/// Commands per lock+unlock of one contender, over all its nodes.
struct Commands {
    /// Sent on the wire (MONITOR), with the breakdown.
    sent: Cell,
    /// Executed, inside scripts included (INFO commandstats).
    executed: Cell,
    /// Server time in the commands sent (a script's includes its calls), µs.
    server_micros: f64,
}

fn per_op(calls: &BTreeMap<String, u64>, iterations: usize) -> Cell {
    let per_op = |calls: u64| calls as f64 / iterations as f64;
    let breakdown: Vec<String> = calls
        .iter()
        .map(|(command, calls)| format!("{command} {:.2}", per_op(*calls)))
        .collect();
    Cell::noted(per_op(calls.values().sum()), breakdown.join(", "))
}

/// Two passes of `iterations` lock+unlock: one counted by INFO
/// commandstats, one watched by MONITOR (which slows the server down).
async fn count_commands(
    servers: &Servers,
    n: usize,
    contender: Contender,
    iterations: usize,
) -> BenchResult<Commands> {
    // Warm: connections made, scripts loaded.
    for _ in 0..10 {
        contender.lock_unlock().await?;
    }
    let mut before = Vec::with_capacity(n);
    for node in 0..n {
        before.push(servers.command_stats(node).await?);
    }
    for _ in 0..iterations {
        contender.lock_unlock().await?;
    }
    let mut executed: BTreeMap<String, CommandStat> = BTreeMap::new();
    for (node, before) in before.iter().enumerate() {
        for (command, after) in servers.command_stats(node).await? {
            let before = before.get(&command).copied().unwrap_or_default();
            if after.calls > before.calls && !MEASUREMENT_COMMANDS.contains(&command.as_str()) {
                let total = executed.entry(command).or_default();
                total.calls += after.calls - before.calls;
                total.usec += after.usec - before.usec;
            }
        }
    }

    let mut monitors = Vec::with_capacity(n);
    for url in &servers.urls[..n] {
        monitors.push(Monitor::start(url).await?);
    }
    for _ in 0..iterations {
        contender.lock_unlock().await?;
    }
    let marker = format!("bench-marker-{}", uuid::Uuid::new_v4());
    let mut sent = BTreeMap::new();
    for (node, monitor) in monitors.into_iter().enumerate() {
        let _: String = servers.query(node, redis::cmd("ECHO").arg(&marker)).await?;
        let collected = monitor.collect(&marker, &mut sent);
        tokio::time::timeout(Duration::from_secs(10), collected)
            .await
            .map_err(|_| "MONITOR never showed the marker")??;
    }

    let server_usec: u64 = sent
        .keys()
        .filter_map(|command| executed.get(command))
        .map(|stat| stat.usec)
        .sum();
    let executed_calls = executed
        .into_iter()
        .map(|(command, stat)| (command, stat.calls))
        .collect();
    Ok(Commands {
        sent: per_op(&sent, iterations),
        executed: per_op(&executed_calls, iterations),
        server_micros: server_usec as f64 / iterations as f64,
    })
}

async fn commands(settings: &Settings, servers: &Servers, report: &mut Report) -> BenchResult {
    let mut table = Table::new(
        "(e) Redis commands per uncontended lock+unlock, all nodes together",
        "sent = what goes on the wire (MONITOR; the crate's budget is one script call per node \
         and operation); executed = INFO commandstats, which also counts the commands the \
         scripts run; server time = commandstats usec of the commands sent (a script's \
         includes the commands it runs)",
        &["limit", "rslock"],
    );
    let client = Client::new();
    let iterations = settings.command_iterations;
    for n in [1, 5] {
        let nodes = servers.nodes(n)?;
        let name = |who: &str| format!("bench:commands:{n}:{who}");
        let ours: Vec<(&str, Contender)> = if n == 1 {
            let watchdog = Contender::Multilock {
                lock: AnyLock::Single(client.lock(&nodes[0], name("watchdog"))?),
                lease: None,
            };
            vec![
                (
                    "Lock",
                    Contender::multilock(AnyLock::Single(client.lock(&nodes[0], name("lock"))?)),
                ),
                ("Lock (watchdog)", watchdog),
            ]
        } else {
            let multi = client.multi_lock_on(&nodes, &name("multi"))?;
            let red = client.red_lock_on(&nodes, &name("red"))?;
            vec![
                ("MultiLock", Contender::multilock(AnyLock::Multi(multi))),
                ("RedLock", Contender::multilock(AnyLock::Red(red))),
            ]
        };
        let conns = servers.bare_connections(n).await?;
        let limit = Contender::Limit(Limit::new(conns, name("limit")));
        let limit = count_commands(servers, n, limit, iterations).await?;
        let rslock = Contender::Rslock {
            manager: servers.rslock(n),
            resource: name("rslock"),
        };
        let rslock = count_commands(servers, n, rslock, iterations).await?;
        let nodes_label = if n == 1 {
            "1 node".to_owned()
        } else {
            format!("{n} nodes")
        };
        for (label, contender) in ours {
            let counted = count_commands(servers, n, contender, iterations).await?;
            if n == 1 && label == "Lock" {
                report.commands_1 = Some(counted.sent.value);
            }
            table.row(
                format!("{nodes_label}, {label}: sent"),
                Unit::Count,
                counted.sent,
                vec![Some(limit.sent.clone()), Some(rslock.sent.clone())],
            );
            table.row(
                format!("{nodes_label}, {label}: executed"),
                Unit::Count,
                Cell::of(counted.executed.value),
                vec![
                    Some(Cell::of(limit.executed.value)),
                    Some(Cell::of(rslock.executed.value)),
                ],
            );
            table.row(
                format!("{nodes_label}, {label}: server time (µs)"),
                Unit::Micros,
                Cell::of(counted.server_micros),
                vec![
                    Some(Cell::of(limit.server_micros)),
                    Some(Cell::of(rslock.server_micros)),
                ],
            );
        }
    }
    report.tables.push(table);
    Ok(())
}

// ---------------------------------------------------------------------------
// The report

#[derive(Clone, Copy, PartialEq, Eq)]
enum Unit {
    Micros,
    PerSecond,
    Count,
    Whole,
    KiB,
    Percent,
}

impl Unit {
    fn format(self, value: f64) -> String {
        if !value.is_finite() {
            return "–".into();
        }
        match self {
            Unit::Micros => format!("{value:.1}"),
            Unit::PerSecond => group(value),
            Unit::Count | Unit::KiB => format!("{value:.2}"),
            Unit::Percent => format!("{value:.0} %"),
            Unit::Whole => format!("{value:.0}"),
        }
    }
}

/// `12345.6` as `12,346`.
fn group(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// One value in a table, with an optional remark.
#[derive(Clone)]
struct Cell {
    value: f64,
    note: Option<String>,
}

impl Cell {
    fn of(value: f64) -> Cell {
        Cell { value, note: None }
    }

    fn noted(value: f64, note: impl Into<String>) -> Cell {
        Cell {
            value,
            note: Some(note.into()),
        }
    }

    fn render(&self, unit: Unit) -> String {
        match &self.note {
            Some(note) if !note.is_empty() => format!("{} ({note})", unit.format(self.value)),
            _ => unit.format(self.value),
        }
    }
}

struct Row {
    figure: String,
    unit: Unit,
    ours: Cell,
    refs: Vec<Option<Cell>>,
}

/// One section: each row a figure of multilock, the reference figures, and
/// multilock's value divided by each reference.
struct Table {
    title: String,
    caption: String,
    refs: Vec<String>,
    rows: Vec<Row>,
}

impl Table {
    fn new(title: &str, caption: &str, refs: &[&str]) -> Table {
        Table {
            title: title.into(),
            caption: caption.into(),
            refs: refs.iter().map(|r| (*r).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, figure: String, unit: Unit, ours: Cell, refs: Vec<Option<Cell>>) {
        self.rows.push(Row {
            figure,
            unit,
            ours,
            refs,
        });
    }

    fn markdown(&self, out: &mut String) {
        let _ = writeln!(out, "### {}\n\n{}\n", self.title, self.caption);
        out.push_str("| Figure | multilock |");
        for r in &self.refs {
            let _ = write!(out, " {r} |");
        }
        for r in &self.refs {
            let _ = write!(out, " ÷ {r} |");
        }
        out.push_str("\n|---|---:|");
        out.push_str(&"---:|".repeat(self.refs.len() * 2));
        out.push('\n');
        for row in &self.rows {
            let _ = write!(out, "| {} | {} |", row.figure, row.ours.render(row.unit));
            for cell in &row.refs {
                let shown = cell.as_ref().map_or("–".into(), |c| c.render(row.unit));
                let _ = write!(out, " {shown} |");
            }
            for cell in &row.refs {
                let _ = write!(out, " {} |", ratio(row.ours.value, cell.as_ref()));
            }
            out.push('\n');
        }
        out.push('\n');
    }
}

fn ratio(ours: f64, reference: Option<&Cell>) -> String {
    match reference {
        Some(r) if r.value > 0.0 && ours.is_finite() && r.value.is_finite() => {
            format!("{:.2}×", ours / r.value)
        }
        _ => "–".into(),
    }
}

/// Everything measured, and what the targets need from it.
#[derive(Default)]
struct Report {
    header: String,
    tables: Vec<Table>,
    notes: Vec<String>,
    panels: Vec<Panel>,
    round_trip: f64,
    /// Nodes → (multilock series in table order, limit, rslock).
    uncontended: BTreeMap<usize, (Vec<Latencies>, Latencies, Latencies)>,
    /// Case ("K=8, hand-off loop") and multilock's run.
    handoffs: Vec<(String, Contention)>,
    subscriptions: Option<(usize, usize)>,
    renewals: Option<(usize, f64, f64)>,
    commands_1: Option<f64>,
}

struct Target {
    goal: String,
    measured: String,
    met: bool,
}

impl Report {
    fn targets(&self) -> Vec<Target> {
        let mut targets = Vec::new();
        let p50 = |n: usize, i: usize| {
            self.uncontended
                .get(&n)
                .and_then(|(ours, _, _)| ours.get(i))
                .map_or(f64::NAN, Latencies::p50)
        };
        let reference = |n: usize| {
            self.uncontended
                .get(&n)
                .map(|(_, limit, rslock)| (limit.p50(), rslock.p50()))
        };
        if let Some((limit, _)) = reference(1) {
            let lock = p50(1, 0);
            targets.push(Target {
                goal: "1-node lock+unlock p50 ≤ 1.3 × the limit".into(),
                measured: format!("{lock:.1} µs vs {limit:.1} µs: {:.2}×", lock / limit),
                met: lock <= 1.3 * limit,
            });
        }
        if let Some((_, rslock5)) = reference(5) {
            let (red5, lock1) = (p50(5, 1), p50(1, 0));
            targets.push(Target {
                goal: "5-node RedLock lock+unlock p50 ≤ 2 × 1-node Lock".into(),
                measured: format!("{red5:.1} µs vs {lock1:.1} µs: {:.2}×", red5 / lock1),
                met: red5 <= 2.0 * lock1,
            });
            targets.push(Target {
                goal: "5-node RedLock ≥ 3× faster than rslock on 5 nodes (p50)".into(),
                measured: format!(
                    "rslock {rslock5:.1} µs vs {red5:.1} µs: {:.2}× faster",
                    rslock5 / red5
                ),
                met: rslock5 >= 3.0 * red5,
            });
        }
        // Only the hand-off loop's grants all go to parked waiters; in the
        // tight loop the releaser mostly takes the lock again (re-grants row).
        for (case, run) in self
            .handoffs
            .iter()
            .filter(|(case, _)| case.contains("hand-off"))
        {
            let trips = run.handoffs.p50() / self.round_trip;
            targets.push(Target {
                goal: format!("contended hand-off p50 ≤ 3 round trips ({case})"),
                measured: format!("{:.1} µs = {trips:.2} round trips", run.handoffs.p50()),
                met: trips <= 3.0,
            });
        }
        if let Some((waiters, subscribed)) = self.subscriptions {
            targets.push(Target {
                goal: format!(
                    "one subscription connection per node with {} waiters",
                    group(waiters as f64)
                ),
                measured: format!("{subscribed}"),
                met: subscribed == 1,
            });
        }
        if let Some((held, worst, expected)) = self.renewals {
            targets.push(Target {
                goal: format!(
                    "renewal calls per node per tick = ⌈locks / {RENEW_BATCH_SIZE}⌉ ({} locks)",
                    group(held as f64)
                ),
                measured: format!("{worst:.1} (expected {expected:.0})"),
                // Zero would mean the watchdog renewed nothing.
                met: worst > 0.0 && worst <= expected,
            });
        }
        if let Some(commands) = self.commands_1 {
            targets.push(Target {
                goal: "2 commands sent per uncontended 1-node lock+unlock".into(),
                measured: format!("{commands:.2}"),
                met: commands > 0.0 && commands <= 2.0,
            });
        }
        targets
    }

    fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## Benchmarks\n\n{}\n", self.header);
        for table in &self.tables {
            table.markdown(&mut out);
        }
        out.push_str("### Targets\n\n| Target | Measured | Met |\n|---|---|---|\n");
        for target in self.targets() {
            let met = if target.met { "yes" } else { "**no**" };
            let _ = writeln!(out, "| {} | {} | {met} |", target.goal, target.measured);
        }
        if !self.notes.is_empty() {
            out.push_str("\n### Notes\n\n");
            for note in &self.notes {
                let _ = writeln!(out, "- {note}");
            }
        }
        out
    }

    /// Prints the report and writes it, with the CDF plot, under target/bench.
    fn publish(&self) -> BenchResult {
        let markdown = self.markdown();
        println!("{markdown}");
        let dir = bench_dir();
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("results.md"), &markdown)?;
        std::fs::write(dir.join("latency_cdf.svg"), cdf_svg(&self.panels))?;
        eprintln!("wrote {}/results.md and latency_cdf.svg", dir.display());
        Ok(())
    }
}

fn bench_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("bench")
}

/// Date, machine, Redis and toolchain, for the README.
async fn machine_line(servers: &Servers, settings: &Settings, took: Duration) -> String {
    let command = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|| "?".into())
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .map(|name| name.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into());
    let redis = match servers.info(0, "server").await {
        Ok(info) => info
            .lines()
            .find_map(|line| line.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_owned(),
        Err(_) => "?".into(),
    };
    format!(
        "{} · {cpu}, {cores} cores, load average {load} at the end · Linux {} · redis-server \
         {redis} on loopback ({SERVERS} processes on the same machine) · {} · {} run, {:.0} s · \
         `cargo bench --bench locks`",
        command("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        command("uname", &["-r"]),
        command("rustc", &["--version"]),
        settings.name(),
        took.as_secs_f64(),
    )
}

// ---------------------------------------------------------------------------
// The CDF plot, hand-written SVG

struct Panel {
    title: String,
    series: Vec<(String, Latencies)>,
}

impl Panel {
    fn new(title: String) -> Panel {
        Panel {
            title,
            series: Vec::new(),
        }
    }

    fn add(&mut self, label: String, latencies: Latencies) {
        if !latencies.0.is_empty() {
            self.series.push((label, latencies));
        }
    }
}

/// Colour and dash of a series, by contender.
fn style(label: &str, index: usize) -> (&'static str, &'static str) {
    const OURS: [&str; 3] = ["#1f77b4", "#2ca02c", "#9467bd"];
    if label.starts_with("the limit") {
        ("#555555", "6 4")
    } else if label.starts_with("rslock tuned") {
        ("#ff7f0e", "2 3")
    } else if label.starts_with("rslock") {
        ("#d62728", "none")
    } else {
        (OURS[index % OURS.len()], "none")
    }
}

/// Latency CDFs, two panels per row, log-scale latency axis.
fn cdf_svg(panels: &[Panel]) -> String {
    const PANEL_W: f64 = 480.0;
    const PANEL_H: f64 = 390.0;
    const LEFT: f64 = 56.0;
    const RIGHT: f64 = 16.0;
    const TOP: f64 = 34.0;
    /// Axis labels, then one legend row per series (at most four).
    const BOTTOM: f64 = 44.0 + 4.0 * 15.0 + 10.0;
    let rows = panels.len().div_ceil(2).max(1);
    let (width, height) = (PANEL_W * 2.0, PANEL_H * rows as f64);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for (i, panel) in panels.iter().enumerate() {
        let (ox, oy) = ((i % 2) as f64 * PANEL_W, (i / 2) as f64 * PANEL_H);
        let (x0, y0) = (ox + LEFT, oy + TOP);
        let (w, h) = (PANEL_W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM);
        // Every series from its 0.1 % point to its 99.9 % point, with a margin.
        let lo = panel
            .series
            .iter()
            .map(|(_, l)| l.quantile(0.001))
            .fold(f64::INFINITY, f64::min)
            .max(1.0)
            / 1.15;
        let hi = panel
            .series
            .iter()
            .map(|(_, l)| l.quantile(0.999))
            .fold(0.0, f64::max)
            .max(lo * 2.0)
            * 1.15;
        let (log_lo, log_hi) = (lo.log10(), hi.log10());
        let x = |us: f64| x0 + (us.clamp(lo, hi).log10() - log_lo) / (log_hi - log_lo) * w;
        let y = |q: f64| y0 + (1.0 - q) * h;

        let _ = writeln!(
            svg,
            "<text x=\"{x0}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">{}</text>",
            oy + 20.0,
            xml_escape(&panel.title)
        );
        for q in [0.25, 0.5, 0.75] {
            let _ = writeln!(
                svg,
                "<line x1=\"{x0}\" x2=\"{}\" y1=\"{yq}\" y2=\"{yq}\" stroke=\"#eee\"/>",
                x0 + w,
                yq = y(q)
            );
        }
        for q in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let _ = writeln!(
                svg,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{q:.2}</text>",
                x0 - 6.0,
                y(q) + 4.0
            );
        }
        // Grid at 1, 2, 5 × 10^k (finer on a narrow axis); labels on all of
        // them unless there are too many.
        let steps: &[f64] = if log_hi - log_lo < 1.5 {
            &[1.0, 1.5, 2.0, 3.0, 5.0, 7.0]
        } else {
            &[1.0, 2.0, 5.0]
        };
        let ticks: Vec<f64> = (log_lo.floor() as i32..=log_hi.ceil() as i32)
            .flat_map(|decade| steps.iter().map(move |step| step * 10f64.powi(decade)))
            .filter(|us| (lo..=hi).contains(us))
            .collect();
        for &us in &ticks {
            let decade = (us.log10().fract()).abs() < 1e-9;
            let xt = x(us);
            let stroke = if decade { "#ccc" } else { "#eee" };
            let _ = writeln!(
                svg,
                "<line x1=\"{xt}\" x2=\"{xt}\" y1=\"{y0}\" y2=\"{}\" stroke=\"{stroke}\"/>",
                y0 + h
            );
            if decade || ticks.len() <= 8 {
                let _ = writeln!(
                    svg,
                    "<text x=\"{xt}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                    y0 + h + 14.0,
                    micros_label(us)
                );
            }
        }
        let _ = writeln!(
            svg,
            "<rect x=\"{x0}\" y=\"{y0}\" width=\"{w}\" height=\"{h}\" fill=\"none\" \
             stroke=\"#999\"/>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">latency (log scale)</text>",
            x0 + w / 2.0,
            y0 + h + 32.0
        );

        // Curves, then the legend under the axis.
        let (lx, ly) = (x0, y0 + h + 40.0);
        for (s, (label, latencies)) in panel.series.iter().enumerate() {
            let (colour, dash) = style(label, s);
            let points: Vec<String> = (0..=400)
                .map(|step| step as f64 / 400.0 * 0.999)
                .map(|q| format!("{:.1},{:.1}", x(latencies.quantile(q)), y(q)))
                .collect();
            let _ = writeln!(
                svg,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.6\" \
                 stroke-dasharray=\"{dash}\" points=\"{}\"/>",
                points.join(" ")
            );
        }
        for (s, (label, latencies)) in panel.series.iter().enumerate() {
            let (colour, dash) = style(label, s);
            let row = ly + 12.0 + s as f64 * 15.0;
            let _ = writeln!(
                svg,
                "<line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"{colour}\" \
                 stroke-width=\"2\" stroke-dasharray=\"{dash}\"/>\n\
                 <text x=\"{}\" y=\"{row}\">{} (p50 {:.0} µs)</text>",
                lx + 6.0,
                lx + 26.0,
                row - 4.0,
                row - 4.0,
                lx + 32.0,
                xml_escape(label),
                latencies.p50()
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn micros_label(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{} ms", us / 1e3)
    } else {
        format!("{us} µs")
    }
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
