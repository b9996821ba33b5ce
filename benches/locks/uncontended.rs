//! (a) Uncontended lock+unlock on 1, 3 and 5 nodes: the latency of each
//! contender, and the CPU each lock+unlock uses in this process and on the
//! servers.

use std::time::{Duration, Instant};

use multilock::Client;
use redis::aio::MultiplexedConnection;

use crate::contenders::{AnyLock, Contender, Limit, Protocol};
use crate::latency_cdf::Panel;
use crate::report::{Cell, Report, Table, Unit};
use crate::stats::{Latencies, STATS, nanos};
use crate::{BenchResult, SERVERS, Servers, Settings, cpu_seconds};

/// The references every multilock series is shown beside.
const REFERENCES: [&str; 3] = ["Redisson 3.24+", "crate scripts", "rslock"];

/// Uncontended lock+unlock on 1, 3 and 5 nodes. Returns the Redisson 3.24+
/// limit's 1-node lock+unlock p50 (µs): the cycle hand-offs are held to.
pub async fn uncontended(
    settings: &Settings,
    servers: &Servers,
    report: &mut Report,
) -> BenchResult<f64> {
    let client = Client::new();
    let nodes = servers.nodes(SERVERS)?;
    let mut table = Table::new(
        "(a) Uncontended lock+unlock, µs",
        "multilock with a 30 s lease unless marked watchdog; rslock `lock` + `unlock`; the \
         limits: a bare connection per node sending Redisson 3.24+'s acquire and unlock (and \
         its DEL of the unlock latch, not awaited, each node's once its unlock replied), or \
         the crate's own script calls (fanned out to all nodes at once when there are several)",
        &REFERENCES,
    );
    let mut cpu_table = Table::new(
        "(a) Uncontended: CPU per lock+unlock",
        "CPU used per lock+unlock by this process (all threads, /proc/self/task/*/schedstat) \
         and by the servers in use (sum of INFO cpu, network work included); cores busy = \
         both ÷ the mean latency. Near the machine's core count, the latency is bound by \
         CPU, not by the network",
        &REFERENCES,
    );
    let mut cycle = f64::NAN;
    let mut lock_p50 = f64::NAN;
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
            let multi = client.multi_lock_on(&nodes[..n], name("multi"))?;
            ours.push((
                "MultiLock".into(),
                Contender::multilock(AnyLock::Multi(multi)),
            ));
            let red = client.red_lock_on(&nodes[..n], name("red"))?;
            ours.push(("RedLock".into(), Contender::multilock(AnyLock::Red(red))));
        }
        let conns = servers.bare_connections(n).await?;
        let redisson = Limit::new(conns.clone(), name("redisson"), Protocol::Redisson);
        let crate_scripts = Limit::new(conns, name("crate"), Protocol::Crate);
        let rslock = Contender::Rslock {
            manager: servers.rslock(n),
            resource: name("rslock"),
        };
        let mut contenders: Vec<Contender> = ours.iter().map(|(_, c)| c.clone()).collect();
        contenders.extend([
            Contender::Limit(redisson),
            Contender::Limit(crate_scripts),
            rslock,
        ]);
        let mut timed = time_lock_unlock(
            contenders,
            CpuMeter::new(servers, n),
            settings.warmup,
            settings.iterations,
            settings.rounds,
        )
        .await?;
        let references: Vec<Timed> = timed.split_off(ours.len());
        let nodes_label = if n == 1 {
            "1 node".to_owned()
        } else {
            format!("{n} nodes")
        };
        cpu_rows(
            &mut cpu_table,
            &nodes_label,
            ours.iter().map(|(label, _)| label.as_str()).zip(&timed),
            &references,
        );
        let limit = references[0].latencies.p50();
        let red_lock = ours.iter().position(|(label, _)| label == "RedLock");
        if n == 1 {
            cycle = limit;
            lock_p50 = timed[0].latencies.p50();
            report.target(
                "(a)",
                "1-node lock+unlock p50 ≤ 1.05 × the Redisson 3.24+ limit",
                format!(
                    "{lock_p50:.1} µs vs {limit:.1} µs: {:.2}× (crate scripts {:.1} µs)",
                    lock_p50 / limit,
                    references[1].latencies.p50()
                ),
                lock_p50 <= 1.05 * limit,
            );
        }
        if let (true, Some(red)) = (n == SERVERS, red_lock.and_then(|i| timed.get(i))) {
            report.notes.push(cpu_floor_note(
                &format!("{nodes_label}, RedLock"),
                red,
                lock_p50,
            ));
            let red5 = red.latencies.p50();
            let rslock5 = references[2].latencies.p50();
            report.target(
                "(a)",
                "5-node RedLock lock+unlock p50 ≤ 1.05 × the 5-node Redisson 3.24+ limit",
                format!("{red5:.1} µs vs {limit:.1} µs: {:.2}×", red5 / limit),
                red5 <= 1.05 * limit,
            );
            report.target(
                "(a)",
                "5-node RedLock lock+unlock p50 ≤ 2 × 1-node Lock",
                format!("{red5:.1} µs vs {lock_p50:.1} µs: {:.2}×", red5 / lock_p50),
                red5 <= 2.0 * lock_p50,
            );
            report.target(
                "(a)",
                "5-node RedLock ≥ 3× faster than rslock on 5 nodes (p50)",
                format!(
                    "rslock {rslock5:.1} µs vs {red5:.1} µs: {:.2}× faster",
                    rslock5 / red5
                ),
                rslock5 >= 3.0 * red5,
            );
        }

        let mut panel = Panel::new(format!("Uncontended lock+unlock, {nodes_label}"));
        for ((label, _), timed) in ours.iter().zip(&timed) {
            for (stat, pick) in STATS {
                table.row(
                    format!("{nodes_label}, {label}: {stat}"),
                    Unit::Micros,
                    Cell::of(pick(&timed.latencies)),
                    references
                        .iter()
                        .map(|r| Some(Cell::of(pick(&r.latencies))))
                        .collect(),
                );
            }
            panel.add(format!("multilock {label}"), timed.latencies.clone());
        }
        panel.add(
            "the limit (Redisson 3.24+)".into(),
            references[0].latencies.clone(),
        );
        panel.add("rslock".into(), references[2].latencies.clone());
        report.panels.push(panel);
    }
    report.tables.push(table);
    report.tables.push(cpu_table);
    Ok(cycle)
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
    references: &[Timed],
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
                references.iter().map(|r| Some(Cell::of(pick(r)))).collect(),
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Timing and CPU metering

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
    /// Meters the CPU of this process and of the first `n` servers.
    fn new(servers: &Servers, n: usize) -> CpuMeter {
        CpuMeter {
            servers: servers.admin[..n].to_vec(),
        }
    }

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
/// program's /proc readings): the client's CPU, read around a run.
pub fn process_cpu() -> BenchResult<Duration> {
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
