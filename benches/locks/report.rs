//! The report: every section's tables, targets, charts and notes, as
//! markdown under `target/bench`, with the latency CDFs beside it. A leaf:
//! the sections fill it in, and it knows none of them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::latency_cdf::{Panel, cdf_svg};

/// Everything measured, as the sections wrote it down.
#[derive(Default)]
pub struct Report {
    pub header: String,
    pub tables: Vec<Table>,
    /// Tables with columns of their own, after the others.
    pub grids: Vec<Grid>,
    /// Text charts (a code block each), after the tables.
    pub charts: Vec<String>,
    pub notes: Vec<String>,
    pub panels: Vec<Panel>,
    targets: Vec<Target>,
}

/// One target, judged by the section that measured it.
struct Target {
    /// "(a)" to "(h)".
    section: &'static str,
    goal: String,
    measured: String,
    met: bool,
}

impl Report {
    /// Records target `goal` of `section` ("(a)"...), with what was
    /// measured and whether that meets it.
    pub fn target(
        &mut self,
        section: &'static str,
        goal: impl Into<String>,
        measured: impl Into<String>,
        met: bool,
    ) {
        self.targets.push(Target {
            section,
            goal: goal.into(),
            measured: measured.into(),
            met,
        });
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
        for chart in &self.charts {
            let _ = writeln!(out, "```text\n{}\n```\n", chart.trim_end());
        }
        out.push_str("### Targets\n\n| Target | Measured | Met |\n|---|---|---|\n");
        for target in self.sorted_targets() {
            let met = if target.met { "yes" } else { "**no**" };
            let _ = writeln!(
                out,
                "| {} {} | {} | {met} |",
                target.section, target.goal, target.measured
            );
        }
        if !self.notes.is_empty() {
            out.push_str("\n### Notes\n\n");
            for note in &self.notes {
                let _ = writeln!(out, "- {note}");
            }
        }
        out
    }

    /// The targets in section order (stable within a section).
    fn sorted_targets(&self) -> Vec<&Target> {
        let mut targets: Vec<&Target> = self.targets.iter().collect();
        targets.sort_by_key(|target| target.section);
        targets
    }

    /// The targets, a line each, met or not.
    fn summary(&self, run: &str, results: &Path, plot: &Path) -> String {
        let targets = self.sorted_targets();
        let met = targets.iter().filter(|target| target.met).count();
        let mut out = format!(
            "multilock benchmarks, {run}: {met} of {} targets met\n\n",
            targets.len()
        );
        for target in targets {
            let verdict = if target.met { "met " } else { "MISS" };
            let _ = writeln!(
                out,
                "{verdict}  {} {}: {}",
                target.section, target.goal, target.measured
            );
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
    pub fn publish(&self, run: &str) -> std::io::Result<()> {
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

    pub fn render(&self, unit: Unit) -> String {
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
