//! The results: a table on stdout and a timeline grid as SVG.

use std::fmt::Write as _;
use std::time::Duration;

use multilock::testkit::Backend;

use crate::scenarios::{Cell, Exclusion, Scenario};
use crate::topology::Kind;

pub fn cell_text(cell: &Cell) -> String {
    match cell {
        Cell::Done(o, ..) => {
            let exclusion = match o.exclusion {
                Exclusion::Kept => "kept",
                Exclusion::Lost => "LOST",
                Exclusion::Fenced => "fenced",
                Exclusion::Refused => "A refused",
            };
            let available = if o.available { "yes" } else { "no" };
            let time = o
                .time_to_acquire
                .map_or("—".to_owned(), |d| format!("{} ms", d.as_millis()));
            format!("{exclusion} / {available} / {time}")
        }
        Cell::NotApplicable(why) => format!("n/a ({why})"),
        Cell::Failed(_) => "failed".to_owned(),
    }
}

pub fn print_table(results: &[(Scenario, Vec<Cell>)]) {
    let first = 30;
    let width = 26;
    let mut out = format!("{:<first$}", "scenario");
    for kind in Kind::ALL {
        let _ = write!(out, "| {:<width$}", kind.title());
    }
    out.push('\n');
    out.push_str(&"-".repeat(first));
    for _ in Kind::ALL {
        let _ = write!(out, "+{}", "-".repeat(width + 1));
    }
    out.push('\n');
    for (scenario, cells) in results {
        let _ = write!(out, "{:<first$}", scenario.title());
        for cell in cells {
            let _ = write!(out, "| {:<width$}", cell_text(cell));
        }
        out.push('\n');
    }
    println!("{out}");
    println!(
        "cells: mutual exclusion (kept / LOST: two holders at once / fenced: two holders, the \
         stale write rejected by its fencing token / A refused: the first client never got it) \
         / lock available to the second client / its \
         time to acquire (while the first held it, or after the first let go)"
    );
    for (scenario, cells) in results {
        for (kind, cell) in Kind::ALL.iter().zip(cells) {
            match cell {
                Cell::Done(_, _, notes) => {
                    for note in notes {
                        println!("  {} / {}: {note}", scenario.title(), kind.title());
                    }
                }
                Cell::Failed(err) => {
                    println!("  {} / {}: FAILED: {err}", scenario.title(), kind.title())
                }
                Cell::NotApplicable(_) => {}
            }
        }
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The timelines as a grid: a row per scenario, a column per lock type.
pub fn svg(results: &[(Scenario, Vec<Cell>)], backend: Backend) -> String {
    const LEFT: f64 = 190.0;
    const TOP: f64 = 56.0;
    const CELL_W: f64 = 300.0;
    const CELL_H: f64 = 96.0;
    const PAD: f64 = 10.0;
    let span_max = results
        .iter()
        .flat_map(|(_, cells)| cells)
        .filter_map(|c| match c {
            Cell::Done(_, t, _) => Some(t.end.as_secs_f64()),
            _ => None,
        })
        .fold(1.0, f64::max)
        .ceil();
    let scale = (CELL_W - 2.0 * PAD) / span_max;
    let width = LEFT + CELL_W * Kind::ALL.len() as f64 + PAD;
    let height = TOP + CELL_H * results.len() as f64 + 40.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{PAD}" y="20" font-size="15" font-weight="bold">Who held the lock when ({})</text>"#,
        match backend {
            Backend::Containers => "Docker containers",
            Backend::Processes => "redis-server processes",
        }
    );
    for (i, kind) in Kind::ALL.iter().enumerate() {
        let x = LEFT + CELL_W * i as f64 + PAD;
        let _ = writeln!(
            s,
            r#"<text x="{x}" y="{}" font-weight="bold">{}</text>"#,
            TOP - 8.0,
            escape(kind.title())
        );
    }
    for (row, (scenario, cells)) in results.iter().enumerate() {
        let y0 = TOP + CELL_H * row as f64;
        let _ = writeln!(
            s,
            r#"<text x="{PAD}" y="{}" font-weight="bold">{}</text>"#,
            y0 + 30.0,
            escape(scenario.title())
        );
        for (col, cell) in cells.iter().enumerate() {
            let x0 = LEFT + CELL_W * col as f64;
            let _ = writeln!(
                s,
                r##"<rect x="{x0}" y="{y0}" width="{CELL_W}" height="{CELL_H}" fill="none" stroke="#ccc"/>"##
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" fill="{}">{}</text>"#,
                x0 + PAD,
                y0 + CELL_H - 8.0,
                match cell {
                    Cell::Done(o, ..) if o.exclusion == Exclusion::Lost => "#c00",
                    _ => "#333",
                },
                escape(&cell_text(cell))
            );
            let Cell::Done(_, timeline, _) = cell else {
                continue;
            };
            let x = |d: Duration| x0 + PAD + d.as_secs_f64() * scale;
            let lane = |who: char| if who == 'A' { y0 + 32.0 } else { y0 + 50.0 };
            for second in 0..=span_max as u32 {
                let tx = x(Duration::from_secs(second.into()));
                let _ = writeln!(
                    s,
                    r##"<line x1="{tx}" y1="{}" x2="{tx}" y2="{}" stroke="#eee"/>"##,
                    y0 + 28.0,
                    y0 + 66.0
                );
            }
            for who in ['A', 'B'] {
                let _ = writeln!(
                    s,
                    r##"<text x="{}" y="{}" fill="#666">{who}</text>"##,
                    x0 + 1.0,
                    lane(who) + 9.0
                );
            }
            for &(who, from, to) in &timeline.spans {
                let color = if who == 'A' { "#3b6fb6" } else { "#e08a1e" };
                let _ = writeln!(
                    s,
                    r#"<rect x="{}" y="{}" width="{}" height="12" fill="{color}" opacity="0.85"/>"#,
                    x(from),
                    lane(who),
                    (x(to) - x(from)).max(1.5)
                );
            }
            for &(_, a_from, a_to) in timeline.spans.iter().filter(|s| s.0 == 'A') {
                for &(_, b_from, b_to) in timeline.spans.iter().filter(|s| s.0 == 'B') {
                    let (from, to) = (a_from.max(b_from), a_to.min(b_to));
                    if from < to {
                        let _ = writeln!(
                            s,
                            r##"<rect x="{}" y="{}" width="{}" height="32" fill="#d00" opacity="0.3"/>"##,
                            x(from),
                            lane('A') - 1.0,
                            x(to) - x(from)
                        );
                    }
                }
            }
            for (i, (at, label)) in timeline.marks.iter().enumerate() {
                let mx = x(*at);
                let _ = writeln!(
                    s,
                    r##"<line x1="{mx}" y1="{}" x2="{mx}" y2="{}" stroke="#900" stroke-dasharray="2,2"/>"##,
                    y0 + 2.0,
                    y0 + 66.0
                );
                let _ = writeln!(
                    s,
                    r##"<text x="{}" y="{}" fill="#900" font-size="9">{}</text>"##,
                    mx + 2.0,
                    y0 + 9.0 + 8.5 * (i % 3) as f64,
                    escape(label)
                );
            }
        }
    }
    let _ = writeln!(
        s,
        r##"<text x="{PAD}" y="{}" fill="#333">Bars: A (blue) from its grant until it let go or was told the lock was lost; B (orange) while it held. Red: both at once. Dashed: faults. Grid: 1 s.</text>"##,
        height - 16.0
    );
    s.push_str("</svg>\n");
    s
}
