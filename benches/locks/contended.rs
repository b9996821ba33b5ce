//! (b) One contended lock on one node: K tasks acquire and release it in a
//! loop, either tight (the releaser races the waiters) or handing off (every
//! grant goes to a parked waiter). Measures the hand-off from one holder's
//! `unlock()` call to the next holder's grant, throughput, fairness and the
//! server's CPU per grant.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use multilock::{Client, Node, Owner};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::contenders::{AnyLock, Contender, DRAIN_LIMIT, join_within};
use crate::latency_cdf::Panel;
use crate::report::{Cell, Report, Table, Unit, group};
use crate::stats::{Latencies, nanos};
use crate::{BenchResult, CONTENDED_TASKS, Servers, Settings};

/// For each K, a tight and a hand-off loop of multilock's Lock, rslock
/// with its default retries, and rslock with each retry delay of the sweep.
/// `cycle`: the Redisson 3.24+ limit's 1-node lock+unlock p50 (µs; NaN when
/// (a) did not run), what a hand-off is held to.
pub async fn contended(
    settings: &Settings,
    servers: &Servers,
    cycle: f64,
    report: &mut Report,
) -> BenchResult {
    let client = Client::new();
    let node = Node::new(&servers.urls[0])?;
    let delays: Vec<String> = settings
        .rslock_delays
        .iter()
        .map(|d| format!("{} ms", d.as_millis()))
        .collect();
    let mut table = Table::new(
        "(b) Contended: K tasks on one lock (1 node), acquire → release in a loop",
        &format!(
            "tight loop: each task releases at once and acquires again at once; hand-off loop: \
             each task holds 1 ms, releases, and steps back until another task was granted, so \
             every grant goes to a parked waiter. Hand-off = another task's grant after the \
             holder's `unlock()` call (one clock; its p50, p99 and mean are over the hand-offs \
             to another task); re-grants = grants straight back to the task that had just \
             released; the Redisson cycle = the Redisson 3.24+ limit's 1-node lock+unlock p50 \
             ({cycle:.1} µs): a hand-off is a release, a message and an acquire, about one \
             cycle; Redis CPU = the server's user+system CPU time over the run (INFO cpu) per \
             grant; rslock tuned = unlimited retries and the retry delay, of {}, with the \
             lowest hand-off p50",
            delays.join(", ")
        ),
        &["Redisson cycle", "rslock default", "rslock tuned"],
    );
    for &k in &settings.tasks {
        for pace in [Pace::Tight, Pace::HandOff] {
            let case = match pace {
                Pace::Tight => format!("K={k}, tight loop"),
                Pace::HandOff => format!("K={k}, hand-off loop"),
            };
            let name = |who: &str| format!("bench:handoff:{case}:{who}");
            let ours = client.lock(&node, name("multilock"))?;
            let ours = Contender::multilock(AnyLock::Single(ours));
            // The hand-off target holds in every run: K=8 hands off in
            // several runs, each judged.
            let runs = if pace == Pace::HandOff && k == CONTENDED_TASKS {
                settings.handoff_runs
            } else {
                1
            };
            let mut judged = Vec::with_capacity(runs);
            for _ in 0..runs {
                judged.push(contend_on(servers, &ours, k, settings.run_for, pace).await?);
            }
            if pace == Pace::HandOff && k == CONTENDED_TASKS && cycle.is_finite() {
                let p50s: Vec<f64> = judged.iter().map(|run| run.handoffs.p50()).collect();
                let means: Vec<f64> = judged.iter().map(|run| run.handoffs.mean()).collect();
                let listed = |values: &[f64]| {
                    values
                        .iter()
                        .map(|v| format!("{v:.0}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                report.target(
                    "(b)",
                    format!(
                        "contended hand-off p50, from the `unlock()` call to the next grant, ≤ 2 \
                         × the Redisson 3.24+ cycle, every run ({case})"
                    ),
                    format!(
                        "p50 of each of {runs} runs {} µs vs 2 × {cycle:.1} µs: worst {:.2}× \
                         (means {} µs)",
                        listed(&p50s),
                        p50s.iter().copied().fold(f64::NAN, f64::max) / cycle,
                        listed(&means)
                    ),
                    p50s.iter().all(|p50| *p50 <= 2.0 * cycle),
                );
            }
            let ours = judged.swap_remove(0);
            let default = Contender::Rslock {
                manager: servers.rslock(1),
                resource: name("rslock"),
            };
            let default = contend_on(servers, &default, k, settings.run_for, pace).await?;
            let mut tuned: Option<(Duration, Contention)> = None;
            for &delay in &settings.rslock_delays {
                let mut manager = servers.rslock(1);
                manager.set_retry(u32::MAX, delay);
                let contender = Contender::Rslock {
                    manager,
                    resource: name(&format!("rslock-{}", delay.as_millis())),
                };
                let run = contend_on(servers, &contender, k, settings.run_for, pace).await?;
                report.notes.push(format!(
                    "(b) {case}, rslock retry delay {delay:?}: hand-off p50 {:.1} µs, p99 \
                     {:.1} µs, mean {:.1} µs, {} acquisitions/s, {:.0} % re-grants, Redis CPU {:.1} µs per \
                     acquisition.",
                    run.handoffs.p50(),
                    run.handoffs.p99(),
                    run.handoffs.mean(),
                    group(run.per_second),
                    run.regrants,
                    run.server_cpu
                ));
                if tuned
                    .as_ref()
                    .is_none_or(|(_, best)| run.handoffs.p50() < best.handoffs.p50())
                {
                    tuned = Some((delay, run));
                }
            }

            let mut figures: Vec<Figure> = vec![
                ("hand-off p50 (µs)", Unit::Micros, |c| c.handoffs.p50()),
                ("hand-off p99 (µs)", Unit::Micros, |c| c.handoffs.p99()),
                ("hand-off mean (µs)", Unit::Micros, |c| c.handoffs.mean()),
                ("acquisitions/s", Unit::PerSecond, |c| c.per_second),
                ("Redis CPU per acquisition (µs)", Unit::Micros, |c| {
                    c.server_cpu
                }),
            ];
            if pace == Pace::Tight {
                figures.push(("re-grants (%)", Unit::Percent, |c| c.regrants));
            }
            for (figure, unit, pick) in figures {
                let rtt = figure.starts_with("hand-off").then(|| Cell::of(cycle));
                let tuned = tuned.as_ref().map(|(delay, run)| {
                    Cell::noted(pick(run), format!("{} ms", delay.as_millis()))
                });
                table.row(
                    format!("{case}: {figure}"),
                    unit,
                    Cell::of(pick(&ours)),
                    vec![rtt, Some(Cell::of(pick(&default))), tuned],
                );
            }
            if pace == Pace::HandOff && settings.tasks.last() == Some(&k) {
                let mut panel = Panel::new(format!("Contended hand-off, {case}, 1 node"));
                panel.add("multilock Lock".into(), ours.handoffs.clone());
                panel.add("rslock default".into(), default.handoffs.clone());
                if let Some((delay, run)) = &tuned {
                    let label = format!("rslock tuned ({} ms)", delay.as_millis());
                    panel.add(label, run.handoffs.clone());
                }
                report.panels.push(panel);
            }
        }
    }
    report.tables.push(table);
    fair_handoff(settings, servers, &client, &node, report).await
}

/// (b) The fair lock's hand-off, K=8: every grant goes to the head of the
/// queue, woken on its own channel. Held to 2 × the cycle of Redisson's own
/// fair-lock scripts on a bare connection, measured in the same run.
async fn fair_handoff(
    settings: &Settings,
    servers: &Servers,
    client: &Client,
    node: &Node,
    report: &mut Report,
) -> BenchResult {
    let cycle = fair_limit_cycle(servers, settings.iterations).await?;
    let fair = client.fair_lock(node, "bench:handoff:fair:multilock")?;
    let fair = Contender::multilock(AnyLock::Single(fair));
    let mut p50s = Vec::with_capacity(settings.handoff_runs);
    let mut notes = Vec::new();
    for _ in 0..settings.handoff_runs {
        let run = contend_on(
            servers,
            &fair,
            CONTENDED_TASKS,
            settings.run_for,
            Pace::HandOff,
        )
        .await?;
        p50s.push(run.handoffs.p50());
        notes.push(format!(
            "p50 {:.0} µs, p99 {:.0} µs, {} acquisitions/s, Redis CPU {:.1} µs per acquisition",
            run.handoffs.p50(),
            run.handoffs.p99(),
            group(run.per_second),
            run.server_cpu
        ));
    }
    let worst = p50s.iter().copied().fold(f64::NAN, f64::max);
    report.target(
        "(b)",
        format!(
            "fair-lock contended hand-off p50 (K={CONTENDED_TASKS}, hand-off loop) ≤ 2 × the \
             Redisson fair-lock cycle, every run"
        ),
        format!(
            "worst p50 {worst:.0} µs vs 2 × {cycle:.1} µs: {:.2}× ({})",
            worst / cycle,
            notes.join("; ")
        ),
        p50s.iter().all(|p50| *p50 <= 2.0 * cycle),
    );
    Ok(())
}

/// The p50 (µs) of an uncontended lock+unlock of Redisson's fair lock as
/// its client sends it on a bare connection: the acquire, the unlock with
/// its latch, and the latch's DEL not awaited.
async fn fair_limit_cycle(servers: &Servers, iterations: usize) -> BenchResult<f64> {
    use multilock_testkit::{redisson, redisson_fair};
    let mut conn = servers.bare_connections(1).await?.remove(0);
    let (name, field) = (
        "bench:handoff:fair:limit",
        "6f1c0e9a-1111-2222-3333-444455556666:1",
    );
    let wait = redisson_fair::DEFAULT_WAIT;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let now = redisson_fair::now_ms();
        let taken: Option<i64> = redisson_fair::acquire(name, field, crate::LEASE, wait, now)
            .invoke_async(&mut conn)
            .await?;
        if taken.is_some() {
            return Err(format!("the fair limit found {name} taken").into());
        }
        let request = redisson::new_request_id();
        let released: Option<i64> =
            redisson_fair::release(name, field, &request, crate::LEASE, redisson_fair::now_ms())
                .invoke_async(&mut conn)
                .await?;
        if released != Some(1) {
            return Err(format!("the fair limit did not hold {name}").into());
        }
        crate::contenders::delete_latch_unawaited(&conn, name, &request).await?;
        samples.push(nanos(started.elapsed()));
    }
    Ok(Latencies::new(samples).p50())
}

/// A row of the contended table: its name, unit, and how to read it.
type Figure = (&'static str, Unit, fn(&Contention) -> f64);

/// How the tasks of a contended case loop.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Release at once and acquire again at once: the releaser races the
    /// waiters.
    Tight,
    /// Hold for [`HOLD`], release, then step back until another task was
    /// granted: every grant goes to a task that was already waiting, so the
    /// hand-off is the waiters' wake-up alone.
    HandOff,
}

/// How long a hand-off loop holds the lock: long enough for every other
/// task to be parked when it is released.
const HOLD: Duration = Duration::from_millis(1);

/// One hold in a contended run.
struct Hold {
    task: usize,
    granted: Instant,
    /// When the holder called its release.
    releasing: Instant,
    /// The crate's hold's owner (see [`crate::contenders::Held::owner`]).
    owner: Option<Owner>,
}

/// The outcome of K tasks fighting over one lock.
pub struct Contention {
    /// Hand-offs to another task: its grant after the previous holder's
    /// release call.
    pub handoffs: Latencies,
    /// Share of grants that went straight back to the task that had just
    /// released (barging), in %.
    regrants: f64,
    per_second: f64,
    /// Grants over the whole run, warm-up and drain included.
    pub grants: u64,
    /// Grants after the warm-up tenth, before the end of the run.
    pub counted: usize,
    /// The owners of the counted grants, for the crate's locks (each
    /// acquire has an owner of its own).
    pub counted_owners: Vec<Owner>,
    /// Server CPU per grant, µs (set by the caller, who reads INFO cpu).
    server_cpu: f64,
}

/// K tasks acquire and release one lock in a loop for `run_for`; the first
/// tenth is warm-up.
pub async fn contend(
    contender: &Contender,
    tasks: usize,
    run_for: Duration,
    pace: Pace,
) -> BenchResult<Contention> {
    let start = Instant::now();
    let counted_from = start + run_for / 10;
    let stop_at = start + run_for;
    let holds = Arc::new(Mutex::new(Vec::new()));
    let (grants, _) = watch::channel(0u64);
    let grants = Arc::new(grants);
    let mut set = JoinSet::new();
    for task in 0..tasks {
        let contender = contender.clone();
        let holds = holds.clone();
        let grants = grants.clone();
        set.spawn(async move {
            let mut others = grants.subscribe();
            loop {
                let held = contender.acquire().await?;
                let granted = Instant::now();
                let owner = held.owner();
                let mut grant = 0;
                grants.send_modify(|count| {
                    *count += 1;
                    grant = *count;
                });
                if pace == Pace::HandOff {
                    tokio::time::sleep(HOLD).await;
                }
                let releasing = Instant::now();
                contender.release(held).await?;
                if granted >= stop_at {
                    return BenchResult::Ok(());
                }
                if granted >= counted_from {
                    let mut holds = holds.lock().expect("no task panics holding it");
                    holds.push(Hold {
                        task,
                        granted,
                        releasing,
                        owner,
                    });
                }
                if pace == Pace::HandOff {
                    // Bounded: near the end, the others may have left.
                    let next = others.wait_for(|count| *count > grant);
                    let _ = tokio::time::timeout(Duration::from_millis(500), next).await;
                }
            }
        });
    }
    join_within(set, DRAIN_LIMIT).await?;

    let mut holds = std::mem::take(&mut *holds.lock().expect("no task panics holding it"));
    holds.sort_unstable_by_key(|hold| hold.granted);
    let counted_owners = holds.iter().filter_map(|hold| hold.owner.clone()).collect();
    let (mut regrants, mut gaps) = (0, Vec::with_capacity(holds.len()));
    for pair in holds.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        if after.task == before.task {
            regrants += 1;
            continue;
        }
        // A grant never precedes the release call of the hold before it.
        gaps.push(nanos(
            after.granted.saturating_duration_since(before.releasing),
        ));
    }
    Ok(Contention {
        handoffs: Latencies::new(gaps),
        regrants: 100.0 * regrants as f64 / holds.len().saturating_sub(1).max(1) as f64,
        per_second: holds.len() as f64 / (stop_at - counted_from).as_secs_f64(),
        grants: *grants.borrow(),
        counted: holds.len(),
        counted_owners,
        server_cpu: f64::NAN,
    })
}

/// [`contend`] on the first server, with the server's CPU time per grant.
async fn contend_on(
    servers: &Servers,
    contender: &Contender,
    tasks: usize,
    run_for: Duration,
    pace: Pace,
) -> BenchResult<Contention> {
    let cpu_before = servers.cpu_seconds(0).await?;
    let mut run = contend(contender, tasks, run_for, pace).await?;
    let cpu = servers.cpu_seconds(0).await? - cpu_before;
    run.server_cpu = cpu * 1e6 / run.grants.max(1) as f64;
    Ok(run)
}
