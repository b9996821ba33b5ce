//! The faults: one task per group of nodes pauses (SIGSTOP), resumes
//! (SIGCONT), kills (SIGKILL) and restarts (empty) its nodes at random,
//! never impairing more than its limit at once. In a `rolling` run a
//! restarted node stays impaired until the clients repaired its fencing
//! counters; in a `storm` run it counts as up at once. Every action is
//! logged, so that a name that waited too long can be set against what the
//! chaos did meanwhile.

use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use multilock_testkit::{RedisProcess, TestServer};
use rand::RngExt;
use rand::rngs::StdRng;
use tokio::sync::watch;

use crate::REPAIR_LIMIT;

/// When a killed node comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restarts {
    /// After more than the longest lease and watchdog timeout (11–13 s):
    /// no hold can still count on what it had there.
    Delayed,
    /// At once, empty: the documented two-holder case for a RedLock.
    Immediate,
    /// A little after the (short) lease, up to two down at once, and
    /// impaired until repaired: fencing counters lost over and over.
    Rolling,
    /// As `rolling`, but a restarted node is up again at once, repaired or
    /// not: a name's counters may survive on a single node.
    Storm,
}

impl fmt::Display for Restarts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Restarts::Delayed => "delayed",
            Restarts::Immediate => "immediate",
            Restarts::Rolling => "rolling",
            Restarts::Storm => "storm",
        })
    }
}

/// What the chaos did to one group, for the report.
#[derive(Debug, Default, Clone)]
pub struct ChaosCounts {
    pub label: &'static str,
    pub pauses: u64,
    pub resumes: u64,
    pub kills: u64,
    pub restarts: u64,
    /// The shortest and longest time a killed node was down.
    pub down: Option<(Duration, Duration)>,
    /// Time with at least one node of the group down (killed), until the stop.
    pub time_with_a_node_down: Duration,
    /// Restarted nodes whose fencing counters were repaired, and the
    /// shortest and longest wait for it after the restart (`rolling`).
    pub repaired: u64,
    pub repair_time: Option<(Duration, Duration)>,
    /// Repairs still not done [`REPAIR_LIMIT`] after the restart.
    pub repairs_overdue: u64,
    /// Every action, in order.
    pub events: Vec<Event>,
}

/// One chaos action on a node.
#[derive(Debug, Clone)]
pub struct Event {
    pub at: Instant,
    /// The node's port.
    pub port: u16,
    pub what: &'static str,
}

/// A node's state, as the chaos left it.
#[derive(Debug, Clone, Copy)]
enum State {
    Up,
    Paused {
        until: Instant,
    },
    Down {
        since: Instant,
        until: Instant,
    },
    /// Restarted, its fencing counters not yet all repaired (by every
    /// client: `repaired` is when they were back, see [`REPAIR_GRACE`]).
    Repairing {
        since: Instant,
        overdue: bool,
        repaired: Option<Instant>,
    },
}

/// How often a node awaiting repair is checked.
const REPAIR_POLL: Duration = Duration::from_millis(20);
/// How long after its counters are back a restarted node still counts as
/// impaired: each client trusts a restarted node only once it noticed the
/// restart itself (its watch reconnects within 0.25 s) and repaired it (a
/// few ms), so the first repair, seen here, is not every client's.
const REPAIR_GRACE: Duration = Duration::from_millis(500);

/// The nodes of one lock kind and how the chaos treats them.
pub struct Group {
    servers: Vec<RedisProcess>,
    states: Vec<State>,
    /// At most this many nodes paused or down at once.
    max_impaired: usize,
    restarts: Restarts,
    /// The lease in use: a killed node stays down longer.
    lease: Duration,
    /// At most this many nodes down (killed) at once.
    max_down: usize,
    /// Fenced names whose counters a restarted node must have again before
    /// it counts as healed (empty: healed once restarted).
    fenced_names: Vec<String>,
    /// Chance that an action is a kill rather than a pause.
    kill_chance: f64,
    /// Time between two actions, in ms.
    gap_ms: Range<u64>,
    /// How long a pause lasts, in ms.
    pause_ms: Range<u64>,
    counts: Arc<Mutex<ChaosCounts>>,
}

impl Group {
    pub fn new(
        label: &'static str,
        servers: Vec<RedisProcess>,
        max_impaired: usize,
        restarts: Restarts,
        lease: Duration,
        kill_chance: f64,
        gap_ms: Range<u64>,
    ) -> Group {
        Group {
            states: vec![State::Up; servers.len()],
            servers,
            max_impaired,
            restarts,
            lease,
            max_down: if matches!(restarts, Restarts::Rolling | Restarts::Storm) {
                2
            } else {
                1
            },
            fenced_names: Vec::new(),
            kill_chance,
            gap_ms,
            pause_ms: 200..2_500,
            counts: Arc::new(Mutex::new(ChaosCounts {
                label,
                ..ChaosCounts::default()
            })),
        }
    }

    /// From now on a restarted node counts as impaired until every one of
    /// `names` that has a fencing counter on a live node has one on it too.
    pub fn await_repairs(&mut self, names: Vec<String>) {
        self.fenced_names = names;
    }

    /// Pauses last `ms` (default 0.2–2.5 s).
    pub fn pauses(&mut self, ms: Range<u64>) {
        self.pause_ms = ms;
    }

    /// The counts, shared with the task that runs the group.
    pub fn counts(&self) -> Arc<Mutex<ChaosCounts>> {
        self.counts.clone()
    }

    fn count(&self, update: impl FnOnce(&mut ChaosCounts)) {
        update(&mut self.counts.lock().unwrap());
    }

    fn log(&self, node: usize, what: &'static str) {
        let event = Event {
            at: Instant::now(),
            port: self.servers[node].port(),
            what,
        };
        self.count(|c| c.events.push(event));
    }

    /// Plays faults until `stop`, then heals every node (a killed node
    /// still waits out its delay) and returns the servers.
    pub async fn run(
        mut self,
        mut rng: StdRng,
        mut stop: watch::Receiver<bool>,
    ) -> io::Result<Vec<RedisProcess>> {
        let mut next_action = Instant::now() + self.gap(&mut rng);
        let mut last_tick = Instant::now();
        loop {
            let now = Instant::now();
            self.account_down_time(last_tick, now);
            last_tick = now;
            self.heal_due(now).await?;
            if *stop.borrow() {
                return self.heal_all().await;
            }
            if now >= next_action {
                self.act(&mut rng).await?;
                next_action = now + self.gap(&mut rng);
            }
            let wake = self
                .states
                .iter()
                .filter_map(|s| match s {
                    State::Up => None,
                    State::Paused { until } | State::Down { until, .. } => Some(*until),
                    State::Repairing { .. } => Some(now + REPAIR_POLL),
                })
                .fold(next_action, Instant::min);
            tokio::select! {
                _ = tokio::time::sleep_until(wake.into()) => {}
                _ = stop.changed() => {}
            }
        }
    }

    fn gap(&self, rng: &mut StdRng) -> Duration {
        Duration::from_millis(rng.random_range(self.gap_ms.clone()))
    }

    fn account_down_time(&self, from: Instant, to: Instant) {
        if self.states.iter().any(|s| matches!(s, State::Down { .. })) {
            self.count(|c| c.time_with_a_node_down += to - from);
        }
    }

    /// One fault on a node that is up, if the limit allows one.
    async fn act(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let impaired = self
            .states
            .iter()
            .filter(|s| !matches!(s, State::Up))
            .count();
        let down = self
            .states
            .iter()
            .filter(|s| matches!(s, State::Down { .. }))
            .count();
        if impaired >= self.max_impaired {
            return Ok(());
        }
        let up: Vec<usize> = (0..self.states.len())
            .filter(|&i| matches!(self.states[i], State::Up))
            .collect();
        let node = up[rng.random_range(0..up.len())];
        let now = Instant::now();
        if rng.random_bool(self.kill_chance) && down < self.max_down {
            self.servers[node].kill().await?;
            self.count(|c| c.kills += 1);
            self.log(node, "SIGKILL");
            let delay = match self.restarts {
                Restarts::Delayed => {
                    self.lease + Duration::from_millis(rng.random_range(1_000..3_000))
                }
                Restarts::Rolling | Restarts::Storm => {
                    self.lease + Duration::from_millis(rng.random_range(200..800))
                }
                Restarts::Immediate => Duration::ZERO,
            };
            self.states[node] = State::Down {
                since: now,
                until: now + delay,
            };
            if self.restarts == Restarts::Immediate {
                self.restart(node).await?;
            }
        } else {
            self.servers[node].pause().await?;
            self.count(|c| c.pauses += 1);
            self.log(node, "SIGSTOP");
            let pause = Duration::from_millis(rng.random_range(self.pause_ms.clone()));
            self.states[node] = State::Paused { until: now + pause };
        }
        Ok(())
    }

    async fn restart(&mut self, node: usize) -> io::Result<()> {
        let State::Down { since, .. } = self.states[node] else {
            return Ok(());
        };
        self.servers[node].restart().await?;
        self.log(node, "restarted");
        self.states[node] = if self.fenced_names.is_empty() {
            State::Up
        } else {
            State::Repairing {
                since: Instant::now(),
                overdue: false,
                repaired: None,
            }
        };
        let down = since.elapsed();
        self.count(|c| {
            c.restarts += 1;
            c.down = Some(match c.down {
                None => (down, down),
                Some((lo, hi)) => (lo.min(down), hi.max(down)),
            });
        });
        Ok(())
    }

    /// Resumes the paused nodes and restarts the killed ones whose time has
    /// come.
    async fn heal_due(&mut self, now: Instant) -> io::Result<()> {
        for node in 0..self.states.len() {
            match self.states[node] {
                State::Paused { until } if until <= now => {
                    self.servers[node].unpause().await?;
                    self.states[node] = State::Up;
                    self.count(|c| c.resumes += 1);
                    self.log(node, "SIGCONT");
                }
                State::Down { until, .. } if until <= now => self.restart(node).await?,
                State::Repairing {
                    repaired: Some(at), ..
                } if at.elapsed() >= REPAIR_GRACE => self.states[node] = State::Up,
                State::Repairing {
                    repaired: Some(_), ..
                } => {}
                State::Repairing { since, overdue, .. } => {
                    self.check_repair(node, since, overdue).await
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A restarted node is healed once its fencing counters are back: every
    /// fenced name with a counter on another node that is up has one here.
    async fn check_repair(&mut self, node: usize, since: Instant, overdue: bool) {
        let mut repaired = true;
        for name in &self.fenced_names {
            if counter_exists(&self.servers[node], name).await {
                continue;
            }
            let mut elsewhere = false;
            for other in 0..self.servers.len() {
                if other != node && matches!(self.states[other], State::Up) {
                    elsewhere |= counter_exists(&self.servers[other], name).await;
                }
            }
            if elsewhere {
                repaired = false;
                break;
            }
        }
        let waited = since.elapsed();
        if repaired {
            self.states[node] = State::Repairing {
                since,
                overdue,
                repaired: Some(Instant::now()),
            };
            self.count(|c| {
                c.repaired += 1;
                c.repair_time = Some(match c.repair_time {
                    None => (waited, waited),
                    Some((lo, hi)) => (lo.min(waited), hi.max(waited)),
                });
            });
        } else if waited > REPAIR_LIMIT && !overdue {
            self.states[node] = State::Repairing {
                since,
                overdue: true,
                repaired: None,
            };
            self.count(|c| c.repairs_overdue += 1);
        }
    }

    /// Resumes every paused node now and restarts every killed one once
    /// its delay is over (the remedy holds to the end).
    async fn heal_all(mut self) -> io::Result<Vec<RedisProcess>> {
        for node in 0..self.states.len() {
            match self.states[node] {
                State::Paused { .. } => {
                    self.states[node] = State::Paused {
                        until: Instant::now(),
                    };
                }
                // Nothing left to heal: the repair is the clients' work.
                State::Repairing { .. } => self.states[node] = State::Up,
                _ => {}
            }
        }
        loop {
            let now = Instant::now();
            self.heal_due(now).await?;
            let Some(wake) = self
                .states
                .iter()
                .filter_map(|s| match s {
                    State::Down { until, .. } => Some(*until),
                    _ => None,
                })
                .min()
            else {
                return Ok(self.servers);
            };
            tokio::time::sleep_until(wake.into()).await;
        }
    }
}

/// Whether the fencing counter of `name` exists on `server` (a node that
/// does not answer has none to offer).
async fn counter_exists(server: &RedisProcess, name: &str) -> bool {
    let key = multilock_testkit::protocol::token_key(name);
    let exists = async {
        let client = redis::Client::open(server.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("EXISTS")
            .arg(&key)
            .query_async::<bool>(&mut conn)
            .await
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), exists).await,
        Ok(Ok(true))
    )
}
