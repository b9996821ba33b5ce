//! (e) Redis commands per uncontended lock+unlock: sent on the wire
//! (MONITOR), executed including the commands scripts run (INFO
//! commandstats), and the server time they take.

use std::collections::BTreeMap;
use std::time::Duration;

use multilock::Client;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;

use crate::contenders::{AnyLock, Contender, Limit};
use crate::report::{Cell, Report, Table, Unit};
use crate::{BenchResult, CommandStat, Servers, Settings};

/// Every contender's commands on 1 and 5 nodes.
pub async fn commands(settings: &Settings, servers: &Servers, report: &mut Report) -> BenchResult {
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
            let multi = client.multi_lock_on(&nodes, name("multi"))?;
            let red = client.red_lock_on(&nodes, name("red"))?;
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
