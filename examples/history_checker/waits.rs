//! How long fenced names waited for a grant, and why: every wait, the
//! ones that broke a run's limit (a fencing stall, or too long for any
//! cause), and what the chaos, the clients and the nodes showed during
//! one.

use std::collections::BTreeMap;
use std::time::Duration;

use multilock_testkit::{History, Hold};

use crate::chaos::{ChaosCounts, Event, Restarts};
use crate::journal::{Entry, Journal};
use crate::plant::is_planted;
use crate::stalls::LOOKED;
use crate::{ROLLING_GAP_LIMIT, STORM_GAP_LIMIT, Settings};

/// At most this many chaos actions are printed for one long wait.
const PRINT_CHAOS: usize = 16;

/// Every time a fenced name sat free without a fenced grant: from the
/// later of the run's start and the end of every earlier hold (its
/// release, or the end of its validity when never released) to the next
/// grant, or to `stop`. By name: (the wait, when it ended), in order.
/// Planted holds do not count.
pub fn fenced_waits(holds: &[Hold], stop: Duration) -> BTreeMap<String, Vec<(Duration, Duration)>> {
    let mut by_name: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for hold in holds {
        if hold.token.is_some() && !is_planted(&hold.holder) && hold.granted <= stop {
            by_name.entry(&hold.name).or_default().push(hold);
        }
    }
    by_name
        .into_iter()
        .map(|(name, mut holds)| {
            holds.sort_by_key(|h| h.granted);
            let mut free_since = Duration::ZERO;
            let mut waits = Vec::new();
            let ends = holds.iter().map(|h| h.granted).chain([stop]);
            for (i, next) in ends.enumerate() {
                let wait = next.saturating_sub(free_since);
                if !wait.is_zero() {
                    waits.push((wait, next));
                }
                if let Some(hold) = holds.get(i) {
                    free_since = free_since.max(hold.let_go());
                }
            }
            (name.to_owned(), waits)
        })
        .collect()
}

/// A name's longest wait without a fenced grant: (the wait, when it ended).
pub(crate) fn longest(waits: &[(Duration, Duration)]) -> (Duration, Duration) {
    waits.iter().copied().max().unwrap_or_default()
}

/// How many rounds lost for want of a fencing token make a long wait a
/// fencing stall. A stall loses one at every round of every waiter (a floor
/// that waited for every node lost 53 to 959 in one wait of one name); a
/// node paused between a grant and its seal costs one now and then (2 in
/// a whole 60 s storm).
pub(crate) const STALL_LOSSES: usize = 5;

/// A wait without a fenced grant that broke a limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LongWait {
    pub wait: Duration,
    pub ended: Duration,
    /// Rounds that won a quorum and were lost for want of a fencing
    /// token meanwhile.
    pub fencing_losses: usize,
}

/// How many times a name's fenced grants jumped to the wall-clock floor
/// (a token more than 100,000 above the one before: counters step by one
/// per grant, a floor by the microseconds since the last one). The token
/// still increases, but the counters could not prove it: the client saw
/// too many nodes without a trusted counter at once.
pub fn floor_jumps(holds: &[Hold]) -> usize {
    let mut by_name: BTreeMap<&str, Vec<(Duration, u64)>> = BTreeMap::new();
    for hold in holds {
        if let (Some(token), false) = (hold.token, is_planted(&hold.holder)) {
            by_name
                .entry(&hold.name)
                .or_default()
                .push((hold.granted, token));
        }
    }
    by_name
        .values_mut()
        .map(|grants| {
            grants.sort_unstable();
            grants
                .windows(2)
                .filter(|w| w[1].1 > w[0].1.saturating_add(100_000))
                .count()
        })
        .sum()
}

/// Per name, the longest wait without a fenced grant that broke the run's
/// limit: in a `rolling` run any wait over [`ROLLING_GAP_LIMIT`]; in a
/// `storm`, one over [`STORM_GAP_LIMIT`], or one over the rolling limit
/// during which [`STALL_LOSSES`] rounds or more that had won a quorum were
/// lost for want of a fencing token (a fencing stall, what the storm is
/// for; the rest of a storm's waits is nodes down and keys that releases
/// could not reach).
pub(crate) fn long_waits(
    settings: &Settings,
    waits: &BTreeMap<String, Vec<(Duration, Duration)>>,
    history: &History,
    journal: &Journal,
) -> BTreeMap<String, LongWait> {
    let origin = history.origin();
    let mut long = BTreeMap::new();
    for (name, waits) in waits {
        let judged = waits
            .iter()
            .filter(|(wait, _)| *wait > ROLLING_GAP_LIMIT)
            .map(|&(wait, ended)| {
                let from = origin + ended.saturating_sub(wait);
                LongWait {
                    wait,
                    ended,
                    fencing_losses: journal.fencing_losses(name, from, origin + ended),
                }
            });
        let over = judged.filter(|w| {
            settings.restarts == Restarts::Rolling
                || w.wait > STORM_GAP_LIMIT
                || w.fencing_losses >= STALL_LOSSES
        });
        if let Some(worst) = over.max_by_key(|w| w.wait) {
            long.insert(name.clone(), worst);
        }
    }
    long
}

/// The limits of the run's waits, for the report.
pub(crate) fn limits(settings: &Settings) -> String {
    if settings.restarts == Restarts::Rolling {
        format!("the limit is {ROLLING_GAP_LIMIT:?}")
    } else {
        format!(
            "the limits are {ROLLING_GAP_LIMIT:?} with {STALL_LOSSES} rounds or more lost for want of a token, {STORM_GAP_LIMIT:?} in any case"
        )
    }
}

/// Whether the run judges the time names go without a fenced grant.
pub(crate) fn judges_gaps(settings: &Settings) -> bool {
    matches!(settings.restarts, Restarts::Rolling | Restarts::Storm)
}

/// What the chaos had done to the nodes when `name` began to wait (at
/// `from`: the nodes not up then, since when), and what it did until `to`
/// (at most [`PRINT_CHAOS`] actions): why it waited.
pub(crate) fn print_chaos_during(
    chaos: &[ChaosCounts],
    history: &History,
    name: &str,
    from: Duration,
    to: Duration,
) {
    let mut events: Vec<(Duration, &Event)> = chaos
        .iter()
        .flat_map(|c| &c.events)
        .map(|e| (history.since_origin(e.at), e))
        .filter(|(at, _)| *at <= to)
        .collect();
    events.sort_by_key(|(at, _)| *at);
    // Each node's last action before the wait: what state it was in.
    let mut last: BTreeMap<u16, (Duration, &str)> = BTreeMap::new();
    for (at, e) in events.iter().filter(|(at, _)| *at <= from) {
        last.insert(e.port, (*at, e.what));
    }
    let impaired: Vec<String> = last
        .iter()
        .filter_map(|(port, (at, what))| {
            let state = match *what {
                "SIGSTOP" => "paused",
                "SIGKILL" => "down",
                // Empty: its counters may still be missing.
                "restarted" if from.saturating_sub(*at) < Duration::from_secs(5) => {
                    "restarted empty"
                }
                _ => return None,
            };
            Some(format!("{port} {state} since {:.2} s", at.as_secs_f64()))
        })
        .collect();
    let during: Vec<String> = events
        .iter()
        .filter(|(at, _)| *at > from)
        .map(|(at, e)| format!("{:.2} s {} {}", at.as_secs_f64(), e.what, e.port))
        .collect();
    let shown = during.len().min(PRINT_CHAOS);
    println!(
        "    {name} waited {:.2}–{:.2} s; nodes then: {}; chaos meanwhile: {}{}",
        from.as_secs_f64(),
        to.as_secs_f64(),
        if impaired.is_empty() {
            "all up".to_owned()
        } else {
            impaired.join(", ")
        },
        if during.is_empty() {
            "none".to_owned()
        } else {
            during[..shown].join(", ")
        },
        if during.len() > shown {
            format!(" ... and {} more", during.len() - shown)
        } else {
            String::new()
        }
    );
}

/// What the journal kept about `name` between `from` and `to`: its head
/// and its tail when it is long.
pub(crate) fn print_journal(
    journal: &Journal,
    history: &History,
    name: &str,
    from: Duration,
    to: Duration,
) {
    const HEAD: usize = 40;
    const TAIL: usize = 30;
    let origin = history.origin();
    let entries = journal.about(name, origin + from, origin + to);
    let line = |entry: &Entry| {
        println!(
            "      {:.3} s {}",
            history.since_origin(entry.at).as_secs_f64(),
            entry.line.trim_end()
        );
    };
    println!(
        "      what the clients logged then ({} entries):",
        entries.len()
    );
    if entries.len() <= HEAD + TAIL {
        entries.iter().for_each(line);
    } else {
        entries[..HEAD].iter().for_each(line);
        let middle = &entries[HEAD..entries.len() - TAIL];
        let looks: Vec<_> = middle.iter().filter(|e| e.line.contains(LOOKED)).collect();
        println!(
            "      ... {} more, of which the looks at the nodes:",
            middle.len()
        );
        looks.into_iter().for_each(line);
        println!("      ... and the last {TAIL}:");
        entries[entries.len() - TAIL..].iter().for_each(line);
    }
}
