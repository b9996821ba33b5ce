//! (f) Degraded: a RedLock on the 5 servers, healthy, then with one and two
//! of them frozen (SIGSTOP: connections stay open, nothing is answered) and
//! two of them dead (killed: connection refused), one state after the other
//! on the same processes. In each state:
//!
//! - multilock's uncontended lock+unlock: the first one after the fault,
//!   then, after a warm-up that lets node health mark the impaired nodes
//!   suspect, the steady state;
//! - critical sections completed in a fixed window by 6 contenders, each
//!   with its own client and nodes (as separate processes would), on one
//!   lock, once each has taken it alone (the steady state again): hold 1 ms,
//!   release, step back until another contender was granted, so every grant
//!   goes to a waiter;
//! - rslock's uncontended lock+unlock on the same servers, each call under
//!   a timeout so that a frozen server cannot hang the run.
//!
//! Between states every server is resumed or restarted, and the next state
//! starts once the servers answer and the nodes are healthy again.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use multilock::{Client, Health, Node};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::contenders::{AnyLock, Contender, DRAIN_LIMIT, join_within};
use crate::latency_cdf::Panel;
use crate::report::{Grid, Report, group};
use crate::stats::{Latencies, nanos};
use crate::{BenchResult, LEASE, SERVERS, Servers, Settings};

/// Contenders on the one lock of the contended figure.
const CONTENDERS: usize = 6;
/// How long a contender holds the lock: its critical section.
const CRITICAL_SECTION: Duration = Duration::from_millis(1);
/// Each rslock lock+unlock gets this long. On a frozen server it waits for
/// its connection's response timeout (redis-rs' default, 500 ms) twice: on
/// `SET` and on the release.
const RSLOCK_CALL_LIMIT: Duration = Duration::from_secs(2);
/// A multilock lock+unlock that takes this long counts as failed (it
/// should never come near).
const OURS_CALL_LIMIT: Duration = Duration::from_secs(10);
/// How long restored servers get to answer and their nodes to be healthy.
const RECOVERY_LIMIT: Duration = Duration::from_secs(20);

/// The state of the servers during one part of the section.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    Healthy,
    /// The last `k` servers stopped with SIGSTOP.
    Frozen(usize),
    /// The last `k` servers killed: connections are refused.
    Dead(usize),
}

impl Fault {
    const ALL: [Fault; 4] = [
        Fault::Healthy,
        Fault::Frozen(1),
        Fault::Frozen(2),
        Fault::Dead(2),
    ];

    fn label(self) -> String {
        match self {
            Fault::Healthy => "healthy".into(),
            Fault::Frozen(k) => format!("{k} of {SERVERS} frozen"),
            Fault::Dead(k) => format!("{k} of {SERVERS} dead"),
        }
    }

    /// The servers it impairs: the last ones.
    fn impaired(self) -> Range<usize> {
        match self {
            Fault::Healthy => SERVERS..SERVERS,
            Fault::Frozen(k) | Fault::Dead(k) => SERVERS - k..SERVERS,
        }
    }

    async fn inject(self, servers: &mut Servers) -> BenchResult {
        for i in self.impaired() {
            match self {
                Fault::Healthy => {}
                Fault::Frozen(_) => servers.pause(i).await?,
                Fault::Dead(_) => servers.kill(i).await?,
            }
        }
        Ok(())
    }

    async fn repair(self, servers: &mut Servers) -> BenchResult {
        for i in self.impaired() {
            match self {
                Fault::Healthy => {}
                Fault::Frozen(_) => servers.unpause(i).await?,
                Fault::Dead(_) => servers.restart(i).await?,
            }
        }
        Ok(())
    }
}

/// What one state measured.
pub struct DegradedRun {
    pub state: String,
    pub impaired: bool,
    /// The first multilock lock+unlock after the fault, µs.
    first: Option<f64>,
    /// multilock's uncontended lock+unlock after the warm-up.
    pub ours: Timed,
    /// Critical sections the contenders completed in the window.
    pub sections: usize,
    contended: ContendedRun,
    rslock: Timed,
}

/// An uncontended series: every call's time (a failed call's too), and how
/// many calls failed or ran out of time.
#[derive(Default)]
pub struct Timed {
    pub latencies: Latencies,
    pub failures: usize,
}

/// Every state in turn, on the same servers; one table and one CDF panel.
pub async fn degraded(
    settings: &Settings,
    servers: &mut Servers,
    report: &mut Report,
) -> BenchResult {
    let client = Client::new();
    let nodes = servers.nodes(SERVERS)?;
    let manager = servers.rslock(SERVERS);
    let mut runs: Vec<DegradedRun> = Vec::new();
    for (index, fault) in Fault::ALL.into_iter().enumerate() {
        let name = |who: &str| format!("bench:degraded:{index}:{who}");
        let red = client.red_lock_on(&nodes, name("multilock"))?;
        let fresh_lock = {
            let (client, nodes) = (client.clone(), nodes.clone());
            move |attempt: usize| {
                let name = format!("bench:degraded:{index}:multilock:{attempt}");
                let red = client
                    .red_lock_on(&nodes, name)
                    .expect("five distinct nodes");
                Contender::multilock(AnyLock::Red(red))
            }
        };

        // rslock has no state to settle once the fault is there: every call
        // pays it. Its warm-up (connections made) comes before.
        time_calls(
            rslock_lock(&manager, name("rslock-warm-up")),
            settings.warmup,
            0,
            None,
            RSLOCK_CALL_LIMIT,
        )
        .await?;
        fault.inject(servers).await?;
        let first = if fault == Fault::Healthy {
            None
        } else {
            let first = Contender::multilock(AnyLock::Red(red.clone()));
            let timed = time_calls(move |_| first.clone(), 0, 1, None, OURS_CALL_LIMIT).await?;
            Some(timed.latencies.p50())
        };
        let ours = time_calls(
            fresh_lock,
            settings.warmup,
            settings.iterations,
            None,
            OURS_CALL_LIMIT,
        )
        .await?;
        let still_healthy: Vec<&str> = fault
            .impaired()
            .filter(|&i| nodes[i].health() == Health::Healthy)
            .map(|i| nodes[i].addr())
            .collect();
        if !still_healthy.is_empty() {
            report.notes.push(format!(
                "(f) {}: after the warm-up, {} still counted healthy.",
                fault.label(),
                still_healthy.join(", ")
            ));
        }
        let contended = contend(
            servers,
            &name("contended"),
            fault.impaired(),
            settings.degraded_window,
        )
        .await?;
        if !contended.steady {
            report.notes.push(format!(
                "(f) {}: after their warm-up, some contenders still counted an impaired node \
                 healthy.",
                fault.label()
            ));
        }
        let rslock = time_calls(
            rslock_lock(&manager, name("rslock")),
            0,
            settings.iterations,
            Some(settings.degraded_window),
            RSLOCK_CALL_LIMIT,
        )
        .await?;

        fault.repair(servers).await?;
        let recovered = wait_until_healthy(servers, &nodes).await?;
        if fault != Fault::Healthy {
            report.notes.push(format!(
                "(f) {}: the servers answered and the nodes were healthy {:.0} ms after the \
                 repair ({}).",
                fault.label(),
                recovered.as_secs_f64() * 1e3,
                match fault {
                    Fault::Dead(_) => "restarted, empty",
                    _ => "SIGCONT",
                }
            ));
        }
        runs.push(DegradedRun {
            state: fault.label(),
            impaired: fault != Fault::Healthy,
            first,
            ours,
            sections: contended.sections,
            contended,
            rslock,
        });
    }
    publish(settings, runs, report);
    Ok(())
}

/// rslock through `manager`, on lock `resource` and after each failure a
/// fresh one.
fn rslock_lock(
    manager: &rslock::LockManager,
    resource: String,
) -> impl Fn(usize) -> Contender + Send + 'static {
    let manager = manager.clone();
    move |attempt| Contender::Rslock {
        manager: manager.clone(),
        resource: format!("{resource}:{attempt}"),
    }
}

/// The table, the notes and the CDF panel of every state.
fn publish(settings: &Settings, runs: Vec<DegradedRun>, report: &mut Report) {
    let mut grid = Grid::new(
        "(f) Degraded: RedLock on 5 nodes with nodes frozen or dead",
        &format!(
            "one run, the same {SERVERS} servers: frozen = SIGSTOP (connections open, no \
             answer), dead = killed (connection refused); the last servers are the impaired \
             ones. multilock: uncontended lock+unlock (30 s lease) after a warm-up of {} \
             (node health has marked the impaired nodes suspect: the steady state), {} \
             timed; first = the first lock+unlock after the fault. Critical sections: {} \
             contenders, each with its own client and nodes, on one lock, each warmed up by \
             taking it alone; then hold {} ms, release, step back until another was granted; \
             completed in {:.1} s after a warm-up tenth. rslock: lock + unlock, warmed up before the fault (it has no \
             node health to settle), each call under a {} s timeout, as many as fit in \
             {:.1} s (at most {}, at least one); a timed-out call counts as a failure with \
             its time as a sample. Ratios are to the healthy state",
            settings.warmup,
            settings.iterations,
            CONTENDERS,
            CRITICAL_SECTION.as_millis(),
            settings.degraded_window.as_secs_f64() * 0.9,
            RSLOCK_CALL_LIMIT.as_secs(),
            settings.degraded_window.as_secs_f64(),
            settings.iterations,
        ),
        &[
            "state",
            "multilock p50 (µs)",
            "p99 (µs)",
            "p50 ÷ healthy",
            "first after the fault (µs)",
            &format!("critical sections ({CONTENDERS} tasks)"),
            "÷ healthy",
            "rslock p50 (µs)",
            "rslock p99 (µs)",
            "rslock failures",
        ],
    );
    let healthy = runs.iter().find(|run| !run.impaired);
    let (p50_healthy, sections_healthy) = healthy.map_or((f64::NAN, f64::NAN), |h| {
        (h.ours.latencies.p50(), h.sections as f64)
    });
    let ratio = |ours: f64, healthy: f64| {
        if ours.is_finite() && healthy > 0.0 {
            format!("{:.2}×", ours / healthy)
        } else {
            "–".into()
        }
    };
    let micros = |value: f64| {
        if value.is_finite() {
            format!("{value:.0}")
        } else {
            "–".into()
        }
    };
    let mut panel = Panel::new("Degraded: RedLock lock+unlock, 5 nodes".into());
    for run in &runs {
        let ours = &run.ours.latencies;
        grid.row(vec![
            run.state.clone(),
            micros(ours.p50()),
            micros(ours.p99()),
            ratio(ours.p50(), p50_healthy),
            run.first.map_or("–".into(), micros),
            group(run.sections as f64),
            ratio(run.sections as f64, sections_healthy),
            micros(run.rslock.latencies.p50()),
            micros(run.rslock.latencies.p99()),
            format!(
                "{} of {}",
                run.rslock.failures,
                run.rslock.latencies.0.len()
            ),
        ]);
        panel.add(format!("multilock, {}", run.state), ours.clone());
        let contended = &run.contended;
        report.notes.push(format!(
            "(f) {}: multilock failed {} of {} uncontended lock+unlocks; the contenders' \
             grants per contender {:?}, {} failed acquires or releases, {} overlapping holds \
             seen.",
            run.state,
            run.ours.failures,
            ours.0.len(),
            contended.per_contender,
            contended.failures,
            contended.overlaps,
        ));
    }
    report.grids.push(grid);
    report.panels.push(panel);
    if let Some(healthy) = runs.iter().find(|run| !run.impaired) {
        let (p50, sections) = (healthy.ours.latencies.p50(), healthy.sections as f64);
        for run in runs.iter().filter(|run| run.impaired) {
            let ours = run.ours.latencies.p50();
            report.target(
                "(f)",
                format!("5-node RedLock p50 with {} ≤ 1.5 × healthy", run.state),
                format!("{ours:.1} µs vs {p50:.1} µs: {:.2}×", ours / p50),
                ours <= 1.5 * p50,
            );
            let ours = run.sections as f64;
            report.target(
                "(f)",
                format!(
                    "critical sections of 6 contenders with {} ≥ 0.8 × healthy",
                    run.state
                ),
                format!(
                    "{} vs {}: {:.2}×",
                    group(ours),
                    group(sections),
                    ours / sections
                ),
                ours >= 0.8 * sections,
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Uncontended

/// Times lock+unlocks one after the other in a task of its own (the crate's
/// default owner is the task): `warmup` untimed, then `iterations` timed, or
/// as many as fit in `budget` (at least one; the warm-up gets a tenth of
/// it). Each call gets `limit`; a call that fails or runs out of time
/// counts as a failure, its time as a sample, and the next calls go to a
/// fresh lock (`make(failures)`): the failed one may still be held.
async fn time_calls(
    make: impl Fn(usize) -> Contender + Send + 'static,
    warmup: usize,
    iterations: usize,
    budget: Option<Duration>,
    limit: Duration,
) -> BenchResult<Timed> {
    let task = tokio::spawn(async move {
        let mut locks_made = 0;
        let mut contender = make(locks_made);
        let mut failures = 0;
        let started = Instant::now();
        for _ in 0..warmup {
            if budget.is_some_and(|budget| started.elapsed() >= budget / 10) {
                break;
            }
            if !lock_unlock_within(&contender, limit).await {
                locks_made += 1;
                contender = make(locks_made);
            }
        }
        let started = Instant::now();
        let mut samples = Vec::with_capacity(iterations);
        while samples.len() < iterations
            && (samples.is_empty() || budget.is_none_or(|budget| started.elapsed() < budget))
        {
            let op = Instant::now();
            let ok = lock_unlock_within(&contender, limit).await;
            samples.push(nanos(op.elapsed()));
            if !ok {
                failures += 1;
                locks_made += 1;
                contender = make(locks_made);
            }
        }
        Timed {
            latencies: Latencies::new(samples),
            failures,
        }
    });
    Ok(task.await?)
}

/// One lock+unlock within `limit`: whether it succeeded in time.
async fn lock_unlock_within(contender: &Contender, limit: Duration) -> bool {
    matches!(
        tokio::time::timeout(limit, contender.lock_unlock()).await,
        Ok(Ok(()))
    )
}

// ---------------------------------------------------------------------------
// Contended

/// The contenders' run on one lock.
struct ContendedRun {
    /// Every contender counted the impaired nodes suspect after its warm-up.
    steady: bool,
    sections: usize,
    per_contender: Vec<usize>,
    failures: usize,
    overlaps: usize,
}

/// [`CONTENDERS`] contenders, each with its own client and nodes, on lock
/// `name` for `window`: acquire, hold [`CRITICAL_SECTION`], release, then
/// step back until another was granted (at most 500 ms). Counts the
/// critical sections granted after the first tenth and completed, with their
/// release, within the window.
///
/// First, each contender takes and releases the lock alone, one after the
/// other: its connections are made, and its nodes find the `impaired`
/// servers out (the steady state). Without it, the first rounds, which
/// contenders starting together split between them, wait for a frozen
/// server's answer up to the per-node timeout (500 ms): a lost round that
/// could still win with that answer waits for it.
async fn contend(
    servers: &Servers,
    name: &str,
    impaired: Range<usize>,
    window: Duration,
) -> BenchResult<ContendedRun> {
    let mut locks = Vec::with_capacity(CONTENDERS);
    let mut watched = Vec::new();
    for _ in 0..CONTENDERS {
        let nodes = servers.nodes(SERVERS)?;
        let red = Client::new().red_lock_on(&nodes, name)?;
        let alone = red.clone();
        let _ = tokio::spawn(async move {
            let guard = tokio::time::timeout(OURS_CALL_LIMIT, alone.lock_with_lease(LEASE)).await;
            if let Ok(Ok(guard)) = guard {
                let _ = tokio::time::timeout(OURS_CALL_LIMIT, guard.unlock()).await;
            }
        })
        .await;
        watched.extend(nodes[impaired.clone()].iter().cloned());
        locks.push(red);
    }
    let steady = {
        let started = Instant::now();
        loop {
            let suspect = watched.iter().all(|node| node.health() != Health::Healthy);
            if suspect || started.elapsed() > Duration::from_secs(2) {
                break suspect;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };

    let start = Instant::now();
    let counted_from = start + window / 10;
    let stop_at = start + window;
    let (grants, _) = watch::channel(0u64);
    let grants = Arc::new(grants);
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    let counts: Vec<Arc<AtomicUsize>> = (0..CONTENDERS).map(|_| Arc::default()).collect();
    for (red, count) in locks.into_iter().zip(&counts) {
        let (grants, inside, overlaps, failures, count) = (
            grants.clone(),
            inside.clone(),
            overlaps.clone(),
            failures.clone(),
            count.clone(),
        );
        set.spawn(async move {
            let mut others = grants.subscribe();
            while Instant::now() < stop_at {
                let guard =
                    match tokio::time::timeout_at(stop_at.into(), red.lock_with_lease(LEASE)).await
                    {
                        Ok(Ok(guard)) => guard,
                        Ok(Err(_)) => {
                            failures.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                        Err(_) => break,
                    };
                let granted = Instant::now();
                let mut grant = 0;
                grants.send_modify(|count| {
                    *count += 1;
                    grant = *count;
                });
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(CRITICAL_SECTION).await;
                inside.store(false, Ordering::SeqCst);
                let released = guard.unlock().await;
                if released.is_err() {
                    failures.fetch_add(1, Ordering::Relaxed);
                } else if granted >= counted_from && Instant::now() <= stop_at {
                    count.fetch_add(1, Ordering::Relaxed);
                }
                let next = others.wait_for(|count| *count > grant);
                let _ = tokio::time::timeout(Duration::from_millis(500), next).await;
            }
            BenchResult::Ok(())
        });
    }
    join_within(set, DRAIN_LIMIT).await?;
    let per_contender: Vec<usize> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    Ok(ContendedRun {
        steady,
        sections: per_contender.iter().sum(),
        per_contender,
        failures: failures.load(Ordering::Relaxed),
        overlaps: overlaps.load(Ordering::Relaxed),
    })
}

// ---------------------------------------------------------------------------
// Recovery

/// Polls until every server answers a PING and every node is healthy again
/// (its probe found it back); returns how long that took.
async fn wait_until_healthy(servers: &Servers, nodes: &[Node]) -> BenchResult<Duration> {
    let started = Instant::now();
    loop {
        let mut answering = true;
        for i in 0..SERVERS {
            answering &= servers.ping(i).await.is_ok();
        }
        if answering && nodes.iter().all(|node| node.health() == Health::Healthy) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > RECOVERY_LIMIT {
            return Err(
                format!("the nodes were not healthy again after {RECOVERY_LIMIT:?}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
