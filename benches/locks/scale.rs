//! (d) Scale: 10,000 tasks waiting on one lock (subscription connections,
//! server connections, this process's memory, how fast they drain), and
//! 10,000 RedLocks held under the watchdog (renewal calls per node per tick,
//! and the latency of a lock+unlock meanwhile).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use multilock::{Client, Guard, Node};
use multilock_testkit::protocol::RENEW_BATCH_SIZE;
use tokio::task::JoinSet;

use crate::contenders::{AnyLock, Contender, join_within, time_lock_unlock_for};
use crate::report::{Cell, Report, Table, Unit, group};
use crate::stats::{Latencies, Stat};
use crate::{BenchResult, LEASE, Servers, Settings};

/// The waiters, then the held locks: one table.
pub async fn scale(settings: &Settings, servers: &Servers, report: &mut Report) -> BenchResult {
    let mut table = Table::new(
        "(d) Scale",
        "reference: the expected value, or the same figure with nothing held",
        &["reference"],
    );
    waiters(settings, servers, &mut table, report).await?;
    held_under_watchdog(settings, servers, &mut table, report).await?;
    report.tables.push(table);
    Ok(())
}

/// Many tasks waiting on one lock: the server's connections and this
/// process's memory while they wait, then how fast they drain.
async fn waiters(
    settings: &Settings,
    servers: &Servers,
    table: &mut Table,
    report: &mut Report,
) -> BenchResult {
    let w = settings.waiters;
    let client = Client::new();
    let node = Node::new(&servers.urls[0])?;
    let lock = client.lock(&node, "bench:waiters")?;
    let holder = lock.lock_with_lease(Duration::from_secs(300)).await?;
    let clients_before = servers.connected_clients(0).await?;
    let rss_before = rss_kib()?;
    let evalsha_before = servers.evalsha_stats(1).await?[0].calls;

    let drained = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for _ in 0..w {
        let lock = lock.clone();
        let drained = drained.clone();
        set.spawn(async move {
            lock.lock_with_lease(LEASE).await?.unlock().await?;
            drained.fetch_add(1, Ordering::Relaxed);
            BenchResult::Ok(())
        });
    }
    // Parked: every waiter made its first attempt, and no acquire came for
    // 100 ms.
    let parking = Instant::now();
    let mut last = evalsha_before;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let calls = servers.evalsha_stats(1).await?[0].calls;
        if calls - evalsha_before >= w as u64 && calls == last {
            break;
        }
        if parking.elapsed() > Duration::from_secs(30) {
            let note = format!("(d) the {w} waiters were still trying after 30 s");
            report.notes.push(note);
            break;
        }
        last = calls;
    }
    let clients_during = servers.connected_clients(0).await?;
    let subscribed = servers.subscription_connections(0).await?;
    let rss_during = rss_kib()?;

    let released = Instant::now();
    holder.unlock().await?;
    join_within(
        set,
        Duration::from_secs(if settings.smoke { 30 } else { 120 }),
    )
    .await?;
    let drain = released.elapsed();

    let label = |what: &str| format!("{} waiters on one lock: {what}", group(w as f64));
    table.row(
        label("subscription connections on the node"),
        Unit::Whole,
        Cell::of(subscribed as f64),
        vec![Some(Cell::noted(1.0, "one per node"))],
    );
    table.row(
        label("server connections added by the waiters"),
        Unit::Whole,
        Cell::of(clients_during.saturating_sub(clients_before) as f64),
        vec![Some(Cell::noted(
            (multilock::DEFAULT_POOL_SIZE + 1) as f64,
            "at most pool + subscription",
        ))],
    );
    table.row(
        label("this process's RSS growth per waiter, KiB (high-water mark of the burst)"),
        Unit::KiB,
        Cell::of(rss_during.saturating_sub(rss_before) as f64 / w as f64),
        vec![None],
    );
    table.row(
        label("drain, one grant after another (grants/s)"),
        Unit::PerSecond,
        Cell::of(w as f64 / drain.as_secs_f64()),
        vec![None],
    );
    report.target(
        "(d)",
        format!(
            "one subscription connection per node with {} waiters",
            group(w as f64)
        ),
        format!("{subscribed}"),
        subscribed == 1,
    );
    report.notes.push(format!(
        "(d) {w} waiters: connected_clients {clients_before} before (the holder's pooled \
         connection included) → {clients_during} while waiting; RSS {rss_before} → \
         {rss_during} KiB; drained in {:.2} s.",
        drain.as_secs_f64()
    ));
    Ok(())
}

/// Many RedLocks held on 3 nodes under a short watchdog: renewal calls per
/// node per tick, then lock+unlock latency on one of those nodes meanwhile.
async fn held_under_watchdog(
    settings: &Settings,
    servers: &Servers,
    table: &mut Table,
    report: &mut Report,
) -> BenchResult {
    const NODES: usize = 3;
    let held = settings.held_locks;
    let period = settings.watchdog_timeout / 3;
    let client = Client::builder()
        .watchdog_timeout(settings.watchdog_timeout)
        .build()?;
    let nodes = servers.nodes(NODES)?;

    // Each node's renewal timer starts with its first grant, just after t0.
    let t0 = Instant::now();
    let guards: Vec<Guard> = futures::stream::iter(0..held)
        .map(|i| {
            let red = client.red_lock_on(&nodes, format!("bench:held:{i}"));
            async move { red?.lock().await }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<multilock::Result<_>>()?;

    // Count over two periods that start half-way between ticks.
    let ticks_so_far = (t0.elapsed().as_secs_f64() / period.as_secs_f64()).ceil();
    let window_start = t0 + period.mul_f64(ticks_so_far + 0.5);
    tokio::time::sleep_until(window_start.into()).await;
    let before = servers.evalsha_stats(NODES).await?;
    tokio::time::sleep(period * 2).await;
    let after = servers.evalsha_stats(NODES).await?;
    let per_tick: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a.calls - b.calls) as f64 / 2.0)
        .collect();
    let (calls, usec) = before
        .iter()
        .zip(&after)
        .fold((0, 0), |(calls, usec), (b, a)| {
            (calls + a.calls - b.calls, usec + a.usec - b.usec)
        });
    let worst = per_tick.iter().copied().fold(0.0, f64::max);
    let expected = held.div_ceil(RENEW_BATCH_SIZE) as f64;
    table.row(
        format!(
            "{} RedLocks held on {NODES} nodes: renewal calls per node per tick (worst node)",
            group(held as f64)
        ),
        Unit::Count,
        Cell::of(worst),
        vec![Some(Cell::noted(
            expected,
            format!("locks / {RENEW_BATCH_SIZE}"),
        ))],
    );
    report.target(
        "(d)",
        format!(
            "renewal calls per node per tick = ⌈locks / {RENEW_BATCH_SIZE}⌉ ({} locks)",
            group(held as f64)
        ),
        format!("{worst:.1} (expected {expected:.0})"),
        // Zero would mean the watchdog renewed nothing.
        worst > 0.0 && worst <= expected,
    );
    report.notes.push(format!(
        "(d) renewal calls per tick by node: {per_tick:?} (watchdog {:?}, tick {period:?}); \
         server time per renewal call {:.0} µs: a node's round of {} calls keeps it busy \
         for {:.1} ms.",
        settings.watchdog_timeout,
        usec as f64 / calls.max(1) as f64,
        held.div_ceil(RENEW_BATCH_SIZE),
        usec as f64 / calls.max(1) as f64 * held.div_ceil(RENEW_BATCH_SIZE) as f64 / 1e3,
    ));

    // A lock+unlock under the same watchdog, on a node renewing `held` locks.
    let probe = Contender::Multilock {
        lock: AnyLock::Single(client.lock(&nodes[0], "bench:held:probe")?),
        lease: None,
    };
    let probed = time_lock_unlock_for(probe.clone(), period * 2).await?;

    let failed = futures::stream::iter(guards)
        .map(Guard::unlock)
        .buffer_unordered(64)
        .filter(|result| std::future::ready(result.is_err()))
        .count()
        .await;
    if failed > 0 {
        report.notes.push(format!(
            "(d) {failed} of {held} held RedLocks failed to unlock."
        ));
    }
    // The same lock+unlock once nothing else is held: the reference.
    let idle = time_lock_unlock_for(probe, period * 2).await?;
    let stats: [Stat; 3] = [
        ("p50", Latencies::p50),
        ("p99", Latencies::p99),
        ("max", Latencies::max),
    ];
    for (stat, pick) in stats {
        table.row(
            format!(
                "Lock (watchdog) lock+unlock while {} locks are renewed on its node: {stat} (µs)",
                group(held as f64)
            ),
            Unit::Micros,
            Cell::of(pick(&probed)),
            vec![Some(Cell::noted(pick(&idle), "nothing held"))],
        );
    }
    Ok(())
}

/// This process's resident memory, from /proc/self/status.
fn rss_kib() -> BenchResult<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS in /proc/self/status".into())
}
