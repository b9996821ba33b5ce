//! What a run locks: the lock names, and the workers of each kind per
//! client, per `--locks` and `--restarts` mode (`--locks fresh` makes up
//! its names as it goes: see `fresh.rs`).

use std::time::Duration;

use crate::chaos::Restarts;
use crate::workers::{Kind, Nodes};
use crate::{LEASE, Settings};

/// The lock names: (name, fenced), per kind.
pub const RED_NAMES: [(&str, bool); 3] =
    [("hc:red:0", true), ("hc:red:1", true), ("hc:red:2", false)];
/// See [`RED_NAMES`].
pub const MULTI_NAMES: [(&str, bool); 2] = [("hc:multi:0", true), ("hc:multi:1", false)];
/// The names of a `rolling` run: every one fenced.
pub const ROLLING_NAMES: [(&str, bool); 4] = [
    ("hc:fenced:0", true),
    ("hc:fenced:1", true),
    ("hc:fenced:2", true),
    ("hc:fenced:3", true),
];
/// The names of a `--locks family` run: read-write locks (fenced: their
/// write locks), a fair lock on a node of its own, a RedLock of fair locks.
pub const RW_NAMES: [(&str, bool); 2] = [("hc:rw:0", true), ("hc:rw:1", false)];
pub const FAIR_NAMES: [(&str, bool); 1] = [("hc:fair:0", true)];
pub const FAIR_RED_NAMES: [(&str, bool); 1] = [("hc:fair-red:0", true)];

/// The lock kinds a run takes (`--locks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Locks {
    /// RedLocks and MultiLocks of reentrant locks.
    Classic,
    /// Redisson's other kinds: read-write locks and fair locks, alone and
    /// inside RedLocks.
    Family,
    /// Fenced RedLocks, each acquire on a name nobody used before (twice
    /// per name), with one RedLock node dead throughout.
    Fresh,
}

/// Workers of one kind: the names they lock, and how many per client.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub kind: Kind,
    /// Empty for [`Kind::Fresh`]: its workers make up their names.
    pub names: &'static [(&'static str, bool)],
    pub workers: usize,
}

/// What a run locks, per `--restarts` mode and `--locks`.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// The fixed lease, and the watchdog timeout of every client.
    pub lease: Duration,
    pub plans: &'static [Plan],
    /// Holds mostly of a few ms (else up to 4 s).
    pub short_holds: bool,
}

impl Scenario {
    pub fn of(settings: &Settings) -> Scenario {
        match (settings.locks, settings.restarts) {
            (Locks::Family, _) => Scenario {
                lease: LEASE,
                plans: &[
                    Plan {
                        kind: Kind::ReadWrite,
                        names: &RW_NAMES,
                        workers: 3,
                    },
                    Plan {
                        kind: Kind::Fair,
                        names: &FAIR_NAMES,
                        workers: 2,
                    },
                    Plan {
                        kind: Kind::FairRed,
                        names: &FAIR_RED_NAMES,
                        workers: 1,
                    },
                ],
                short_holds: false,
            },
            (Locks::Classic, Restarts::Delayed | Restarts::Immediate) => Scenario {
                lease: LEASE,
                plans: &[
                    Plan {
                        kind: Kind::Red,
                        names: &RED_NAMES,
                        workers: 3,
                    },
                    Plan {
                        kind: Kind::Multi,
                        names: &MULTI_NAMES,
                        workers: 2,
                    },
                ],
                short_holds: false,
            },
            (Locks::Fresh, _) => Scenario {
                lease: LEASE,
                plans: &[Plan {
                    kind: Kind::Fresh,
                    names: &[],
                    workers: 6,
                }],
                short_holds: true,
            },
            // A storm's lease is longer than rolling's: its pauses and
            // restarts are shaped on it (restarts come lease + 0.2–0.8 s
            // after the kill).
            (Locks::Classic, Restarts::Rolling | Restarts::Storm) => Scenario {
                lease: Duration::from_secs(2),
                plans: &[Plan {
                    kind: Kind::Red,
                    names: &ROLLING_NAMES,
                    workers: 6,
                }],
                short_holds: true,
            },
        }
    }

    /// Whether every acquire is on a fresh name (`--locks fresh`).
    pub fn fresh(&self) -> bool {
        self.kinds().any(|k| k == Kind::Fresh)
    }

    /// The kinds of lock taken, in the order of the plans.
    pub fn kinds(&self) -> impl Iterator<Item = Kind> + '_ {
        self.plans.iter().map(|p| p.kind)
    }

    /// The names locked on a group of nodes, fenced or not.
    pub fn names_on(&self, nodes: Nodes) -> Vec<(&'static str, bool)> {
        self.plans
            .iter()
            .filter(|p| p.kind.nodes() == nodes)
            .flat_map(|p| p.names.iter().copied())
            .collect()
    }

    /// Whether any kind runs on a group of nodes.
    pub fn uses(&self, nodes: Nodes) -> bool {
        self.plans.iter().any(|p| p.kind.nodes() == nodes)
    }

    /// The fenced names locked on the RedLock nodes.
    pub fn fenced_red_names(&self) -> Vec<String> {
        self.names_on(Nodes::Red)
            .into_iter()
            .filter(|(_, fenced)| *fenced)
            .map(|(name, _)| name.to_string())
            .collect()
    }
}

impl std::fmt::Display for Locks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Locks::Classic => "classic",
            Locks::Family => "family",
            Locks::Fresh => "fresh",
        })
    }
}
