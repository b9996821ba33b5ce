//! (c) Many keys: K tasks, each on its own lock, lock+unlock in a loop;
//! acquisitions per second on 1 node (Lock) and 5 nodes (RedLock).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use multilock::Client;
use tokio::task::JoinSet;

use crate::contenders::{AnyLock, Contender, DRAIN_LIMIT, Limit, join_within};
use crate::report::{Cell, Report, Table, Unit};
use crate::{BenchResult, Servers, Settings};

/// Each contender's acquisitions per second for every K, on 1 and 5 nodes.
pub async fn many_keys(settings: &Settings, servers: &Servers, report: &mut Report) -> BenchResult {
    let mut table = Table::new(
        "(c) Many keys: K tasks, each on its own lock, acquisitions/s",
        "1 node: Lock; 5 nodes: RedLock. Each contender shares one client / manager / set of \
         connections between its tasks",
        &["limit", "rslock"],
    );
    let client = Client::new();
    for n in [1, 5] {
        let nodes = servers.nodes(n)?;
        let conns = servers.bare_connections(n).await?;
        let manager = servers.rslock(n);
        for &k in &settings.tasks {
            let name = |who: &str, i: usize| format!("bench:many:{n}:{k}:{who}:{i}");
            let ours = many_locks(
                |i| {
                    let lock = if n == 1 {
                        AnyLock::Single(client.lock(&nodes[0], name("ours", i))?)
                    } else {
                        AnyLock::Red(client.red_lock_on(&nodes, name("ours", i))?)
                    };
                    Ok(Contender::multilock(lock))
                },
                k,
                settings.run_for,
            )
            .await?;
            let limit = many_locks(
                |i| {
                    Ok(Contender::Limit(Limit::new(
                        conns.clone(),
                        name("limit", i),
                    )))
                },
                k,
                settings.run_for,
            )
            .await?;
            let rslock = many_locks(
                |i| {
                    Ok(Contender::Rslock {
                        manager: manager.clone(),
                        resource: name("rslock", i),
                    })
                },
                k,
                settings.run_for,
            )
            .await?;
            let what = if n == 1 {
                "1 node, Lock"
            } else {
                "5 nodes, RedLock"
            };
            report
                .many_keys
                .push((format!("{what}, K={k}"), ours, limit));
            table.row(
                format!("{what}, K={k}"),
                Unit::PerSecond,
                Cell::of(ours),
                vec![Some(Cell::of(limit)), Some(Cell::of(rslock))],
            );
        }
    }
    report.tables.push(table);
    Ok(())
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
