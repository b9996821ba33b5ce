//! The results: a table on stdout and a timeline grid as SVG.

use std::fmt::Write as _;
use std::time::Duration;

use crate::scenarios::{Acquired, Cell, Exclusion, MarkKind, Scenario, Timeline};
use crate::topology::Kind;

/// One cell of the table: exclusion / available / B's time to acquire.
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
            let time = match o.acquired {
                None => "—".to_owned(),
                Some(Acquired::AfterA(d) | Acquired::Alone(d)) => format!("{} ms", d.as_millis()),
                Some(Acquired::WhileA) => "while A held".to_owned(),
            };
            format!("{exclusion} / {available} / {time}")
        }
        Cell::NotApplicable(why) => format!("n/a ({why})"),
        Cell::Failed(_) => "failed".to_owned(),
    }
}

/// The legend of a cell, for the table and the picture.
pub const CELLS: &str = "cells: mutual exclusion (kept / LOST: two holders at once / fenced: \
     two holders, the stale write rejected by its fencing token / A refused: the first client \
     never got it) / lock available to the second client (B) / B's time to acquire, from the \
     moment A let go or was told it had lost the lock (\"while A held\": B got it before that)";

pub fn print_table(results: &[(Scenario, Vec<Cell>)]) {
    let first = 30;
    let width = 28;
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
    println!("{CELLS}");
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

/// Colours: A, B, two holders, fenced, faults, A's events, text.
const A_COLOR: &str = "#3b6fb6";
const B_COLOR: &str = "#e08a1e";
const LOST_COLOR: &str = "#d62728";
const FENCED_COLOR: &str = "#7b3fa0";
const FAULT_COLOR: &str = "#b00000";
const EVENT_COLOR: &str = "#555";
const TEXT_COLOR: &str = "#333";

/// Geometry, in pixels.
const LEFT: f64 = 210.0;
const TOP: f64 = 78.0;
const CELL_W: f64 = 330.0;
const PAD: f64 = 10.0;
/// Fault labels: font size, line height, width of a character (estimate).
const LABEL_SIZE: f64 = 9.5;
const LABEL_ROW: f64 = 11.5;
const CHAR_W: f64 = 5.6;
const LANE_H: f64 = 12.0;

/// The rows of a cell, from its top, under a label band of `rows` rows.
struct Rows {
    lane_a: f64,
    lane_b: f64,
    axis: f64,
    verdict: f64,
    height: f64,
}

impl Rows {
    fn new(rows: usize) -> Rows {
        let band = 6.0 + LABEL_ROW * rows as f64;
        let lane_a = band + 6.0;
        let lane_b = lane_a + LANE_H + 6.0;
        let axis = lane_b + LANE_H + 4.0;
        let verdict = axis + 26.0;
        Rows {
            lane_a,
            lane_b,
            axis,
            verdict,
            height: verdict + 10.0,
        }
    }
}

/// A label placed in the band above the lanes: its row, where it starts
/// and ends, and which way it reads from its line.
struct Placed {
    row: usize,
    from: f64,
    to: f64,
    anchor_end: bool,
}

/// Places each mark's label in the first row where it collides with no
/// other, right of its line, or left of it when it would leave the cell.
fn place_labels(timeline: &Timeline, x: impl Fn(Duration) -> f64, right: f64) -> Vec<Placed> {
    let mut placed: Vec<Placed> = Vec::new();
    for mark in &timeline.marks {
        let mx = x(mark.at);
        let width = mark.label.chars().count() as f64 * CHAR_W;
        let anchor_end = mx + 2.0 + width > right;
        let (from, to) = if anchor_end {
            (mx - 2.0 - width, mx - 2.0)
        } else {
            (mx + 2.0, mx + 2.0 + width)
        };
        let row = (0..)
            .find(|&row| {
                placed
                    .iter()
                    .filter(|p| p.row == row)
                    .all(|p| to + 4.0 < p.from || p.to + 4.0 < from)
            })
            .expect("some row is free");
        placed.push(Placed {
            row,
            from,
            to,
            anchor_end,
        });
    }
    placed
}

/// Seconds between numbered ticks: at least 34 px apart.
fn tick_step(scale: f64) -> f64 {
    [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0]
        .into_iter()
        .find(|step| step * scale >= 34.0)
        .unwrap_or(120.0)
}

/// The timelines as a grid: a row per scenario, a column per lock type,
/// with a legend. `backend` names what the servers ran on. Each row has a
/// time axis of its own (the cells of a row share it).
pub fn svg(results: &[(Scenario, Vec<Cell>)], backend: &str) -> String {
    let plot_w = CELL_W - 2.0 * PAD;
    let layouts: Vec<RowLayout> = results
        .iter()
        .map(|(_, cells)| RowLayout::new(cells, plot_w))
        .collect();
    let width = LEFT + CELL_W * Kind::ALL.len() as f64 + PAD;
    let grid_h: f64 = layouts.iter().map(|l| l.rows.height).sum();
    let legend_top = TOP + grid_h + 16.0;
    let height = legend_top + 46.0;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="DejaVu Sans, Verdana, sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<defs><pattern id="fenced" patternUnits="userSpaceOnUse" width="6" height="6" patternTransform="rotate(45)"><rect width="6" height="6" fill="white" opacity="0.4"/><rect width="3" height="6" fill="{FENCED_COLOR}" opacity="0.55"/></pattern></defs>"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{PAD}" y="22" font-size="16" font-weight="bold">Who held the lock when</text>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{PAD}" y="40" fill="{TEXT_COLOR}">Each cell: client A takes the lock, a fault hits (red), client B tries while A still believes it holds the lock, then A lets go and B tries again. Servers: {}.</text>"#,
        escape(backend)
    );
    for (i, kind) in Kind::ALL.iter().enumerate() {
        let x = LEFT + CELL_W * i as f64 + PAD;
        let _ = writeln!(
            s,
            r#"<text x="{x}" y="{}" font-weight="bold" font-size="12">{}</text>"#,
            TOP - 10.0,
            escape(kind.title())
        );
    }
    let mut y0 = TOP;
    for (row, ((scenario, cells), layout)) in results.iter().zip(&layouts).enumerate() {
        let r = &layout.rows;
        if row % 2 == 1 {
            let _ = writeln!(
                s,
                r##"<rect x="0" y="{y0}" width="{width}" height="{}" fill="#f7f7f7"/>"##,
                r.height
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{PAD}" y="{}" font-weight="bold">{}</text>"#,
            y0 + r.lane_a + 9.0,
            escape(scenario.title())
        );
        for (i, line) in wrap(scenario.detail(), 36).iter().enumerate() {
            let _ = writeln!(
                s,
                r##"<text x="{PAD}" y="{}" fill="#666" font-size="9.5">{}</text>"##,
                y0 + r.lane_a + 24.0 + 12.0 * i as f64,
                escape(line)
            );
        }
        for (col, cell) in cells.iter().enumerate() {
            let x0 = LEFT + CELL_W * col as f64;
            cell_svg(&mut s, cell, x0, y0, layout);
        }
        y0 += r.height;
    }
    legend(&mut s, legend_top);
    s.push_str("</svg>\n");
    s
}

/// The time axis and the height of one row of cells.
struct RowLayout {
    /// Seconds the axis spans (the longest cell of the row).
    span: f64,
    /// Pixels per second.
    scale: f64,
    rows: Rows,
}

impl RowLayout {
    fn new(cells: &[Cell], plot_w: f64) -> RowLayout {
        let timelines = || {
            cells.iter().filter_map(|c| match c {
                Cell::Done(_, t, _) => Some(t),
                _ => None,
            })
        };
        let span = timelines()
            .map(|t| t.end.as_secs_f64())
            .fold(1.0, f64::max)
            .ceil();
        let scale = plot_w / span;
        // One label band for the row, so that its lanes line up.
        let label_rows = timelines()
            .filter_map(|t| {
                place_labels(t, |d| d.as_secs_f64() * scale, plot_w)
                    .iter()
                    .map(|p| p.row + 1)
                    .max()
            })
            .max()
            .unwrap_or(1);
        RowLayout {
            span,
            scale,
            rows: Rows::new(label_rows),
        }
    }
}

/// One cell: label band, the two lanes, the axis and the verdict.
fn cell_svg(s: &mut String, cell: &Cell, x0: f64, y0: f64, layout: &RowLayout) {
    let (r, scale, span_max) = (&layout.rows, layout.scale, layout.span);
    let _ = writeln!(
        s,
        r##"<rect x="{x0}" y="{y0}" width="{CELL_W}" height="{}" fill="none" stroke="#ccc"/>"##,
        r.height
    );
    let (verdict_color, weight) = match cell {
        Cell::Done(o, ..) if o.exclusion == Exclusion::Lost => (LOST_COLOR, "bold"),
        Cell::Done(o, ..) if o.exclusion == Exclusion::Fenced => (FENCED_COLOR, "bold"),
        Cell::Done(..) => (TEXT_COLOR, "normal"),
        _ => ("#999", "normal"),
    };
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" fill="{verdict_color}" font-weight="{weight}">{}</text>"#,
        x0 + PAD,
        y0 + r.verdict,
        escape(&cell_text(cell))
    );
    let Cell::Done(outcome, timeline, _) = cell else {
        return;
    };
    let x = |d: Duration| x0 + PAD + d.as_secs_f64() * scale;
    let lane = |who: char| y0 + if who == 'A' { r.lane_a } else { r.lane_b };
    let lanes_bottom = y0 + r.lane_b + LANE_H;

    // The time axis: a grid line and a number per tick.
    let step = tick_step(scale);
    let ticks = (span_max / step).floor() as u32;
    for i in 0..=ticks {
        let t = step * f64::from(i);
        let tx = x(Duration::from_secs_f64(t));
        let _ = writeln!(
            s,
            r##"<line x1="{tx}" y1="{}" x2="{tx}" y2="{}" stroke="#e4e4e4"/>"##,
            y0 + r.lane_a - 3.0,
            y0 + r.axis
        );
        let _ = writeln!(
            s,
            r##"<line x1="{tx}" y1="{}" x2="{tx}" y2="{}" stroke="#999"/>"##,
            y0 + r.axis,
            y0 + r.axis + 3.0
        );
        let label = if step < 1.0 {
            format!("{t:.1}")
        } else {
            format!("{t:.0}")
        };
        // The last number carries the unit and ends at its tick, inside
        // the cell.
        let (label, anchor, tx) = if i == ticks {
            (format!("{label} s"), "end", tx + 3.0)
        } else {
            (label, "middle", tx)
        };
        let _ = writeln!(
            s,
            r##"<text x="{tx}" y="{}" fill="#777" font-size="8.5" text-anchor="{anchor}">{label}</text>"##,
            y0 + r.axis + 12.0
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#999"/>"##,
        x(Duration::ZERO),
        y0 + r.axis,
        x(Duration::from_secs_f64(span_max)),
        y0 + r.axis
    );
    for who in ['A', 'B'] {
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" fill="#666" font-size="10">{who}</text>"##,
            x0 + 1.5,
            lane(who) + 10.0
        );
    }

    for &(who, from, to) in &timeline.spans {
        let color = if who == 'A' { A_COLOR } else { B_COLOR };
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="{}" height="{LANE_H}" fill="{color}" opacity="0.9"/>"#,
            x(from),
            lane(who),
            (x(to) - x(from)).max(1.5)
        );
    }
    // Two holders at once: red when both acted on it, hatched when the
    // stale holder's write was rejected (fenced).
    for &(_, a_from, a_to) in timeline.spans.iter().filter(|s| s.0 == 'A') {
        for &(_, b_from, b_to) in timeline.spans.iter().filter(|s| s.0 == 'B') {
            let (from, to) = (a_from.max(b_from), a_to.min(b_to));
            if from >= to {
                continue;
            }
            let fill = if outcome.exclusion == Exclusion::Fenced {
                "url(#fenced)".to_owned()
            } else {
                LOST_COLOR.to_owned()
            };
            let stroke = if outcome.exclusion == Exclusion::Fenced {
                FENCED_COLOR
            } else {
                LOST_COLOR
            };
            let _ = writeln!(
                s,
                r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{fill}" fill-opacity="{}" stroke="{stroke}" stroke-width="1.2"/>"#,
                x(from),
                lane('A') - 2.0,
                (x(to) - x(from)).max(2.0),
                lanes_bottom - lane('A') + 4.0,
                if outcome.exclusion == Exclusion::Fenced {
                    "1"
                } else {
                    "0.35"
                }
            );
        }
    }
    // B's wait: from the end of A's bar to B's grant.
    let a_end = timeline.spans.iter().find(|s| s.0 == 'A').map(|s| s.2);
    let b_span = timeline.spans.iter().find(|s| s.0 == 'B');
    if let (Some(Acquired::AfterA(wait)), Some(a_end), Some(&(_, b_from, b_to))) =
        (outcome.acquired, a_end, b_span)
    {
        let (x1, x2) = (x(a_end), x(b_from));
        let y = lane('B') + LANE_H / 2.0;
        let _ = writeln!(
            s,
            r##"<path d="M{x1},{} V{y} H{x2}" fill="none" stroke="#444" stroke-width="1" stroke-dasharray="1,1.5"/>"##,
            lane('A') + LANE_H
        );
        // The number right of B's bar; else above the wait, when it is
        // wide enough; else left of B's bar.
        let text = format!("+{} ms", wait.as_millis());
        let after_b = x(b_to) + 3.0;
        let text_w = text.len() as f64 * CHAR_W;
        let (tx, ty, anchor) = if after_b + text_w <= x0 + CELL_W - 2.0 {
            (after_b, y + 3.0, "start")
        } else if x2 - x1 >= text_w + 6.0 {
            ((x1 + x2) / 2.0, y - 2.5, "middle")
        } else {
            (x2 - 3.0, y + 3.0, "end")
        };
        let _ = writeln!(
            s,
            r##"<text x="{tx}" y="{ty}" fill="#444" font-size="9" text-anchor="{anchor}">{text}</text>"##
        );
    }

    // Marks: faults (red, dashed) and A's events (grey, dotted), each
    // labelled in the band above the lanes.
    let placed = place_labels(timeline, x, x0 + CELL_W - 3.0);
    for (mark, p) in timeline.marks.iter().zip(&placed) {
        let mx = x(mark.at);
        let (color, dash) = match mark.kind {
            MarkKind::Fault => (FAULT_COLOR, "3,2"),
            MarkKind::Event => (EVENT_COLOR, "1,2"),
        };
        let label_y = y0 + 6.0 + LABEL_ROW * p.row as f64 + LABEL_SIZE - 1.0;
        let _ = writeln!(
            s,
            r#"<line x1="{mx}" y1="{}" x2="{mx}" y2="{lanes_bottom}" stroke="{color}" stroke-dasharray="{dash}"/>"#,
            label_y - LABEL_SIZE + 1.0
        );
        let (tx, anchor) = if p.anchor_end {
            (p.to, "end")
        } else {
            (p.from, "start")
        };
        let _ = writeln!(
            s,
            r#"<text x="{tx}" y="{label_y}" fill="{color}" font-size="{LABEL_SIZE}" text-anchor="{anchor}">{}</text>"#,
            escape(&mark.label)
        );
    }
}

/// The legend under the grid: two lines of swatches.
fn legend(s: &mut String, top: f64) {
    let items: [&[(&str, &str)]; 2] = [
        &[
            (
                "a",
                "A holds: from its grant until it lets go or is told it lost the lock",
            ),
            ("b", "B holds"),
            ("lost", "LOST: both held the lock at once"),
            (
                "fenced",
                "fenced: both held it; A's late write was rejected",
            ),
        ],
        &[
            ("fault", "a fault"),
            ("event", "something A did or learned"),
            (
                "wait",
                "+N ms: B's grant, that long after A let go (or was told it lost the lock)",
            ),
        ],
    ];
    for (line, row) in items.iter().enumerate() {
        let y = top + 20.0 * line as f64;
        let mut x = PAD;
        for (key, text) in row.iter() {
            swatch(s, key, x, y);
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" fill="{TEXT_COLOR}">{}</text>"#,
                x + 26.0,
                y + 10.0,
                escape(text)
            );
            x += 26.0 + text.chars().count() as f64 * 6.3 + 28.0;
        }
    }
}

fn swatch(s: &mut String, key: &str, x: f64, y: f64) {
    let _ = match key {
        "a" | "b" => writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="20" height="10" fill="{}"/>"#,
            y + 1.0,
            if key == "a" { A_COLOR } else { B_COLOR }
        ),
        "lost" => writeln!(
            s,
            r#"<rect x="{x}" y="{y}" width="20" height="12" fill="{LOST_COLOR}" fill-opacity="0.35" stroke="{LOST_COLOR}"/>"#
        ),
        "fenced" => writeln!(
            s,
            r#"<rect x="{x}" y="{y}" width="20" height="12" fill="url(#fenced)" stroke="{FENCED_COLOR}"/>"#
        ),
        "fault" | "event" => {
            let (color, dash) = if key == "fault" {
                (FAULT_COLOR, "3,2")
            } else {
                (EVENT_COLOR, "1,2")
            };
            writeln!(
                s,
                r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{color}" stroke-dasharray="{dash}" stroke-width="1.5"/>"#,
                x + 10.0,
                y - 1.0,
                x + 10.0,
                y + 13.0
            )
        }
        "wait" => writeln!(
            s,
            r##"<path d="M{x},{} V{} H{}" fill="none" stroke="#444" stroke-dasharray="1,1.5"/>"##,
            y - 1.0,
            y + 8.0,
            x + 20.0
        ),
        _ => Ok(()),
    };
}

/// Splits `text` into lines of at most `width` characters, at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    lines
}
