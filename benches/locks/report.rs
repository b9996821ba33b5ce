//! The report: every section's table, the targets and the notes, as
//! markdown under `target/bench`, with the latency CDFs beside it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use multilock::testkit::protocol::RENEW_BATCH_SIZE;

use crate::contended::{ContendedCase, Pace};
use crate::contenders::Latencies;
use crate::degraded::DegradedRun;
use crate::latency_cdf::{Panel, cdf_svg};
use crate::many_keys::median;
use crate::{BenchResult, CONTENDED_TASKS, SERVERS, Servers, Settings};

/// Everything measured, and what the targets need from it.
#[derive(Default)]
pub struct Report {
    pub header: String,
    pub tables: Vec<Table>,
    /// Tables with columns of their own, after the others.
    pub grids: Vec<Grid>,
    pub notes: Vec<String>,
    pub panels: Vec<Panel>,
    pub round_trip: f64,
    /// Nodes → (multilock series in table order, limit, rslock).
    pub uncontended: BTreeMap<usize, (Vec<Latencies>, Latencies, Latencies)>,
    /// The contended cases, multilock's and rslock's runs.
    pub handoffs: Vec<ContendedCase>,
    /// Many-keys case ("5 nodes, RedLock, K=8") → (multilock, the limit),
    /// acquisitions per second.
    pub many_keys: Vec<(String, f64, f64)>,
    /// The many-keys case with a target (1 node, K=64).
    pub many_keys_target: Option<ManyKeysTarget>,
    /// Commands sent per contended acquisition, per loop.
    pub contended_commands: Vec<ContendedCommands>,
    pub subscriptions: Option<(usize, usize)>,
    pub renewals: Option<(usize, f64, f64)>,
    pub commands_1: Option<f64>,
    /// (f): the healthy state and the degraded ones.
    pub degraded: Vec<DegradedRun>,
}

/// The many-keys case with a target: acquisitions per second, each
/// contender's median over the rounds.
pub struct ManyKeysTarget {
    /// "1 node, Lock, K=64".
    pub case: String,
    pub ours: f64,
    pub limit: f64,
    pub rslock: f64,
    /// multilock ÷ the limit in each round.
    pub ratios: Vec<f64>,
}

/// Commands sent per contended acquisition in one loop, with the breakdown
/// by command.
pub struct ContendedCommands {
    /// "K=8, hand-off loop".
    pub case: String,
    pub pace: Pace,
    /// In the steady state.
    pub ours: Cell,
    pub rslock: Cell,
    /// Over the whole run, its start and drain included.
    pub ours_whole: Cell,
}

struct Target {
    /// "(a)" to "(f)".
    section: &'static str,
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
                section: "(a)",
                goal: "1-node lock+unlock p50 ≤ 1.3 × the limit".into(),
                measured: format!("{lock:.1} µs vs {limit:.1} µs: {:.2}×", lock / limit),
                met: lock <= 1.3 * limit,
            });
        }
        if let Some((_, rslock5)) = reference(5) {
            let (red5, lock1) = (p50(5, 1), p50(1, 0));
            targets.push(Target {
                section: "(a)",
                goal: "5-node RedLock lock+unlock p50 ≤ 2 × 1-node Lock".into(),
                measured: format!("{red5:.1} µs vs {lock1:.1} µs: {:.2}×", red5 / lock1),
                met: red5 <= 2.0 * lock1,
            });
            targets.push(Target {
                section: "(a)",
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
        // Without (a) there is no round trip to count in.
        let hand_offs = self
            .handoffs
            .iter()
            .filter(|case| case.pace == Pace::HandOff && self.round_trip > 0.0);
        for ContendedCase { case, ours, .. } in hand_offs.clone() {
            let trips = ours.handoffs.p50() / self.round_trip;
            targets.push(Target {
                section: "(b)",
                goal: format!("contended hand-off p50 ≤ 3 round trips ({case})"),
                measured: format!("{:.1} µs = {trips:.2} round trips", ours.handoffs.p50()),
                met: trips <= 3.0,
            });
        }
        if let Some((limit, _)) = reference(1) {
            for ContendedCase {
                case, ours, rslock, ..
            } in hand_offs.filter(|case| case.tasks == CONTENDED_TASKS)
            {
                let (mean, rslock) = (ours.handoffs.mean(), rslock.handoffs.mean());
                targets.push(Target {
                    section: "(b)",
                    goal: format!(
                        "mean contended hand-off ≤ 2 × the limit's 1-node lock+unlock p50 \
                         ({case})"
                    ),
                    measured: format!(
                        "{mean:.1} µs vs {limit:.1} µs: {:.2}× (rslock default {rslock:.1} µs)",
                        mean / limit
                    ),
                    met: mean <= 2.0 * limit,
                });
            }
        }
        if let Some(run) = &self.many_keys_target {
            // Rounds that a burst of other work hit on one side only are
            // far off; the median of the paired rounds is not moved by them.
            let mut ratios = run.ratios.clone();
            ratios.sort_by(f64::total_cmp);
            let ratio = median(&ratios);
            let quartile = |q: f64| {
                let rank = (q * ratios.len() as f64).ceil() as usize;
                ratios.get(rank.clamp(1, ratios.len().max(1)) - 1).copied()
            };
            let spread = match (quartile(0.25), quartile(0.75)) {
                (Some(low), Some(high)) if ratios.len() >= 4 => {
                    format!(", middle half of the rounds {low:.2}–{high:.2}×")
                }
                _ => String::new(),
            };
            targets.push(Target {
                section: "(c)",
                goal: format!(
                    "many keys ({}) ≥ 0.95 × the limit (its tasks on one multiplexed connection)",
                    run.case
                ),
                measured: format!(
                    "{}/s vs {}/s, rslock {}/s (medians of {} rounds); multilock ÷ the limit, \
                     median of the rounds: {ratio:.2}×{spread}",
                    group(run.ours),
                    group(run.limit),
                    group(run.rslock),
                    run.ratios.len(),
                ),
                met: ratio >= 0.95,
            });
        }
        if let Some((waiters, subscribed)) = self.subscriptions {
            targets.push(Target {
                section: "(d)",
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
                section: "(d)",
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
                section: "(e)",
                goal: "2 commands sent per uncontended 1-node lock+unlock".into(),
                measured: format!("{commands:.2}"),
                met: commands > 0.0 && commands <= 2.0,
            });
        }
        for run in self
            .contended_commands
            .iter()
            .filter(|run| run.pace == Pace::HandOff)
        {
            targets.push(Target {
                section: "(e)",
                goal: format!(
                    "≤ 3 commands sent per contended acquisition ({}, steady state)",
                    run.case
                ),
                measured: format!(
                    "{} = {:.4} (rslock {}); whole run, its start and drain included: {:.4}",
                    run.ours.render(Unit::Count),
                    run.ours.value,
                    run.rslock.render(Unit::Count),
                    run.ours_whole.value
                ),
                // As printed, to two decimals: the window's edges add or
                // drop a command or two (a release of a grant made before
                // it opened), a few thousandths of the figure.
                met: run.ours.value > 0.0 && (run.ours.value * 100.0).round() <= 300.0,
            });
        }
        if let Some(healthy) = self.degraded.iter().find(|run| !run.impaired) {
            let (p50, sections) = (healthy.ours.latencies.p50(), healthy.sections as f64);
            for run in self.degraded.iter().filter(|run| run.impaired) {
                let ours = run.ours.latencies.p50();
                targets.push(Target {
                    section: "(f)",
                    goal: format!("5-node RedLock p50 with {} ≤ 1.5 × healthy", run.state),
                    measured: format!("{ours:.1} µs vs {p50:.1} µs: {:.2}×", ours / p50),
                    met: ours <= 1.5 * p50,
                });
                let ours = run.sections as f64;
                targets.push(Target {
                    section: "(f)",
                    goal: format!(
                        "critical sections of 6 contenders with {} ≥ 0.8 × healthy",
                        run.state
                    ),
                    measured: format!(
                        "{} vs {}: {:.2}×",
                        group(ours),
                        group(sections),
                        ours / sections
                    ),
                    met: ours >= 0.8 * sections,
                });
            }
        }
        targets
    }

    fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## Benchmarks\n\n{}\n", self.header);
        for table in &self.tables {
            table.markdown(&mut out);
        }
        for grid in &self.grids {
            grid.markdown(&mut out);
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

    /// The headline of each section, a line each: the targets, met or
    /// not, and (c)'s worst case, which has no target.
    fn summary(&self, run: &str, results: &Path, plot: &Path) -> String {
        let targets = self.targets();
        let met = targets.iter().filter(|target| target.met).count();
        let mut lines: Vec<(&str, String)> = targets
            .iter()
            .map(|target| {
                let verdict = if target.met { "met " } else { "MISS" };
                let line = format!(
                    "{verdict}  {} {}: {}",
                    target.section, target.goal, target.measured
                );
                (target.section, line)
            })
            .collect();
        let worst_many_keys = self
            .many_keys
            .iter()
            .min_by(|(_, a, a_limit), (_, b, b_limit)| (a / a_limit).total_cmp(&(b / b_limit)));
        if let Some((case, ours, limit)) = worst_many_keys {
            let line = format!(
                "  –   (c) many keys, lowest of {} cases ({case}): {}/s = {:.2}× the limit \
                 (no target here; DESIGN §7 asks ≥ 0.95×)",
                self.many_keys.len(),
                group(*ours),
                ours / limit
            );
            lines.push(("(c)", line));
        }
        lines.sort_by_key(|(section, _)| *section);

        let mut out = format!(
            "multilock benchmarks, {run}: {met} of {} targets met\n\n",
            targets.len()
        );
        for (_, line) in lines {
            let _ = writeln!(out, "{line}");
        }
        let _ = write!(
            out,
            "\nfull report: {}\nlatency CDFs: {}",
            results.display(),
            plot.display()
        );
        out
    }

    /// Writes the report and the CDF plot under target/bench, and prints
    /// the summary. `run` says which run it was ("full run, 104 s").
    pub fn publish(&self, run: &str) -> BenchResult {
        let dir = bench_dir();
        let (results, plot) = (dir.join("results.md"), dir.join("latency_cdf.svg"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(&results, self.markdown())?;
        std::fs::write(&plot, cdf_svg(&self.panels))?;
        println!("{}", self.summary(run, &results, &plot));
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
pub async fn machine_line(servers: &Servers, settings: &Settings, took: Duration) -> String {
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
    let only = settings.only.as_ref().map_or(String::new(), |only| {
        format!("MULTILOCK_BENCH_ONLY={} ", only.join(","))
    });
    format!(
        "{} · {cpu}, {cores} cores, load average {load} at the end · Linux {} · redis-server \
         {redis} on loopback ({SERVERS} processes on the same machine) · {} · {} run, {:.0} s · \
         `{only}cargo bench --bench locks`",
        command("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        command("uname", &["-r"]),
        command("rustc", &["--version"]),
        settings.name(),
        took.as_secs_f64(),
    )
}

// ---------------------------------------------------------------------------
// Tables

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Unit {
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
pub fn group(value: f64) -> String {
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
pub struct Cell {
    pub value: f64,
    note: Option<String>,
}

impl Cell {
    pub fn of(value: f64) -> Cell {
        Cell { value, note: None }
    }

    pub fn noted(value: f64, note: impl Into<String>) -> Cell {
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
pub struct Table {
    title: String,
    caption: String,
    refs: Vec<String>,
    rows: Vec<Row>,
}

impl Table {
    pub fn new(title: &str, caption: &str, refs: &[&str]) -> Table {
        Table {
            title: title.into(),
            caption: caption.into(),
            refs: refs.iter().map(|r| (*r).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, figure: String, unit: Unit, ours: Cell, refs: Vec<Option<Cell>>) {
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

/// A table with columns of its own: a header, then rows of cells already
/// formatted.
pub struct Grid {
    title: String,
    caption: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Grid {
    pub fn new(title: &str, caption: &str, header: &[&str]) -> Grid {
        Grid {
            title: title.into(),
            caption: caption.into(),
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn markdown(&self, out: &mut String) {
        let _ = writeln!(out, "### {}\n\n{}\n", self.title, self.caption);
        let _ = writeln!(out, "| {} |", self.header.join(" | "));
        let _ = writeln!(out, "|---|{}", "---:|".repeat(self.header.len() - 1));
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        out.push('\n');
    }
}
