//! Latency samples and the few statistics the report shows: a leaf every
//! other file may use.

use std::time::Duration;

/// Latency samples, sorted, in nanoseconds.
#[derive(Clone, Default)]
pub struct Latencies(pub Vec<u64>);

impl Latencies {
    pub fn new(mut nanos: Vec<u64>) -> Latencies {
        nanos.sort_unstable();
        Latencies(nanos)
    }

    /// The `q` quantile (nearest rank), in µs.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let rank = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1] as f64 / 1e3
    }

    pub fn p50(&self) -> f64 {
        self.quantile(0.50)
    }

    pub fn p99(&self) -> f64 {
        self.quantile(0.99)
    }

    pub fn max(&self) -> f64 {
        self.quantile(1.0)
    }

    pub fn mean(&self) -> f64 {
        let sum: u64 = self.0.iter().sum();
        sum as f64 / self.0.len().max(1) as f64 / 1e3
    }
}

pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The figures shown for a latency series.
pub type Stat = (&'static str, fn(&Latencies) -> f64);
pub const STATS: [Stat; 3] = [
    ("p50", Latencies::p50),
    ("p99", Latencies::p99),
    ("mean", Latencies::mean),
];

/// The median of some values (the mean of the middle two of an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        len if len % 2 == 1 => sorted[len / 2],
        len => (sorted[len / 2 - 1] + sorted[len / 2]) / 2.0,
    }
}

/// The lower and upper quartiles (nearest rank) of four values or more.
pub fn quartiles(values: &[f64]) -> Option<(f64, f64)> {
    if values.len() < 4 {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at =
        |q: f64| sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
    Some((at(0.25), at(0.75)))
}

/// Round by round, a contender's figure ÷ the limit's in the same round.
pub fn paired_ratios(
    ours: impl IntoIterator<Item = f64>,
    limit: impl IntoIterator<Item = f64>,
) -> Vec<f64> {
    ours.into_iter()
        .zip(limit)
        .map(|(ours, limit)| ours / limit)
        .collect()
}

/// `, middle half of the rounds a–b×` for paired ratios (nothing for too
/// few). Rounds that a burst of other work hit on one side only are far
/// off; the median of the paired rounds, which the targets take, is not
/// moved by them.
pub fn middle_half(ratios: &[f64]) -> String {
    quartiles(ratios).map_or(String::new(), |(low, high)| {
        format!(", middle half of the rounds {low:.2}–{high:.2}×")
    })
}
