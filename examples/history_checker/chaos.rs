//! The faults: one task per group of nodes pauses (SIGSTOP), resumes
//! (SIGCONT), kills (SIGKILL) and restarts (empty) its nodes at random,
//! never impairing more than its limit at once.

use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use multilock::testkit::{RedisProcess, TestServer};
use rand::RngExt;
use rand::rngs::StdRng;
use tokio::sync::watch;

use crate::LEASE;

/// When a killed node comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restarts {
    /// After more than the longest lease and watchdog timeout (11–13 s):
    /// no hold can still count on what it had there.
    Delayed,
    /// At once, empty: the documented two-holder case for a RedLock.
    Immediate,
}

impl fmt::Display for Restarts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Restarts::Delayed => "delayed",
            Restarts::Immediate => "immediate",
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
}

/// A node's state, as the chaos left it.
#[derive(Debug, Clone, Copy)]
enum State {
    Up,
    Paused { until: Instant },
    Down { since: Instant, until: Instant },
}

/// The nodes of one lock kind and how the chaos treats them.
pub struct Group {
    servers: Vec<RedisProcess>,
    states: Vec<State>,
    /// At most this many nodes paused or down at once.
    max_impaired: usize,
    restarts: Restarts,
    /// Chance that an action is a kill rather than a pause.
    kill_chance: f64,
    /// Time between two actions, in ms.
    gap_ms: Range<u64>,
    counts: Arc<Mutex<ChaosCounts>>,
}

impl Group {
    pub fn new(
        label: &'static str,
        servers: Vec<RedisProcess>,
        max_impaired: usize,
        restarts: Restarts,
        kill_chance: f64,
        gap_ms: Range<u64>,
    ) -> Group {
        Group {
            states: vec![State::Up; servers.len()],
            servers,
            max_impaired,
            restarts,
            kill_chance,
            gap_ms,
            counts: Arc::new(Mutex::new(ChaosCounts {
                label,
                ..ChaosCounts::default()
            })),
        }
    }

    /// The counts, shared with the task that runs the group.
    pub fn counts(&self) -> Arc<Mutex<ChaosCounts>> {
        self.counts.clone()
    }

    fn count(&self, update: impl FnOnce(&mut ChaosCounts)) {
        update(&mut self.counts.lock().unwrap());
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
        if rng.random_bool(self.kill_chance) && down == 0 {
            self.servers[node].kill().await?;
            self.count(|c| c.kills += 1);
            let delay = match self.restarts {
                Restarts::Delayed => LEASE + Duration::from_millis(rng.random_range(1_000..3_000)),
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
            let pause = Duration::from_millis(rng.random_range(200..2_500));
            self.states[node] = State::Paused { until: now + pause };
        }
        Ok(())
    }

    async fn restart(&mut self, node: usize) -> io::Result<()> {
        let State::Down { since, .. } = self.states[node] else {
            return Ok(());
        };
        self.servers[node].restart().await?;
        self.states[node] = State::Up;
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
                }
                State::Down { until, .. } if until <= now => self.restart(node).await?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Resumes every paused node now and restarts every killed one once
    /// its delay is over (the remedy holds to the end).
    async fn heal_all(mut self) -> io::Result<Vec<RedisProcess>> {
        for node in 0..self.states.len() {
            if let State::Paused { .. } = self.states[node] {
                self.states[node] = State::Paused {
                    until: Instant::now(),
                };
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
