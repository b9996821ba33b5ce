//! The latency CDFs as a hand-written SVG: one panel per case, two panels
//! a row, a log-scale latency axis.

use std::fmt::Write as _;

use crate::stats::Latencies;

/// One panel of the plot: a case, and each contender's latencies in it.
pub struct Panel {
    title: String,
    series: Vec<(String, Latencies)>,
}

impl Panel {
    pub fn new(title: String) -> Panel {
        Panel {
            title,
            series: Vec::new(),
        }
    }

    pub fn add(&mut self, label: String, latencies: Latencies) {
        if !latencies.0.is_empty() {
            self.series.push((label, latencies));
        }
    }
}

/// Colour and dash of a series, by contender.
fn style(label: &str, index: usize) -> (&'static str, &'static str) {
    const OURS: [&str; 4] = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b"];
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
pub fn cdf_svg(panels: &[Panel]) -> String {
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
