//! (e) Redis commands per uncontended lock+unlock: sent on the wire
//! (MONITOR), executed including the commands scripts run (INFO
//! commandstats), and the server time they take. Then the commands sent
//! per contended acquisition: K tasks on one lock, in the loops of (b).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use multilock::{Client, Node, Owner};
use multilock_testkit::protocol;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::contended::{Pace, contend};
use crate::contenders::{AnyLock, Contender, Limit, Protocol};
use crate::report::{Cell, Report, Table, Unit};
use crate::{BenchResult, CONTENDED_TASKS, CommandStat, Servers, Settings};

/// Every contender's commands on 1 and 5 nodes.
pub async fn commands(settings: &Settings, servers: &Servers, report: &mut Report) -> BenchResult {
    let mut table = Table::new(
        "(e) Redis commands per uncontended lock+unlock, all nodes together",
        &format!(
            "sent = what goes on the wire (MONITOR; the crate's budget is one script call per \
             node and operation); executed = INFO commandstats, which also counts the commands \
             the scripts run; server time = commandstats usec of the commands sent (a script's \
             includes the commands it runs); the limits send Redisson 3.24+'s scripts (and \
             its DEL of the unlock latch) or the crate's own{SENT_BREAKDOWN}"
        ),
        &["Redisson 3.24+", "crate scripts", "rslock"],
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
        let mut references = Vec::new();
        for (who, protocol) in [("redisson", Protocol::Redisson), ("crate", Protocol::Crate)] {
            let limit = Contender::Limit(Limit::new(conns.clone(), name(who), protocol));
            references.push(count_commands(servers, n, limit, iterations).await?);
        }
        let rslock = Contender::Rslock {
            manager: servers.rslock(n),
            resource: name("rslock"),
        };
        references.push(count_commands(servers, n, rslock, iterations).await?);
        let nodes_label = if n == 1 {
            "1 node".to_owned()
        } else {
            format!("{n} nodes")
        };
        for (label, contender) in ours {
            let counted = count_commands(servers, n, contender, iterations).await?;
            if n == 1 && label == "Lock" {
                let sent = counted.sent.value;
                report.target(
                    "(e)",
                    "2 commands sent per uncontended 1-node lock+unlock",
                    format!(
                        "{sent:.2} (Redisson 3.24+: {:.2})",
                        references[0].sent.value
                    ),
                    sent > 0.0 && sent <= 2.0,
                );
            }
            let refs =
                |pick: fn(&Commands) -> Cell| references.iter().map(|r| Some(pick(r))).collect();
            table.row(
                format!("{nodes_label}, {label}: sent"),
                Unit::Count,
                counted.sent.clone(),
                refs(|c| c.sent.clone()),
            );
            table.row(
                format!("{nodes_label}, {label}: executed"),
                Unit::Count,
                Cell::of(counted.executed.value),
                refs(|c| Cell::of(c.executed.value)),
            );
            table.row(
                format!("{nodes_label}, {label}: server time (µs)"),
                Unit::Micros,
                Cell::of(counted.server_micros),
                refs(|c| Cell::of(c.server_micros)),
            );
        }
    }
    report.tables.push(table);
    Ok(())
}

/// Per K tasks on one lock (1 node), the commands sent per acquisition:
/// multilock's Lock in the hand-off and the tight loop of (b), and rslock
/// with its default retries in the same loops, each run under MONITOR.
pub async fn contended_commands(
    settings: &Settings,
    servers: &Servers,
    report: &mut Report,
) -> BenchResult {
    let k = CONTENDED_TASKS;
    let mut table = Table::new(
        &format!("(e) Redis commands sent per contended acquisition: K={k} tasks on one lock"),
        &format!(
            "1 node; multilock Lock and rslock (default retries) in the loops of (b), each run \
             for {} ms under MONITOR, after an unwatched run of a fifth of that which opened the \
             connections. Counted: every command a client sends (acquire attempts, releases; \
             rslock also releases after each failed attempt; the subscription connection's \
             SUBSCRIBE, UNSUBSCRIBE and PING), divided by the grants: in the steady state, from \
             the end of the run's warm-up tenth to its end, as the other contended figures are; \
             and over the whole run, from its start (tasks arriving at once at a lock nobody \
             waits on yet) to the end of its last task (the drain). By acquisition: the calls \
             that name the acquisitions granted in that window (every acquire has an owner of \
             its own, in the hash field of its attempts, its release and any rollback), \
             wherever they fell, with the window's commands that name none (SUBSCRIBE, \
             UNSUBSCRIBE, PING), per grant: the window's edges cut acquisitions in two (a \
             grant in it whose failed attempt came before it opened, attempts at its end whose \
             grants come after it: a few commands either way, a hundredth of the figure in a \
             short run), this count does not; the attempts of a waiter still waiting at the \
             window's end go to its grant after it (the whole run has them all). rslock's calls \
             name no acquisition (a fresh value per try). Not counted: the commands scripts run (PUBLISH, HSET, ...). MONITOR slows \
             the server, so the loops run a little slower than in (b){}",
            settings.run_for.as_millis() * 4,
            SENT_BREAKDOWN
        ),
        &["rslock"],
    );
    let client = Client::new();
    let node = Node::new(&servers.urls[0])?;
    for (pace, loop_name) in [
        (Pace::HandOff, "hand-off loop"),
        (Pace::Tight, "tight loop"),
    ] {
        let case = format!("K={k}, {loop_name}");
        let name = |who: &str| format!("bench:contended-commands:{loop_name}:{who}");
        let ours = Contender::multilock(AnyLock::Single(client.lock(&node, name("multilock"))?));
        // Four runs' length: the window's edges (a grant counted whose
        // attempt came before it opened, ...) weigh a quarter as much in
        // the window's figure (the count by acquisition has none).
        let run_for = settings.run_for * 4;
        let ours = count_contended(servers, &ours, k, run_for, pace).await?;
        let rslock = Contender::Rslock {
            manager: servers.rslock(1),
            resource: name("rslock"),
        };
        let rslock = count_contended(servers, &rslock, k, run_for, pace).await?;
        let exact = ours
            .by_acquisition
            .clone()
            .ok_or("MONITOR: the crate's calls did not name every acquisition counted")?;
        table.row(
            format!("{case}: sent per acquisition, steady state"),
            Unit::Count,
            ours.steady.clone(),
            vec![Some(rslock.steady.clone())],
        );
        table.row(
            format!("{case}: sent per acquisition, steady state, by acquisition"),
            Unit::Count,
            exact.clone(),
            vec![None],
        );
        table.row(
            format!("{case}: acquisitions in the steady state"),
            Unit::Whole,
            Cell::of(ours.counted as f64),
            vec![Some(Cell::of(rslock.counted as f64))],
        );
        table.row(
            format!("{case}: sent per acquisition, whole run"),
            Unit::Count,
            ours.whole.clone(),
            vec![Some(rslock.whole.clone())],
        );
        table.row(
            format!("{case}: acquisitions in the whole run"),
            Unit::Whole,
            Cell::of(ours.grants as f64),
            vec![Some(Cell::of(rslock.grants as f64))],
        );
        if pace == Pace::HandOff {
            report.target(
                "(e)",
                format!(
                    "≤ 3 commands sent per contended acquisition ({case}, steady state, by \
                     acquisition)"
                ),
                format!(
                    "{} = {:.4}; in the window {:.4} (rslock {}); whole run, its start and \
                     drain included: {:.4}",
                    exact.render(Unit::Count),
                    exact.value,
                    ours.steady.value,
                    rslock.steady.render(Unit::Count),
                    ours.whole.value
                ),
                // Exact: no edge to round away.
                exact.value > 0.0 && exact.value <= 3.0,
            );
        }
    }
    report.tables.push(table);
    Ok(())
}

/// What a breakdown of the commands sent shows, for a table's caption.
const SENT_BREAKDOWN: &str = ". In brackets: the commands sent, each per operation; EVALSHA \
     is split by the crate's script it names (acquire, release, ...), another script's \
     EVALSHA (rslock's release) is plain evalsha";

/// Commands sent per acquisition while K tasks fight over one lock.
struct ContendedCount {
    /// Over the whole run, its start and drain included, per grant.
    whole: Cell,
    /// Over the counted window (the run after its warm-up tenth), per
    /// grant in that window.
    steady: Cell,
    /// The commands of the acquisitions granted in the window, wherever
    /// they fell, with the window's commands that name none, per grant:
    /// exact, where the window's edges cut acquisitions in two (`None`:
    /// the contender's calls name no acquisition).
    by_acquisition: Option<Cell>,
    grants: u64,
    counted: usize,
}

/// K tasks on one lock for `run_for` under MONITOR, after a short
/// unwatched run that makes the connections (the subscription's too).
async fn count_contended(
    servers: &Servers,
    contender: &Contender,
    tasks: usize,
    run_for: Duration,
    pace: Pace,
) -> BenchResult<ContendedCount> {
    contend(contender, tasks, run_for / 5, pace).await?;
    let monitor = Monitor::start(&servers.urls[0]).await?;
    let marker = format!("bench-marker-{}", uuid::Uuid::new_v4());
    let collector = monitor.collect(marker.clone());
    // Marks the run's counted window (after its warm-up tenth, up to its
    // end) in the MONITOR stream, on the clock `contend` uses.
    let start = Instant::now();
    let mut admin = servers.admin[0].clone();
    let window = tokio::spawn(async move {
        for (at, open) in [(start + run_for / 10, true), (start + run_for, false)] {
            tokio::time::sleep_until(at.into()).await;
            let echo = redis::cmd("ECHO").arg(window_marker(&marker, open)).clone();
            let _: String = echo.query_async(&mut admin).await?;
        }
        BenchResult::Ok(marker)
    });
    let run = contend(contender, tasks, run_for, pace).await?;
    let marker = window.await??;
    let sent = finish(servers, 0, &marker, collector).await?;
    // Only the crate's calls name their acquisition: each counted grant's
    // (its attempts, its release) are found, or none is.
    let named = |owner: &Owner| sent.by_owner.contains_key(owner.as_str());
    let by_acquisition = (run.counted > 0
        && run.counted_owners.len() == run.counted
        && run.counted_owners.iter().all(named))
    .then(|| per_op(&sent.of_acquisitions(&run.counted_owners), run.counted));
    Ok(ContendedCount {
        whole: per_op(&sent.whole, run.grants as usize),
        steady: per_op(&sent.window, run.counted),
        by_acquisition,
        grants: run.grants,
        counted: run.counted,
    })
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

    /// Counts the commands clients send, by name, up to the line that
    /// carries `marker`, in a task of its own: reading while the commands
    /// go keeps the server's buffer for this connection small. EVALSHA is
    /// counted by the crate's script it names (`evalsha acquire`).
    /// Commands between the lines that carry [`window_marker`]`(marker,
    /// true)` and `(marker, false)` are counted apart as well.
    fn collect(mut self, marker: String) -> JoinHandle<BenchResult<Sent>> {
        let scripts: BTreeMap<String, &str> = protocol::scripts()
            .into_iter()
            .map(|(name, _, sha)| (sha, name))
            .collect();
        let (open, close) = (window_marker(&marker, true), window_marker(&marker, false));
        tokio::spawn(async move {
            let mut sent = Sent::default();
            let mut in_window = false;
            // `+1700000000.123456 [0 127.0.0.1:50000] "evalsha" "<sha>" …`,
            // or `[0 lua]` for a command run by a script.
            while let Some(line) = self.lines.next_line().await? {
                if line.contains(&open) || line.contains(&close) {
                    in_window = line.contains(&open);
                    continue;
                }
                if line.contains(&marker) {
                    return Ok(sent);
                }
                let Some((source, command)) = line.split_once("] ") else {
                    continue;
                };
                let mut quoted = command.split('"').skip(1).step_by(2);
                let mut name = quoted.next().unwrap_or_default().to_lowercase();
                if source.ends_with(" lua") || MEASUREMENT_COMMANDS.contains(&name.as_str()) {
                    continue;
                }
                let mut owner = None;
                if name == "evalsha"
                    && let Some(script) = quoted.next().and_then(|sha| scripts.get(sha))
                {
                    name = format!("evalsha {script}");
                    // `"<numkeys>" <keys> <args>`: the field, then its owner.
                    let keys = quoted.next().and_then(|n| n.parse::<usize>().ok());
                    owner = keys
                        .zip(field_argument(script))
                        .and_then(|(keys, arg)| quoted.nth(keys + arg))
                        .and_then(|field| field.split_once(':'))
                        .map(|(_client, owner)| owner.to_owned());
                }
                if in_window {
                    *sent.window.entry(name.clone()).or_default() += 1;
                    if owner.is_none() {
                        *sent.window_unnamed.entry(name.clone()).or_default() += 1;
                    }
                }
                if let Some(owner) = owner {
                    let calls = sent.by_owner.entry(owner).or_default();
                    *calls.entry(name.clone()).or_default() += 1;
                }
                *sent.whole.entry(name).or_default() += 1;
            }
            Err("the MONITOR connection closed".into())
        })
    }
}

/// Commands sent, by name: up to the end marker, and within the window.
/// The crate's acquire, release and rollback calls also by the owner they
/// name; the window's other commands (SUBSCRIBE, UNSUBSCRIBE, PING, another
/// contender's) apart.
#[derive(Default)]
struct Sent {
    whole: BTreeMap<String, u64>,
    window: BTreeMap<String, u64>,
    by_owner: HashMap<String, BTreeMap<String, u64>>,
    window_unnamed: BTreeMap<String, u64>,
}

impl Sent {
    /// The commands of the acquisitions of `owners` wherever they fell
    /// (the attempts before the window of a grant in it, the release after
    /// it of one at its end), and the window's commands that name no
    /// acquisition.
    fn of_acquisitions(&self, owners: &[Owner]) -> BTreeMap<String, u64> {
        let mut calls = self.window_unnamed.clone();
        for owner in owners {
            for (command, n) in self.by_owner.get(owner.as_str()).into_iter().flatten() {
                *calls.entry(command.clone()).or_default() += n;
            }
        }
        calls
    }
}

/// The position in ARGV (from 0) of the hash field `<client-uuid>:<owner>`
/// in the crate's reentrant lock calls that name an acquisition.
fn field_argument(script: &str) -> Option<usize> {
    match script {
        "acquire" => Some(1),
        "release" | "rollback" => Some(0),
        _ => None,
    }
}

/// The marker that opens (or closes) the counted window of `marker`'s run.
fn window_marker(marker: &str, open: bool) -> String {
    format!("{marker}:window-{}", if open { "open" } else { "close" })
}

/// Ends a [`Monitor::collect`] on server `node`: sends the marker, and
/// returns what the collector counted up to it.
async fn finish(
    servers: &Servers,
    node: usize,
    marker: &str,
    collector: JoinHandle<BenchResult<Sent>>,
) -> BenchResult<Sent> {
    let _: String = servers.query(node, redis::cmd("ECHO").arg(marker)).await?;
    tokio::time::timeout(Duration::from_secs(10), collector)
        .await
        .map_err(|_| "MONITOR never showed the marker")??
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

    let marker = format!("bench-marker-{}", uuid::Uuid::new_v4());
    let mut collectors = Vec::with_capacity(n);
    for url in &servers.urls[..n] {
        collectors.push(Monitor::start(url).await?.collect(marker.clone()));
    }
    for _ in 0..iterations {
        contender.lock_unlock().await?;
    }
    let mut sent = BTreeMap::new();
    for (node, collector) in collectors.into_iter().enumerate() {
        for (command, calls) in finish(servers, node, &marker, collector).await?.whole {
            *sent.entry(command).or_default() += calls;
        }
    }

    // `evalsha acquire` and `evalsha release` are both `evalsha` there.
    let sent_commands: BTreeSet<&str> = sent
        .keys()
        .filter_map(|command| command.split(' ').next())
        .collect();
    let server_usec: u64 = sent_commands
        .into_iter()
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
