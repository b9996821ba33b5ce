//! Lock benchmarks: multilock against rslock and against "the limit".
//!
//! ```text
//! cargo bench --bench locks                            # full run, about 5 minutes
//! MULTILOCK_BENCH_SMOKE=1 cargo bench --bench locks    # smoke run, a few seconds (CI)
//! cargo bench --bench locks -- --smoke                 # the same
//! MULTILOCK_BENCH_ONLY=degraded cargo bench --bench locks  # some sections only
//! ```
//!
//! `MULTILOCK_BENCH_ONLY` takes a comma-separated list of sections:
//! `uncontended`, `contended`, `many_keys`, `scale`, `commands`, `latency`,
//! `read_write`, `cluster`, `degraded`. With `RUST_LOG` set
//! (`RUST_LOG=multilock=debug`), the crate's tracing goes to stderr: a
//! timeline of rounds, subscriptions and node health.
//!
//! The program starts its own `redis-server` processes (five; the 1- and
//! 3-node figures use the first one and the first three) and measures every
//! contender on the same processes in the same run:
//!
//! - **multilock**: this crate's `Lock`, `MultiLock` and `RedLock`;
//! - **the limit**: one bare redis-rs `MultiplexedConnection` per node sending
//!   **Redisson 3.24+'s** reentrant lock protocol, written from its wire facts
//!   (`multilock_testkit::redisson`): the acquire script, the unlock script
//!   that reads and writes its latch, and the `DEL` of the latch that
//!   Redisson's client sends after the unlock replied, without waiting. It is
//!   the protocol a Redisson-compatible lock competes with. On one node the
//!   calls go one after the other; on several, each goes to all nodes at once
//!   (`join_all`);
//! - **the crate's scripts**: the same bare connections sending the crate's
//!   own script calls (`multilock_testkit::protocol`): the cost of the
//!   crate's protocol alone, without its client;
//! - **rslock** 0.10: the Rust Redlock peer (`SET NX PX` to acquire, a
//!   compare-and-delete script to release, retries instead of waiting).
//!
//! The servers' CPU per operation (`INFO cpu` before and after) is printed
//! beside the figures: the lock must not cost Redis more than Redisson does.
//!
//! What is measured, in order:
//!
//! - (a) uncontended lock+unlock latency on 1, 3 and 5 nodes, and the CPU
//!   each lock+unlock uses in this process and on the servers;
//! - (b) one contended lock: K tasks acquire and release it in a loop, either
//!   tight (the releaser races the waiters: throughput and fairness) or
//!   handing off (hold 1 ms, then step back: every grant goes to a waiter).
//!   The hand-off is the time from one holder's `unlock()` call to the next
//!   holder's grant, both read from one monotonic clock; rslock runs with its
//!   default retries and with the best retry delay of a sweep;
//! - (c) many keys: K tasks on K different locks, acquisitions per second and
//!   the CPU per acquisition of this process (the client's) and of the
//!   servers (1 node, K=64: in rounds, the contenders taking turns; the
//!   Redisson limit also on a connection with redis-rs's defaults, without
//!   `TCP_NODELAY`), and K readers of one read-write lock against that rate
//!   and against K readers sending Redisson's read-lock scripts;
//! - (d) scale: server connections and this process's memory with 10,000
//!   tasks waiting on one lock; watchdog renewal calls per node per tick with
//!   10,000 locks held, and the latency of a lock+unlock meanwhile;
//! - (e) Redis commands per uncontended lock+unlock: sent on the wire
//!   (MONITOR), executed including the commands scripts run (`INFO
//!   commandstats`), and the server time they take; then the commands sent
//!   per contended acquisition, K tasks on one lock in the loops of (b);
//! - (g) at a distance: every server behind the test kit's latency proxy at
//!   0, 0.2, 0.5 and 1 ms one-way delay: the 1-node Lock, the 5-node RedLock
//!   and the Redisson limit, and the hand-off; with a chart of the ratios;
//! - (h) the read-write lock: the write-after-readers hand-off (8 readers
//!   release one after another, a writer waits; from the last `unlock()`
//!   call to the writer's grant) against Redisson's read unlock + write
//!   acquire on a bare connection; and K=64 readers of one name against K
//!   tasks on their own locks with the server 0.5 and 1 ms away (the proxy);
//! - (i) a Redis Cluster (the test kit's, 3 primaries and 3 replicas, started
//!   for the section; feature `cluster`, which the dev-dependencies enable):
//!   `Node::cluster` against a bare redis-rs `ClusterConnection` sending the
//!   crate's scripts (release with `spublish`), one task's lock+unlock
//!   latency and 64 tasks' lock+unlock per second;
//! - (f) degraded: a 5-node RedLock healthy, then with 1 and 2 servers frozen
//!   (SIGSTOP) and 2 dead (killed): uncontended latency, critical sections
//!   of 6 contenders, and rslock on the same servers. Last, since it stops,
//!   kills and restarts servers.
//!
//! Each measurement has its own file (`uncontended`, `contended`,
//! `many_keys`, `scale`, `wire_commands`, `latency`, `read_write`,
//! `cluster`, `degraded`), and judges its own targets; `contenders` puts the
//! contenders behind one interface; `stats` holds the latency samples.
//! `report` (with `latency_cdf`) is a leaf the sections write into: tables,
//! targets, charts and notes. This file holds the settings, the servers
//! and the run order.
//!
//! The full report goes to `target/bench/results.md`, the latency CDFs to
//! `target/bench/latency_cdf.svg` (both under `$CARGO_TARGET_DIR` when set);
//! stdout gets a summary: every target, met or missed, and where the report
//! is.

#[cfg(feature = "cluster")]
mod cluster;
mod contended;
mod contenders;
mod degraded;
mod latency;
mod latency_cdf;
mod many_keys;
mod read_write;
mod report;
mod scale;
mod stats;
mod uncontended;
mod wire_commands;

use std::collections::BTreeMap;
use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use multilock::Node;
use multilock_testkit::{RedisProcess, TestServer};
use redis::FromRedisValue;
use redis::aio::MultiplexedConnection;

use crate::report::Report;

type BenchResult<T = ()> = Result<T, Box<dyn Error + Send + Sync>>;

/// Lease of every acquisition (multilock's lease, rslock's TTL, the
/// limit's): far longer than any run, so nothing expires.
const LEASE: Duration = Duration::from_secs(30);
/// Server processes started; the 1- and 3-node cases use the first ones.
const SERVERS: usize = 5;
/// Tasks on one lock in the contended figures with targets: the mean
/// hand-off (b) and the commands per contended acquisition (e).
const CONTENDED_TASKS: usize = 8;
/// Tasks, each on its own lock, in the many-keys figure with a target (c).
const MANY_KEYS_TASKS: usize = 64;

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("benchmark failed: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> BenchResult {
    let settings = Settings::from_env()?;
    let started = Instant::now();
    eprintln!(
        "starting {SERVERS} redis-server processes ({} run)",
        settings.name()
    );
    let mut servers = Servers::start(SERVERS).await?;
    let mut report = Report::default();

    let progress = |step: &str| eprintln!("[{:6.1} s] {step}", started.elapsed().as_secs_f64());
    // The Redisson 3.24+ limit's 1-node lock+unlock p50, µs: the cycle a
    // hand-off is held to.
    let mut cycle = f64::NAN;
    if settings.runs("uncontended") {
        progress("(a) uncontended lock+unlock");
        cycle = uncontended::uncontended(&settings, &servers, &mut report).await?;
    }
    if settings.runs("contended") {
        progress("(b) contended hand-off");
        contended::contended(&settings, &servers, cycle, &mut report).await?;
    }
    if settings.runs("many_keys") {
        progress("(c) many keys");
        many_keys::many_keys(&settings, &servers, &mut report).await?;
    }
    if settings.runs("scale") {
        progress("(d) scale: waiters, then locks held under the watchdog");
        scale::scale(&settings, &servers, &mut report).await?;
    }
    if settings.runs("commands") {
        progress("(e) commands per lock+unlock");
        wire_commands::commands(&settings, &servers, &mut report).await?;
        progress("(e) commands per contended acquisition");
        wire_commands::contended_commands(&settings, &servers, &mut report).await?;
    }
    if settings.runs("latency") {
        progress("(g) at a distance: servers behind latency proxies");
        latency::latency(&settings, &servers, &mut report).await?;
    }
    if settings.runs("read_write") {
        progress("(h) read-write lock: write after readers, readers at a distance");
        read_write::read_write(&settings, &servers, &mut report).await?;
    }
    if settings.runs("cluster") {
        #[cfg(feature = "cluster")]
        {
            progress("(i) Redis Cluster: Node::cluster against a bare ClusterConnection");
            cluster::cluster(&settings, &mut report).await?;
        }
        #[cfg(not(feature = "cluster"))]
        progress("(i) Redis Cluster: skipped, the `cluster` feature is off");
    }
    if settings.runs("degraded") {
        progress("(f) degraded: nodes frozen and dead");
        degraded::degraded(&settings, &mut servers, &mut report).await?;
    }

    progress("done");
    let took = started.elapsed();
    report.header = machine_line(&servers, &settings, took).await;
    report.publish(&format!(
        "{} run, {:.0} s",
        settings.name(),
        took.as_secs_f64()
    ))?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Settings

/// The sections, as `MULTILOCK_BENCH_ONLY` names them, in run order.
const SECTIONS: [&str; 9] = [
    "uncontended",
    "contended",
    "many_keys",
    "scale",
    "commands",
    "latency",
    "read_write",
    "cluster",
    "degraded",
];

/// How much to measure: the full run, or the smoke run CI does.
struct Settings {
    smoke: bool,
    /// The sections to run (`MULTILOCK_BENCH_ONLY`; all when unset).
    only: Option<Vec<String>>,
    /// Uncontended lock+unlock: untimed warm-up per contender, then timed
    /// iterations split into rounds that alternate between the contenders, so
    /// that drift in the machine's state hits every contender alike. Short
    /// rounds (50 lock+unlock each in the full run): this VM's wake-up
    /// latency drifts by 10–20 % over seconds, and rounds of 500 let one
    /// contender's batch land in a slow spell and another's in a fast one.
    warmup: usize,
    iterations: usize,
    rounds: usize,
    /// Task counts K of the contended and many-keys cases, and how long each
    /// case runs (its first tenth is a warm-up, not counted).
    tasks: Vec<usize>,
    run_for: Duration,
    /// Rounds, and how long each runs, of the many-keys case with a target
    /// (1 node, [`MANY_KEYS_TASKS`]): multilock, the limit and rslock take
    /// turns, so that drift in the machine's state hits all three alike.
    many_keys_rounds: (usize, Duration),
    /// Rounds, and how long each runs, of K readers of one read-write lock
    /// against the read scripts' limit. More than the many-keys case's: a
    /// round's rate spreads ±15 % here (the server's cost per read follows
    /// how many readers hold at that moment), so 12 rounds put the median
    /// anywhere in 0.93–1.03× for two contenders that run alike.
    readers_rounds: (usize, Duration),
    /// Runs of the K=8 hand-off loop, each held to the hand-off target.
    handoff_runs: usize,
    /// Rounds of the read-write lock's write-after-readers hand-off (h).
    rw_handoff_rounds: usize,
    /// (g): the one-way delays the proxies add, and the rounds (how many,
    /// how long each) of each contender's uncontended lock+unlock.
    proxy_delays: Vec<Duration>,
    proxy_rounds: (usize, Duration),
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
    /// Degraded states: how long the contenders run, and rslock's time for
    /// its uncontended calls (a frozen server makes each one slow).
    degraded_window: Duration,
}

impl Settings {
    fn from_env() -> BenchResult<Settings> {
        let smoke = std::env::var("MULTILOCK_BENCH_SMOKE").is_ok_and(|v| !v.is_empty() && v != "0")
            || std::env::args().any(|arg| arg == "--smoke");
        let only = match std::env::var("MULTILOCK_BENCH_ONLY") {
            Ok(list) if !list.trim().is_empty() => {
                let only: Vec<String> = list.split(',').map(|s| s.trim().to_owned()).collect();
                if let Some(unknown) = only.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                    return Err(format!(
                        "MULTILOCK_BENCH_ONLY: no section {unknown:?} (sections: {})",
                        SECTIONS.join(", ")
                    )
                    .into());
                }
                Some(only)
            }
            _ => None,
        };
        Ok(if smoke {
            Settings {
                smoke,
                only,
                warmup: 20,
                iterations: 200,
                rounds: 2,
                tasks: vec![CONTENDED_TASKS, MANY_KEYS_TASKS],
                run_for: Duration::from_millis(150),
                many_keys_rounds: (2, Duration::from_millis(150)),
                readers_rounds: (2, Duration::from_millis(150)),
                handoff_runs: 1,
                rw_handoff_rounds: 40,
                proxy_delays: vec![Duration::from_micros(500)],
                proxy_rounds: (1, Duration::from_millis(100)),
                rslock_delays: vec![Duration::from_millis(1)],
                waiters: 500,
                held_locks: 1_200,
                watchdog_timeout: Duration::from_millis(300),
                command_iterations: 50,
                degraded_window: Duration::from_millis(300),
            }
        } else {
            Settings {
                smoke,
                only,
                warmup: 300,
                iterations: 4_000,
                rounds: 80,
                tasks: vec![CONTENDED_TASKS, MANY_KEYS_TASKS],
                run_for: Duration::from_millis(1500),
                many_keys_rounds: (12, Duration::from_millis(500)),
                readers_rounds: (36, Duration::from_millis(500)),
                handoff_runs: 3,
                rw_handoff_rounds: 1_000,
                proxy_delays: [0, 200, 500, 1_000].map(Duration::from_micros).to_vec(),
                proxy_rounds: (4, Duration::from_millis(400)),
                rslock_delays: [1, 5, 20].map(Duration::from_millis).to_vec(),
                waiters: 10_000,
                held_locks: 10_000,
                watchdog_timeout: Duration::from_secs(3),
                command_iterations: 500,
                degraded_window: Duration::from_secs(3),
            }
        })
    }

    fn name(&self) -> &'static str {
        if self.smoke { "smoke" } else { "full" }
    }

    /// Whether section `name` (one of [`SECTIONS`]) runs.
    fn runs(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|s| s == name))
    }
}

// ---------------------------------------------------------------------------
// The servers

/// The redis-server processes every contender runs against, with one admin
/// connection to each for INFO and PING (it sends nothing else).
struct Servers {
    urls: Vec<String>,
    admin: Vec<MultiplexedConnection>,
    /// Killed when dropped.
    processes: Vec<RedisProcess>,
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
            processes,
        })
    }

    /// Freezes server `node` (SIGSTOP): its connections stay open and it
    /// answers nothing.
    async fn pause(&mut self, node: usize) -> BenchResult {
        Ok(self.processes[node].pause().await?)
    }

    async fn unpause(&mut self, node: usize) -> BenchResult {
        Ok(self.processes[node].unpause().await?)
    }

    /// Kills server `node`: connections to it are refused.
    async fn kill(&mut self, node: usize) -> BenchResult {
        Ok(TestServer::kill(&mut self.processes[node]).await?)
    }

    /// Starts server `node` again on its port, empty, with a new admin
    /// connection.
    async fn restart(&mut self, node: usize) -> BenchResult {
        self.processes[node].restart().await?;
        let client = redis::Client::open(self.urls[node].as_str())?;
        self.admin[node] = client.get_multiplexed_async_connection().await?;
        Ok(())
    }

    async fn ping(&self, node: usize) -> BenchResult {
        let _: String = self.query(node, &redis::cmd("PING")).await?;
        Ok(())
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

    /// The first `n` servers' CPU time (user + system, seconds), summed.
    async fn cpu_seconds_of(&self, n: usize) -> BenchResult<f64> {
        let mut total = 0.0;
        for node in 0..n {
            total += self.cpu_seconds(node).await?;
        }
        Ok(total)
    }

    /// The limit's connections to the first `n` servers: RESP3, like the
    /// crate's.
    async fn bare_connections(&self, n: usize) -> BenchResult<Vec<MultiplexedConnection>> {
        let mut conns = Vec::with_capacity(n);
        for url in &self.urls[..n] {
            conns.push(bare_connection(url).await?);
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

/// A bare connection to `url`, as the limits use them: RESP3, and
/// TCP_NODELAY (as Redisson's Netty channels and the crate's connections).
async fn bare_connection(url: &str) -> BenchResult<MultiplexedConnection> {
    let info = redis::IntoConnectionInfo::into_connection_info(format!("{url}/?protocol=resp3"))?
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    Ok(redis::Client::open(info)?
        .get_multiplexed_async_connection()
        .await?)
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

/// How an idle core waits, when the kernel says: on a virtual machine whose
/// idle cores halt at once (`haltpoll` with no guest halt polling), every
/// wake-up of an idle core costs an exit to the host, and the latency
/// figures weigh those more than the client's own work (`BENCHMARKS.md`,
/// 2026-12-01 afternoon).
fn idle_line() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_owned())
    };
    let Some(driver) = read("/sys/devices/system/cpu/cpuidle/current_driver") else {
        return String::new();
    };
    match read("/sys/module/haltpoll/parameters/guest_halt_poll_ns") {
        Some(ns) => format!(" · idle: {driver}, guest halt polling {ns} ns"),
        None => format!(" · idle: {driver}"),
    }
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
    let idle = idle_line();
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
    let only = settings.only.as_ref().map_or(String::new(), |only| {
        format!("MULTILOCK_BENCH_ONLY={} ", only.join(","))
    });
    format!(
        "{} · {cpu}, {cores} cores, load average {load} at the end{idle} · Linux {} · redis-server \
         {redis} on loopback ({SERVERS} processes on the same machine) · {} · {} run, {:.0} s · \
         `{only}cargo bench --bench locks`",
        command("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        command("uname", &["-r"]),
        command("rustc", &["--version"]),
        settings.name(),
        took.as_secs_f64(),
    )
}
