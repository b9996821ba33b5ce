//! The scenarios: client A takes the lock, a fault is injected, client B
//! tries while A still believes it holds the lock (phase 1), then A lets go
//! and B tries again (phase 2). Each run records who held the lock when.

use std::io;
use std::time::{Duration, Instant};

use multilock::{Client, Error, Guard};
use multilock_testkit::{Backend, FencedStore, Side, TestServer, poll_until};

use crate::topology::{AnyLock, Kind, Topology, client};

/// Fixed lease of the holders that use one.
const LEASE: Duration = Duration::from_secs(4);
/// Watchdog timeout of the partition scenario's holder.
const WATCHDOG: Duration = Duration::from_millis(1500);
/// How long B holds the lock once it has it (so it shows on the timeline).
pub const B_HOLDS: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Failover,
    TwoDown,
    Paused,
    Restart,
    DelayedRestart,
    CutOff,
    Stall,
}

impl Scenario {
    pub const ALL: [Scenario; 7] = [
        Scenario::Failover,
        Scenario::TwoDown,
        Scenario::Paused,
        Scenario::Restart,
        Scenario::DelayedRestart,
        Scenario::CutOff,
        Scenario::Stall,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Scenario::Failover => "master dies, replica lagging",
            Scenario::TwoDown => "two nodes die",
            Scenario::Paused => "a node freezes (paused)",
            Scenario::Restart => "a node restarts empty",
            Scenario::DelayedRestart => "restart delayed past lease",
            Scenario::CutOff => "holder cut off (watchdog)",
            Scenario::Stall => "holder stalls past lease",
        }
    }

    /// What happens, in a line or two.
    pub fn detail(self) -> &'static str {
        match self {
            Scenario::Failover => {
                "single: the replica misses A's grant, the primary dies, the replica is promoted; \
                 others: node 1 dies"
            }
            Scenario::TwoDown => "single: the primary and its replica; others: nodes 1 and 2",
            Scenario::Paused => "node 1 (the primary) frozen, as by a long GC pause",
            Scenario::Restart => {
                "a node A holds the lock on restarts with no data (RedLock: A holds a bare 3 of 5)"
            }
            Scenario::DelayedRestart => {
                "as above, but the node stays down longer than the 4 s lease"
            }
            Scenario::CutOff => {
                "A (watchdog, no lease) loses node 1 (RedLock: 3 of 5); B reaches them all"
            }
            Scenario::Stall => "A (fenced, 1 s lease) stalls 1.5 s, then writes",
        }
    }
}

/// Whether two clients held the lock at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exclusion {
    Kept,
    Lost,
    /// Two clients believed they held the lock, but the stale one's write
    /// was rejected by its fencing token.
    Fenced,
    /// A never got the lock (refused, say, by replica sync): nothing to
    /// keep, and not to be mistaken for "kept".
    Refused,
}

/// What B could do while, and after, A held the lock.
pub struct Outcome {
    pub exclusion: Exclusion,
    pub available: bool,
    /// When B got the lock; `None` when it did not.
    pub acquired: Option<Acquired>,
}

/// When B got the lock, against A's bar on the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// This long after A let go, or was told it had lost the lock: after
    /// the end of A's bar.
    AfterA(Duration),
    /// While A still believed it held the lock (its bar still ran).
    WhileA,
    /// A never held the lock: this long after B began to try.
    Alone(Duration),
}

/// One scenario on one lock type, or why it did not run.
pub enum Cell {
    Done(Outcome, Timeline, Vec<String>),
    NotApplicable(&'static str),
    Failed(String),
}

/// Who held the lock when, on one scenario's clock.
#[derive(Default)]
pub struct Timeline {
    /// `(client, from, to)`: A's span is as long as A believed it held.
    pub spans: Vec<(char, Duration, Duration)>,
    pub marks: Vec<Mark>,
    pub end: Duration,
}

/// A moment on the timeline: a fault injected, or something A did or
/// learned.
pub struct Mark {
    pub at: Duration,
    pub label: String,
    pub kind: MarkKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkKind {
    /// A server killed, frozen, restarted, cut off, promoted.
    Fault,
    /// A took, let go of, or was told it lost the lock; A stalled or wrote.
    Event,
}

/// One scenario run: its clock, its timeline, and notes for the report.
struct Run {
    t0: Instant,
    timeline: Timeline,
    notes: Vec<String>,
}

impl Run {
    fn new() -> Run {
        Run {
            t0: Instant::now(),
            timeline: Timeline::default(),
            notes: Vec::new(),
        }
    }

    fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    /// A fault, now.
    fn fault(&mut self, label: impl Into<String>) {
        self.mark_at(self.now(), label, MarkKind::Fault);
    }

    /// Something A did or learned, now.
    fn event(&mut self, label: impl Into<String>) {
        self.mark_at(self.now(), label, MarkKind::Event);
    }

    fn mark_at(&mut self, at: Duration, label: impl Into<String>, kind: MarkKind) {
        self.timeline.marks.push(Mark {
            at,
            label: label.into(),
            kind,
        });
    }
}

/// Runs one scenario on fresh servers of one lock type, then removes them.
pub async fn run_cell(s: Scenario, kind: Kind, backend: Backend) -> Cell {
    if s == Scenario::CutOff && backend == Backend::Processes {
        return Cell::NotApplicable("needs containers");
    }
    let mut topology = match Topology::start(kind, backend).await {
        Ok(t) => t,
        Err(err) => return Cell::Failed(format!("start: {err}")),
    };
    let mut run = Run::new();
    let result = scenario(s, &mut topology, &mut run).await;
    run.timeline.end = run.now();
    topology.rm().await;
    match result {
        Ok(outcome) => Cell::Done(outcome, run.timeline, run.notes),
        Err(err) => Cell::Failed(err.to_string()),
    }
}

/// The faults of each scenario, between A's grant and B's attempts.
async fn scenario(s: Scenario, t: &mut Topology, run: &mut Run) -> io::Result<Outcome> {
    let a_client = client(WATCHDOG);
    let b_client = client(WATCHDOG);
    let kind = t.kind;
    Ok(match s {
        Scenario::Failover => {
            if kind.is_single() {
                t.pair().cut_link().await?;
                run.fault("link cut");
                let a = take(run, &t.lock(&a_client), Some(LEASE)).await;
                t.server(0).kill().await?;
                run.fault("primary killed");
                t.fail_over().await?;
                run.fault("replica promoted");
                let b = t.lock_on_replica(&b_client);
                contest(
                    run,
                    a,
                    &b,
                    Duration::from_millis(1500),
                    Duration::from_millis(1500),
                )
                .await
            } else {
                let a = take(run, &t.lock(&a_client), Some(LEASE)).await;
                t.server(0).kill().await?;
                run.fault("node 1 killed");
                let b = t.lock(&b_client);
                contest(
                    run,
                    a,
                    &b,
                    Duration::from_millis(1500),
                    Duration::from_secs(2),
                )
                .await
            }
        }
        Scenario::TwoDown => {
            // Single: the primary and its replica; the others: two masters.
            let a = take(run, &t.lock(&a_client), Some(LEASE)).await;
            t.server(0).kill().await?;
            t.server(1).kill().await?;
            run.fault(if kind.is_single() {
                "primary and replica killed"
            } else {
                "nodes 1 and 2 killed"
            });
            let b = t.lock(&b_client);
            contest(
                run,
                a,
                &b,
                Duration::from_millis(1500),
                Duration::from_secs(2),
            )
            .await
        }
        Scenario::Paused => {
            let a = take(run, &t.lock(&a_client), Some(LEASE)).await;
            t.server(0).pause().await?;
            run.fault(if kind.is_single() {
                "primary paused"
            } else {
                "node 1 paused"
            });
            let b = t.lock(&b_client);
            let outcome = contest(
                run,
                a,
                &b,
                Duration::from_millis(1500),
                Duration::from_secs(2),
            )
            .await;
            t.server(0).unpause().await?;
            outcome
        }
        Scenario::Restart => {
            let a = take_bare_majority(t, run, &a_client).await?;
            let index = if kind == Kind::Multi { 1 } else { 0 };
            t.server(index).restart().await?;
            run.fault(if kind.is_single() {
                "primary restarted empty"
            } else {
                "node restarted empty"
            });
            let b = t.lock(&b_client);
            contest(run, a, &b, Duration::from_secs(3), Duration::from_secs(2)).await
        }
        Scenario::DelayedRestart => {
            // As "restarts empty", but the node stays down for longer than
            // the lease before it returns: the remedy.
            let a = take_bare_majority(t, run, &a_client).await?;
            t.server(0).kill().await?;
            run.fault("node 1 down");
            let b = t.lock(&b_client);
            let node = t.server(0);
            let delayed_restart = async {
                tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
                node.restart().await
            };
            let (outcome, restarted) = tokio::join!(
                contest(
                    run,
                    a,
                    &b,
                    LEASE + Duration::from_secs(2),
                    Duration::from_secs(2)
                ),
                delayed_restart
            );
            restarted?;
            outcome
        }
        Scenario::CutOff => {
            // Containers only (see run_cell): a process has one address.
            let a = take(run, &t.lock(&a_client), None).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let cut = match kind {
                Kind::Single | Kind::SingleSync | Kind::Multi => 1,
                Kind::Red => 3,
            };
            for i in 0..cut {
                t.server(i).partition_side(Side::A).await?;
            }
            run.fault(if cut == 1 {
                "A cut off node 1"
            } else {
                "A cut off 3 of 5"
            });
            let b = t.lock_from_other_side(&b_client);
            contest(run, a, &b, WATCHDOG * 3, Duration::from_secs(2)).await
        }
        Scenario::Stall => return stall(t, run, &a_client, &b_client).await,
    })
}

/// A takes a fenced lock with a 1 s lease and stalls for 1.5 s without
/// looking at `lost()`; B takes the lock meanwhile and writes; A's late
/// write carries the older token.
async fn stall(
    t: &mut Topology,
    run: &mut Run,
    a_client: &Client,
    b_client: &Client,
) -> io::Result<Outcome> {
    const SHORT: Duration = Duration::from_secs(1);
    let store_server = t.backend.start().await?;
    let store = FencedStore::new(store_server.url(), "data");
    let a_lock = t.lock(a_client).fenced();
    let b_lock = t.lock(b_client).fenced();
    let Ok(Some(a)) = a_lock
        .try_lock_for(Duration::from_secs(3), Some(SHORT))
        .await
    else {
        let _ = store_server.rm().await;
        return Err(io::Error::other("A could not take a free lock"));
    };
    let a_from = run.now();
    let a_token = a.fencing_token().expect("fenced");
    run.event("A stalls");
    let b_tries = run.now();
    let b_task = tokio::spawn(async move {
        let guard = try_until(&b_lock, Duration::from_secs(4), Some(LEASE)).await;
        guard.map(|g| (g, Instant::now()))
    });
    tokio::time::sleep(SHORT + Duration::from_millis(500)).await;
    let b = b_task.await.expect("B task");
    let mut outcome = Outcome {
        exclusion: Exclusion::Kept,
        available: b.is_some(),
        acquired: None,
    };
    if let Some((b, granted_at)) = b {
        let b_token = b.fencing_token().expect("fenced");
        store.write(b_token, "B").await?;
        // A wakes up, still believing it holds the lock, and writes.
        let a_applied = store.write(a_token, "A").await?;
        run.timeline.spans.push(('A', a_from, run.now()));
        run.event(if a_applied {
            "A's late write applied"
        } else {
            "A's late write rejected"
        });
        tokio::time::sleep(B_HOLDS).await;
        let _ = b.unlock().await;
        run.timeline
            .spans
            .push(('B', granted_at - run.t0, run.now()));
        outcome.acquired = acquired(&run.timeline, b_tries);
        outcome.exclusion = match (overlap(&run.timeline), a_applied) {
            (false, _) => Exclusion::Kept,
            (true, false) => Exclusion::Fenced,
            (true, true) => Exclusion::Lost,
        };
    }
    drop(a);
    let _ = store_server.rm().await;
    Ok(outcome)
}

/// A takes the lock with `lease` (`None`: the watchdog), within 3 s.
async fn take(run: &mut Run, lock: &AnyLock, lease: Option<Duration>) -> Option<Held> {
    match lock.try_lock_for(Duration::from_secs(3), lease).await {
        Ok(Some(guard)) => Some(hold(run, guard)),
        Ok(None) => {
            run.event("A: not acquired");
            None
        }
        Err(err) => {
            let short = match &err {
                Error::ReplicaSync { .. } => "A refused (no ack)".to_owned(),
                _ => "A failed".to_owned(),
            };
            run.event(short);
            run.notes.push(format!("A: {err}"));
            None
        }
    }
}

/// A takes the lock with the scenario lease. A RedLock gets a bare
/// majority: two of its nodes are frozen while it acquires, so losing one
/// of the three it holds matters.
async fn take_bare_majority(
    t: &mut Topology,
    run: &mut Run,
    a_client: &Client,
) -> io::Result<Option<Held>> {
    if t.kind != Kind::Red {
        return Ok(take(run, &t.lock(a_client), Some(LEASE)).await);
    }
    // Nodes 4 and 5 are dead while A acquires, then come back empty: A
    // holds nodes 1 to 3 only. (Frozen instead, they would grant late and
    // A's guard would adopt those grants, holding all five.)
    t.server(3).kill().await?;
    t.server(4).kill().await?;
    let a = take(run, &t.lock(a_client), Some(LEASE)).await;
    t.server(3).restart().await?;
    t.server(4).restart().await?;
    run.event("A holds 3 of 5");
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(a)
}

/// A's hold, watched in a task: it ends when `lost()` fires or A lets go.
struct Held {
    from: Duration,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(Duration, bool)>,
}

fn hold(run: &Run, guard: Guard) -> Held {
    let t0 = run.t0;
    let from = run.now();
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let lost = tokio::select! {
            _ = guard.lost() => true,
            _ = stopped => false,
        };
        let end = t0.elapsed();
        let _ = tokio::time::timeout(Duration::from_secs(1), guard.unlock()).await;
        (end, lost)
    });
    Held { from, stop, task }
}

impl Held {
    /// A lets go (or had already learned it lost the lock).
    async fn release(self, run: &mut Run) {
        let _ = self.stop.send(());
        let (to, lost) = self.task.await.expect("holder task");
        run.timeline.spans.push(('A', self.from, to));
        if lost {
            run.mark_at(to, "A told: lost", MarkKind::Event);
        }
    }
}

/// The common protocol: B tries for `while_held` while A holds; then A lets
/// go and B tries for `after` more.
async fn contest(
    run: &mut Run,
    a: Option<Held>,
    b: &AnyLock,
    while_held: Duration,
    after: Duration,
) -> Outcome {
    let phase_1 = run.now();
    let a_held = a.is_some();
    if let Some(guard) = try_until(b, while_held, Some(LEASE)).await {
        // Both may believe they hold the lock: B works, then both let go.
        b_works(run, guard).await;
        if let Some(a) = a {
            a.release(run).await;
        }
        return Outcome {
            exclusion: if overlap(&run.timeline) {
                Exclusion::Lost
            } else if a_held {
                Exclusion::Kept
            } else {
                Exclusion::Refused
            },
            available: true,
            acquired: acquired(&run.timeline, phase_1),
        };
    }
    if let Some(a) = a {
        run.event("A lets go");
        a.release(run).await;
    }
    let granted = try_until(b, after, Some(LEASE)).await;
    let available = granted.is_some();
    if let Some(guard) = granted {
        b_works(run, guard).await;
    }
    Outcome {
        exclusion: if a_held {
            Exclusion::Kept
        } else {
            Exclusion::Refused
        },
        available,
        acquired: acquired(&run.timeline, phase_1),
    }
}

/// When B got the lock, as the timeline draws it: against the end of A's
/// bar, or, when A never held it, against `b_tried`, when B began to try.
fn acquired(timeline: &Timeline, b_tried: Duration) -> Option<Acquired> {
    let granted = timeline.spans.iter().find(|s| s.0 == 'B')?.1;
    Some(match timeline.spans.iter().find(|s| s.0 == 'A') {
        Some(&(_, _, a_to)) if granted < a_to => Acquired::WhileA,
        Some(&(_, _, a_to)) => Acquired::AfterA(granted - a_to),
        None => Acquired::Alone(granted.saturating_sub(b_tried)),
    })
}

/// Tries until granted or `wait` is spent; errors (no quorum, replica
/// sync, node down) count as "not now".
pub async fn try_until(lock: &AnyLock, wait: Duration, lease: Option<Duration>) -> Option<Guard> {
    let started = Instant::now();
    let attempt = || async {
        let left = wait.saturating_sub(started.elapsed());
        let attempt = lock.try_lock_for(left.min(Duration::from_millis(500)), lease);
        attempt.await.ok().flatten()
    };
    poll_until(wait, || "not granted".to_owned(), attempt)
        .await
        .ok()
}

/// B holds the lock for a moment, then releases it.
async fn b_works(run: &mut Run, guard: Guard) {
    let from = run.now();
    tokio::time::sleep(B_HOLDS).await;
    run.timeline.spans.push(('B', from, run.now()));
    let _ = guard.unlock().await;
}

/// Whether an A span and a B span overlap.
fn overlap(timeline: &Timeline) -> bool {
    let spans = |who| timeline.spans.iter().filter(move |s| s.0 == who);
    spans('A').any(|a| spans('B').any(|b| b.1 < a.2 && a.1 < b.2))
}
