//! (c) Many keys: K tasks, each on its own lock, lock+unlock in a loop;
//! acquisitions per second on 1 node (Lock) and 5 nodes (RedLock).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use multilock::Client;
use tokio::task::JoinSet;

use crate::contenders::{AnyLock, Contender, DRAIN_LIMIT, Limit, join_within};
use crate::report::{Cell, ManyKeysTarget, Report, Table, Unit, group};
use crate::{BenchResult, MANY_KEYS_TASKS, Servers, Settings};

/// Each contender's acquisitions per second for every K, on 1 and 5 nodes.
pub async fn many_keys(settings: &Settings, servers: &Servers, report: &mut Report) -> BenchResult {
    let mut table = Table::new(
        "(c) Many keys: K tasks, each on its own lock, acquisitions/s",
        &format!(
            "1 node: Lock; 5 nodes: RedLock. Each contender shares one client / manager / set of \
             connections between its tasks: the limit's K tasks send their EVALSHAs over one \
             multiplexed connection per node (clones of one redis-rs MultiplexedConnection \
             share its socket, and pipeline). 1 node, K={MANY_KEYS_TASKS}: {} rounds of {} ms, \
             the three contenders taking turns (each round starting with the next one), each \
             contender's median over the rounds; every other case: one run \
             of {} ms. Each run's first tenth is a warm-up, not counted",
            settings.many_keys_rounds.0,
            settings.many_keys_rounds.1.as_millis(),
            settings.run_for.as_millis()
        ),
        &["limit", "rslock"],
    );
    let client = Client::new();
    for n in [1, 5] {
        let nodes = servers.nodes(n)?;
        let conns = servers.bare_connections(n).await?;
        let manager = servers.rslock(n);
        for &k in &settings.tasks {
            let name = |who: &str, i: usize| format!("bench:many:{n}:{k}:{who}:{i}");
            let contender = |who: usize, i: usize| -> BenchResult<Contender> {
                Ok(match who {
                    OURS if n == 1 => Contender::multilock(AnyLock::Single(
                        client.lock(&nodes[0], name("ours", i))?,
                    )),
                    OURS => Contender::multilock(AnyLock::Red(
                        client.red_lock_on(&nodes, name("ours", i))?,
                    )),
                    LIMIT => Contender::Limit(Limit::new(conns.clone(), name("limit", i))),
                    _ => Contender::Rslock {
                        manager: manager.clone(),
                        resource: name("rslock", i),
                    },
                })
            };
            let target = n == 1 && k == MANY_KEYS_TASKS;
            let (rounds, run_for) = if target {
                settings.many_keys_rounds
            } else {
                (1, settings.run_for)
            };
            // Per contender, acquisitions/s in each round; each round starts
            // with the next contender.
            let mut rates = [const { Vec::new() }; 3];
            for round in 0..rounds {
                for turn in 0..3 {
                    let who = (round + turn) % 3;
                    let rate = many_locks(|i| contender(who, i), k, run_for).await?;
                    rates[who].push(rate);
                }
            }
            let what = if n == 1 {
                "1 node, Lock"
            } else {
                "5 nodes, RedLock"
            };
            let case = format!("{what}, K={k}");
            let [ours, limit, rslock] = rates.each_ref().map(|rates| median(rates));
            report.many_keys.push((case.clone(), ours, limit));
            table.row(
                case.clone(),
                Unit::PerSecond,
                Cell::of(ours),
                vec![Some(Cell::of(limit)), Some(Cell::of(rslock))],
            );
            if target {
                let ratios: Vec<f64> = rates[OURS]
                    .iter()
                    .zip(&rates[LIMIT])
                    .map(|(ours, limit)| ours / limit)
                    .collect();
                let listed = |values: &[f64], show: fn(f64) -> String| {
                    values
                        .iter()
                        .map(|v| show(*v))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                report.notes.push(format!(
                    "(c) {case}, {rounds} rounds of {} ms: multilock ÷ the limit in each: {}; \
                     acquisitions/s of multilock {}; of the limit {}; of rslock {}.",
                    run_for.as_millis(),
                    listed(&ratios, |r| format!("{r:.2}")),
                    listed(&rates[OURS], group),
                    listed(&rates[LIMIT], group),
                    listed(&rates[RSLOCK], group),
                ));
                report.many_keys_target = Some(ManyKeysTarget {
                    case,
                    ours,
                    limit,
                    rslock,
                    ratios,
                });
            }
        }
    }
    report.tables.push(table);
    Ok(())
}

/// The contenders of a many-keys case, as [`many_keys`] takes turns.
const OURS: usize = 0;
const LIMIT: usize = 1;
const RSLOCK: usize = 2;

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

/// K tasks, each on its own lock, lock+unlock in a loop; acquisitions per
/// second after a warm-up tenth.
async fn many_locks(
    make: impl Fn(usize) -> BenchResult<Contender>,
    tasks: usize,
    run_for: Duration,
) -> BenchResult<f64> {
    let start = Instant::now();
    let counted_from = start + run_for / 10;
    let stop_at = start + run_for;
    let done = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for i in 0..tasks {
        let contender = make(i)?;
        let done = done.clone();
        set.spawn(async move {
            while Instant::now() < stop_at {
                contender.lock_unlock().await?;
                let now = Instant::now();
                if now >= counted_from && now < stop_at {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
            BenchResult::Ok(())
        });
    }
    join_within(set, DRAIN_LIMIT).await?;
    Ok(done.load(Ordering::Relaxed) as f64 / (stop_at - counted_from).as_secs_f64())
}
