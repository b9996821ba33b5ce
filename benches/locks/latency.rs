//! (g) What a user at a distance from the servers feels: every server behind
//! the test kit's latency proxy at 0.2, 0.5 and 1 ms one-way delay (and at
//! none), where this machine's CPU no longer hides the protocol's round
//! trips. Uncontended lock+unlock of the 1-node Lock and the 5-node RedLock
//! against the Redisson 3.24+ limit through the same proxies, and the
//! contended hand-off against that limit's cycle.

use std::fmt::Write as _;
use std::time::Duration;

use multilock::{Client, Node};
use multilock_testkit::{Delay, Direction, TcpProxy};

use crate::contended::{Pace, contend};
use crate::contenders::{AnyLock, Contender, Limit, Protocol, time_lock_unlock_for};
use crate::report::{Grid, Report};
use crate::stats::median;
use crate::{BenchResult, CONTENDED_TASKS, SERVERS, Servers, Settings, bare_connection};

/// The one-way delays the targets are judged at.
const TARGET_DELAY: Duration = Duration::from_micros(500);

/// One delay's figures (µs, p50 unless said).
struct AtDelay {
    delay: Duration,
    lock: f64,
    red_lock: f64,
    limit_1: f64,
    limit_5: f64,
    handoff: f64,
}

impl AtDelay {
    /// The ratios the chart and the targets show, with their chart marks.
    fn ratios(&self) -> [(char, &'static str, f64); 4] {
        [
            (
                'R',
                "5-node RedLock ÷ 1-node Lock",
                self.red_lock / self.lock,
            ),
            (
                'L',
                "1-node Lock ÷ Redisson 3.24+ limit",
                self.lock / self.limit_1,
            ),
            (
                '5',
                "5-node RedLock ÷ 5-node limit",
                self.red_lock / self.limit_5,
            ),
            (
                'H',
                "hand-off ÷ the limit's cycle",
                self.handoff / self.limit_1,
            ),
        ]
    }
}

/// Every delay of the settings, each server behind its own proxy.
pub async fn latency(settings: &Settings, servers: &Servers, report: &mut Report) -> BenchResult {
    let mut proxies = Vec::with_capacity(SERVERS);
    for server in &servers.processes {
        proxies.push(TcpProxy::start(server.port()).await?);
    }
    let urls: Vec<String> = proxies.iter().map(TcpProxy::url).collect();
    let nodes = urls
        .iter()
        .map(|url| Node::new(url))
        .collect::<multilock::Result<Vec<_>>>()?;
    let client = Client::new();
    let mut conns = Vec::with_capacity(SERVERS);
    for url in &urls {
        conns.push(bare_connection(url).await?);
    }

    let mut measured = Vec::new();
    for &delay in &settings.proxy_delays {
        for proxy in &proxies {
            proxy.set_delay(Direction::Both, Delay::fixed(delay));
        }
        let at = |what: &str| format!("bench:latency:{}:{what}", delay.as_micros());
        let contenders = [
            Contender::multilock(AnyLock::Single(client.lock(&nodes[0], at("lock"))?)),
            Contender::multilock(AnyLock::Red(client.red_lock_on(&nodes, at("red"))?)),
            Contender::Limit(Limit::new(
                conns[..1].to_vec(),
                at("limit-1"),
                Protocol::Redisson,
            )),
            Contender::Limit(Limit::new(conns.clone(), at("limit-5"), Protocol::Redisson)),
        ];
        // Rounds that take turns, so drift hits every contender alike; each
        // contender's median of its rounds' p50s.
        let mut p50s = [const { Vec::new() }; 4];
        for _ in 0..settings.proxy_rounds.0 {
            for (contender, p50s) in contenders.iter().zip(&mut p50s) {
                let timed =
                    time_lock_unlock_for(contender.clone(), settings.proxy_rounds.1).await?;
                p50s.push(timed.p50());
            }
        }
        let [lock, red_lock, limit_1, limit_5] = p50s.each_ref().map(|p50s| median(p50s));
        let waiters = Contender::multilock(AnyLock::Single(client.lock(&nodes[0], at("handoff"))?));
        let contention =
            contend(&waiters, CONTENDED_TASKS, settings.run_for, Pace::HandOff).await?;
        measured.push(AtDelay {
            delay,
            lock,
            red_lock,
            limit_1,
            limit_5,
            handoff: contention.handoffs.p50(),
        });
    }
    for proxy in &proxies {
        proxy.set_delay(Direction::Both, Delay::NONE);
    }

    let mut grid = Grid::new(
        "(g) At a distance: every server behind a latency proxy",
        &format!(
            "Each of the {SERVERS} servers behind its own in-process proxy (the test kit's \
             `TcpProxy`) adding the delay each way; every contender connects through them. \
             Uncontended lock+unlock p50 (µs): {} rounds of {} ms per contender, taking turns, \
             the median of the rounds; the limits send Redisson 3.24+'s scripts (and its DEL of \
             the unlock latch). Hand-off: K={CONTENDED_TASKS} hand-off loop of (b) on one node, \
             from the `unlock()` call to the next grant, p50",
            settings.proxy_rounds.0,
            settings.proxy_rounds.1.as_millis()
        ),
        &[
            "one-way delay",
            "1-node Lock",
            "Redisson limit, 1 node",
            "5-node RedLock",
            "Redisson limit, 5 nodes",
            "hand-off",
            "RedLock ÷ Lock",
            "Lock ÷ limit",
            "RedLock ÷ 5-node limit",
            "hand-off ÷ limit cycle",
        ],
    );
    for at in &measured {
        let ratios = at.ratios();
        grid.row(vec![
            format!("{} ms", at.delay.as_secs_f64() * 1e3),
            format!("{:.0}", at.lock),
            format!("{:.0}", at.limit_1),
            format!("{:.0}", at.red_lock),
            format!("{:.0}", at.limit_5),
            format!("{:.0}", at.handoff),
            format!("{:.2}×", ratios[0].2),
            format!("{:.2}×", ratios[1].2),
            format!("{:.2}×", ratios[2].2),
            format!("{:.2}×", ratios[3].2),
        ]);
    }
    report.grids.push(grid);
    report.charts.push(chart(&measured));
    if let Some(at) = measured.iter().find(|at| at.delay == TARGET_DELAY) {
        let ratios = at.ratios();
        // Issue 39 restated this target: held against the 1-node Lock
        // (≤ 1.1 ×), the 5-node limit itself missed it on 2 cores, where
        // five servers and the client share the cores. A RedLock is held
        // to what the same fan-out costs a bare connection; the ratio to
        // the 1-node Lock stays in the grid.
        report.target(
            "(g)",
            "at 0.5 ms one-way: 5-node RedLock ≤ 1.05 × the 5-node Redisson 3.24+ limit (p50)",
            format!(
                "{:.0} µs vs {:.0} µs: {:.2}× (÷ 1-node Lock {:.2}×; the limit's own 5-node ÷ \
                 1-node {:.2}×)",
                at.red_lock,
                at.limit_5,
                ratios[2].2,
                ratios[0].2,
                at.limit_5 / at.limit_1
            ),
            ratios[2].2 <= 1.05,
        );
        report.target(
            "(g)",
            "at 0.5 ms one-way: contended hand-off p50 ≤ 2 × the Redisson 3.24+ cycle",
            format!(
                "{:.0} µs vs 2 × {:.0} µs: {:.2}×",
                at.handoff, at.limit_1, ratios[3].2
            ),
            ratios[3].2 <= 2.0,
        );
    }
    Ok(())
}

/// The ratios against the delay, as text: one column per delay, one mark
/// per ratio (its letter), a row per 0.1×.
fn chart(measured: &[AtDelay]) -> String {
    const TOP: f64 = 2.5;
    const STEP: f64 = 0.1;
    const WIDTH: usize = 14;
    let mut out = String::from("(g) ratios (y) against the one-way delay (x)\n\n");
    let rows = (TOP / STEP).round() as usize;
    for row in (0..=rows).rev() {
        let y = row as f64 * STEP;
        let label = if row % 5 == 0 {
            format!("{y:>4.1}× |")
        } else {
            "      |".to_owned()
        };
        out.push_str(&label);
        for at in measured {
            let mut cell = String::new();
            for (mark, _, ratio) in at.ratios() {
                let shown = ratio.min(TOP);
                if (shown / STEP).round() as usize == row {
                    cell.push(mark);
                }
            }
            let _ = write!(out, "{cell:^WIDTH$}");
        }
        out.push('\n');
    }
    let _ = writeln!(out, "      +{}", "-".repeat(WIDTH * measured.len()));
    out.push_str("       ");
    for at in measured {
        let x = format!("{} ms", at.delay.as_secs_f64() * 1e3);
        let _ = write!(out, "{x:^WIDTH$}");
    }
    out.push_str("\n\n");
    if let Some(at) = measured.first() {
        for (mark, what, _) in at.ratios() {
            let _ = writeln!(out, "  {mark}  {what}");
        }
    }
    let _ = write!(out, "  (a ratio above {TOP}× is drawn at {TOP}×)");
    out.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}
