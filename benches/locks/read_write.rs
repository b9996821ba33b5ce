//! (h) The read-write lock (1 node).
//!
//! The write-after-readers hand-off: [`READERS`] readers hold one name, a
//! writer waits in its lock call (subscribed, its attempt refused), the
//! readers release one after another, and the time from the last reader's
//! `unlock()` call to the writer's grant (one monotonic clock) is held to 2 ×
//! the cycle of Redisson's own scripts on a bare connection: a read unlock
//! (the last reader's), then a write acquire, back to back, measured in the
//! same run. A hand-off is that release, a message and that acquire: about
//! one cycle.
//!
//! Then K readers of one name against K tasks on their own reentrant locks,
//! with the server behind the test kit's latency proxy at 0.5 and 1 ms
//! one-way: at loopback both are bound by the one server's CPU on this
//! machine's 2 cores, and a read costs the server about twice a reentrant
//! lock+unlock (Redisson's format: a timeout key per read hold), which (c)
//! shows; at a distance the round trips decide, and those are the same
//! (one per acquire, one per release). Beside them, at each delay, the
//! Redisson 3.24+ limit's many keys through the same proxy, for the
//! servers' CPU per acquisition with the client at a distance.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use multilock::{Client, Lock, Node, Owner};
use multilock_testkit::{Delay, Direction, TcpProxy, redisson, redisson_rwlock};

use crate::contenders::many_locks;
use crate::contenders::{AnyLock, Contender, Limit, Protocol};
use crate::latency_cdf::Panel;
use crate::report::{Cell, Grid, Report, Table, Unit, group};
use crate::stats::{Latencies, median, nanos, paired_ratios};
use crate::{BenchResult, LEASE, MANY_KEYS_TASKS, Servers, Settings, bare_connection};

/// Readers holding the lock when the writer comes.
const READERS: usize = 8;
/// The one-way delays of the settings' list, from this one up, that the
/// readers are compared at.
const DISTANT: Duration = Duration::from_micros(500);
/// Between two polls for a sign from the server (tokio's timer makes it
/// about 1 ms).
const POLL: Duration = Duration::from_micros(500);
/// How long a round waits for a sign before the run fails.
const SIGN_LIMIT: Duration = Duration::from_secs(5);

/// The hand-off, then the readers at a distance.
pub async fn read_write(
    settings: &Settings,
    servers: &Servers,
    report: &mut Report,
) -> BenchResult {
    write_after_readers(settings, servers, report).await?;
    readers_at_a_distance(settings, servers, report).await
}

// ---------------------------------------------------------------------------
// The write-after-readers hand-off

/// Admin commands a run sent to see its signs, whose server CPU is taken
/// out of the rounds'.
#[derive(Default)]
struct Polls {
    /// `PUBSUB NUMSUB <channel>`.
    numsub: usize,
    /// `INFO commandstats`.
    stats: usize,
}

/// Rounds of the hand-off (a tenth more first, as a warm-up), held to 2 ×
/// the limit's cycle; with the server's CPU per round.
async fn write_after_readers(
    settings: &Settings,
    servers: &Servers,
    report: &mut Report,
) -> BenchResult {
    let limit = limit_cycle(servers, settings.iterations).await?;
    let cycle = limit.p50();
    let name = "bench:rw:handoff";
    let channel = redisson_rwlock::channel(name);
    let (numsub_cost, stats_cost) = poll_costs(servers, &channel).await?;

    let client = Client::new();
    let node = Node::new(&servers.urls[0])?;
    let lock = client.read_write_lock(&node, name)?;
    let readers = (0..READERS)
        .map(|i| Ok(lock.read().with_owner(Owner::new(format!("reader-{i}"))?)))
        .collect::<multilock::Result<Vec<Lock>>>()?;
    let writer = lock.write().with_owner(Owner::new("writer")?);

    let rounds = settings.rw_handoff_rounds;
    let warmup = (rounds / 10).max(2);
    let mut samples = Vec::with_capacity(warmup + rounds);
    let mut polls = Polls::default();
    let mut cpu_before = 0.0;
    for round in 0..warmup + rounds {
        if round == warmup {
            polls = Polls::default();
            cpu_before = servers.cpu_seconds(0).await?;
        }
        samples.push(hand_off(servers, &readers, &writer, &channel, &mut polls).await?);
    }
    let raw_cpu = (servers.cpu_seconds(0).await? - cpu_before) * 1e6 / rounds as f64;
    let poll_cpu =
        (polls.numsub as f64 * numsub_cost + polls.stats as f64 * stats_cost) / rounds as f64;
    let cpu = raw_cpu - poll_cpu;
    let handoffs = Latencies::new(samples.split_off(warmup));
    let (p50, p99) = (handoffs.p50(), handoffs.p99());

    let mut table = Table::new(
        &format!(
            "(h) Read-write lock: the write-after-readers hand-off, {READERS} readers, 1 node"
        ),
        &format!(
            "Each round: {READERS} readers (owners of their own) take read holds of one name; a \
             writer calls `write().lock_with_lease()` and waits; once the server shows it \
             waiting (its channel subscribed, and its attempt after the subscription refused: \
             PUBSUB NUMSUB and EVALSHA calls in INFO commandstats), the readers release one \
             after another; the writer is granted, and releases. Hand-off = the writer's grant \
             after the last reader's `unlock()` call (one clock), {rounds} rounds after \
             {warmup} of warm-up. The Redisson cycle: Redisson 3.24+'s read unlock (with its \
             latch; the latch's DEL not awaited) then its write acquire, back to back on a \
             bare connection, {} times (p50 {cycle:.1} µs). Server CPU per round: INFO cpu \
             over the rounds, less the polls' own cost measured alone (PUBSUB NUMSUB \
             {numsub_cost:.1} µs, INFO commandstats {stats_cost:.1} µs; {:.1} and {:.1} per \
             round)",
            settings.iterations,
            polls.numsub as f64 / rounds as f64,
            polls.stats as f64 / rounds as f64,
        ),
        &["Redisson cycle"],
    );
    for (figure, ours, limit) in [
        ("hand-off p50 (µs)", p50, cycle),
        ("hand-off p99 (µs)", p99, limit.p99()),
        ("hand-off mean (µs)", handoffs.mean(), limit.mean()),
    ] {
        table.row(
            figure.into(),
            Unit::Micros,
            Cell::of(ours),
            vec![Some(Cell::of(limit))],
        );
    }
    table.row(
        "server CPU per round (µs)".into(),
        Unit::Micros,
        Cell::noted(cpu, format!("{raw_cpu:.0} with the polls")),
        vec![None],
    );
    report.tables.push(table);
    let mut panel = Panel::new(format!(
        "Read-write lock: write after {READERS} readers, 1 node"
    ));
    panel.add("multilock hand-off".into(), handoffs);
    panel.add("Redisson read unlock + write acquire".into(), limit);
    report.panels.push(panel);
    report.target(
        "(h)",
        format!(
            "write-after-readers hand-off p50 ({READERS} readers, from the last reader's \
             `unlock()` call to the writer's grant) ≤ 2 × the Redisson read-unlock + \
             write-acquire cycle"
        ),
        format!(
            "{p50:.0} µs vs 2 × {cycle:.1} µs: {:.2}× (p99 {p99:.0} µs; {rounds} rounds; \
             server CPU {cpu:.0} µs per round)",
            p50 / cycle
        ),
        p50 <= 2.0 * cycle,
    );
    Ok(())
}

/// One round: the readers take the lock, the writer comes and waits, the
/// readers leave one after another. Returns the time (ns) from the last
/// reader's `unlock()` call to the writer's grant.
async fn hand_off(
    servers: &Servers,
    readers: &[Lock],
    writer: &Lock,
    channel: &str,
    polls: &mut Polls,
) -> BenchResult<u64> {
    // The previous round's writer has unsubscribed, on the server and so in
    // its client (which forgets a subscription before unsubscribing): this
    // round's writer subscribes afresh, so it attempts exactly twice before
    // it parks, once before subscribing and once after.
    let limit = Instant::now() + SIGN_LIMIT;
    loop {
        polls.numsub += 1;
        if subscribers(servers, channel).await? == 0 {
            break;
        }
        tick(limit, "the previous writer stayed subscribed").await?;
    }
    let mut guards =
        try_join_all(readers.iter().map(|reader| reader.lock_with_lease(LEASE))).await?;
    polls.stats += 1;
    let calls_before = script_calls(servers).await?;
    let waiting = writer.clone();
    let writer = tokio::spawn(async move {
        let guard = waiting.lock_with_lease(LEASE).await?;
        let granted = Instant::now();
        guard.unlock().await?;
        BenchResult::Ok(granted)
    });
    // The sign that the writer waits: its channel subscribed, and both
    // attempts refused (nothing else sends scripts meanwhile). Any release
    // from here on publishes to it.
    loop {
        polls.numsub += 1;
        polls.stats += 1;
        let subscribed = subscribers(servers, channel).await? > 0;
        let attempts = script_calls(servers).await? - calls_before;
        if subscribed && attempts >= 2 {
            break;
        }
        if writer.is_finished() {
            writer.await??;
            return Err("the writer was granted while every reader held the lock".into());
        }
        tick(limit, "the writer never showed it was waiting").await?;
    }
    let last = guards.pop().expect("READERS > 0");
    for guard in guards {
        guard.unlock().await?;
    }
    let releasing = Instant::now();
    last.unlock().await?;
    let granted = writer.await??;
    if granted < releasing {
        return Err("the writer was granted before the last reader released".into());
    }
    Ok(nanos(granted - releasing))
}

/// Sleeps before the next poll, or fails once `limit` passed.
async fn tick(limit: Instant, failure: &str) -> BenchResult {
    if Instant::now() >= limit {
        return Err(format!("{failure} (waited {SIGN_LIMIT:?})").into());
    }
    tokio::time::sleep(POLL).await;
    Ok(())
}

/// Connections subscribed to `channel` on the first server.
async fn subscribers(servers: &Servers, channel: &str) -> BenchResult<u64> {
    let numsub = redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).clone();
    let counts: HashMap<String, u64> = servers.query(0, &numsub).await?;
    Ok(counts.get(channel).copied().unwrap_or(0))
}

/// Script calls the first server has run so far.
async fn script_calls(servers: &Servers) -> BenchResult<u64> {
    let stats = servers.command_stats(0).await?;
    Ok(["evalsha", "eval"]
        .iter()
        .filter_map(|command| stats.get(*command))
        .map(|stat| stat.calls)
        .sum())
}

/// The server CPU (µs) of one `PUBSUB NUMSUB` and of one `INFO
/// commandstats`, each measured alone.
async fn poll_costs(servers: &Servers, channel: &str) -> BenchResult<(f64, f64)> {
    const POLLS: usize = 500;
    let before = servers.cpu_seconds(0).await?;
    for _ in 0..POLLS {
        subscribers(servers, channel).await?;
    }
    let between = servers.cpu_seconds(0).await?;
    for _ in 0..POLLS {
        script_calls(servers).await?;
    }
    let after = servers.cpu_seconds(0).await?;
    let each = |seconds: f64| seconds * 1e6 / POLLS as f64;
    Ok((each(between - before), each(after - between)))
}

/// Redisson's side of a hand-off on a bare connection, uncontended: the
/// last reader's read unlock (with its latch; the latch's DEL sent after
/// the reply, not awaited), then the writer's write acquire, back to back.
/// Each timed pair follows an untimed read acquire and precedes an untimed
/// write release; a tenth of warm-up first.
async fn limit_cycle(servers: &Servers, iterations: usize) -> BenchResult<Latencies> {
    let mut conn = servers.bare_connections(1).await?.remove(0);
    let name = "bench:rw:handoff:limit";
    let reader = "6f1c0e9a-1111-2222-3333-444455556666:1";
    let writer = "6f1c0e9a-1111-2222-3333-444455556666:2";
    let warmup = iterations / 10;
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..warmup + iterations {
        let read: Option<i64> = redisson_rwlock::read_acquire(name, reader, LEASE)
            .invoke_async(&mut conn)
            .await?;
        if let Some(pttl) = read {
            return Err(format!("the read limit found {name} taken ({pttl} ms)").into());
        }
        let started = Instant::now();
        let request = redisson::new_request_id();
        let released: Option<i64> = redisson_rwlock::read_release(name, reader, &request)
            .invoke_async(&mut conn)
            .await?;
        if released != Some(1) {
            return Err(format!("the read limit's unlock of {name} replied {released:?}").into());
        }
        crate::contenders::delete_latch_unawaited(&conn, name, &request).await?;
        let taken: Option<i64> = redisson_rwlock::write_acquire(name, writer, LEASE)
            .invoke_async(&mut conn)
            .await?;
        if let Some(pttl) = taken {
            return Err(format!("the write limit found {name} taken ({pttl} ms)").into());
        }
        if i >= warmup {
            samples.push(nanos(started.elapsed()));
        }
        let request = redisson::new_request_id();
        let released: Option<i64> = redisson_rwlock::write_release(name, writer, &request, LEASE)
            .invoke_async(&mut conn)
            .await?;
        if released != Some(1) {
            return Err(format!("the write limit's unlock of {name} replied {released:?}").into());
        }
        redisson::delete_latch(name, &request)
            .exec_async(&mut conn)
            .await?;
    }
    Ok(Latencies::new(samples))
}

// ---------------------------------------------------------------------------
// Readers at a distance

/// One delay's figures: per round, each side's rate and server CPU (µs) per
/// acquisition.
struct AtDelay {
    delay: Duration,
    reads: Vec<(f64, f64)>,
    keys: Vec<(f64, f64)>,
    /// The Redisson 3.24+ limit's many keys: a bare connection through the
    /// same proxy sending its scripts (and its latch `DEL`).
    limit: Vec<(f64, f64)>,
}

/// The sides of a delay's rounds, in turn order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Readers,
    Keys,
    Limit,
}

const SIDES: [Side; 3] = [Side::Readers, Side::Keys, Side::Limit];

/// K readers of one name against K tasks on their own locks, the server
/// behind a proxy adding each delay of the settings from [`DISTANT`] up,
/// each way; rounds taking turns, each side's median. Beside them, the
/// Redisson 3.24+ limit's many keys through the same proxy, with its
/// servers' CPU per acquisition: a closed loop here too, so that ratio
/// follows which client ran faster, as (c)'s closed-loop one does.
async fn readers_at_a_distance(
    settings: &Settings,
    servers: &Servers,
    report: &mut Report,
) -> BenchResult {
    let k = MANY_KEYS_TASKS;
    let proxy = TcpProxy::start(servers.processes[0].port()).await?;
    let node = Node::new(&proxy.url())?;
    let conns = vec![bare_connection(&proxy.url()).await?];
    let client = Client::new();
    let (rounds, run_for) = settings.proxy_rounds;
    let mut measured = Vec::new();
    for &delay in settings.proxy_delays.iter().filter(|d| **d >= DISTANT) {
        proxy.set_delay(Direction::Both, Delay::fixed(delay));
        let at = format!("bench:rw:distance:{}", delay.as_micros());
        let mut figures = AtDelay {
            delay,
            reads: Vec::with_capacity(rounds),
            keys: Vec::with_capacity(rounds),
            limit: Vec::with_capacity(rounds),
        };
        for round in 0..rounds {
            for turn in 0..SIDES.len() {
                let side = SIDES[(round + turn) % SIDES.len()];
                let contender = |i: usize| -> BenchResult<Contender> {
                    let lock = match side {
                        Side::Readers => client.read_write_lock(&node, &at)?.read().clone(),
                        Side::Keys => client.lock(&node, format!("{at}:key:{i}"))?,
                        Side::Limit => {
                            let name = format!("{at}:limit:{i}");
                            let limit = Limit::new(conns.clone(), name, Protocol::Redisson);
                            return Ok(Contender::Limit(limit));
                        }
                    };
                    Ok(Contender::multilock(AnyLock::Single(lock)))
                };
                let cpu_before = servers.cpu_seconds(0).await?;
                let (rate, acquisitions) = many_locks(contender, k, run_for).await?;
                let cpu = servers.cpu_seconds(0).await? - cpu_before;
                let run = (rate, cpu * 1e6 / acquisitions.max(1) as f64);
                match side {
                    Side::Readers => figures.reads.push(run),
                    Side::Keys => figures.keys.push(run),
                    Side::Limit => figures.limit.push(run),
                }
            }
        }
        measured.push(figures);
    }
    proxy.set_delay(Direction::Both, Delay::NONE);

    let mut grid = Grid::new(
        &format!("(h) {k} readers of one read-write lock at a distance (1 node)"),
        &format!(
            "The server behind the test kit's latency proxy adding the delay each way (fixed). \
             Readers: {k} tasks taking and releasing read holds of one name; many keys: {k} \
             tasks on their own reentrant locks; both multilock, one client, lock+unlock in a \
             loop; the Redisson 3.24+ limit's many keys: {k} tasks on their own names sending \
             its scripts over one bare connection through the same proxy. {rounds} rounds of {} \
             ms per side, taking turns, each side's median; server CPU = INFO cpu over a run, \
             per acquisition, its ratio the median of the rounds' paired ratios. At loopback, \
             see (c)",
            run_for.as_millis()
        ),
        &[
            "one-way delay",
            "readers, reads/s",
            "many keys, acquisitions/s",
            "readers ÷ many keys",
            "readers, server CPU per read (µs)",
            "many keys, server CPU per acquisition (µs)",
            "Redisson limit's many keys, acquisitions/s",
            "Redisson limit's many keys, server CPU per acquisition (µs)",
            "many keys' server CPU ÷ the limit's",
        ],
    );
    for at in &measured {
        let ms = at.delay.as_secs_f64() * 1e3;
        let pick = |runs: &[(f64, f64)], which: fn(&(f64, f64)) -> f64| {
            median(&runs.iter().map(which).collect::<Vec<_>>())
        };
        let (reads, keys) = (pick(&at.reads, |r| r.0), pick(&at.keys, |r| r.0));
        let (read_cpu, key_cpu) = (pick(&at.reads, |r| r.1), pick(&at.keys, |r| r.1));
        let (limit_rate, limit_cpu) = (pick(&at.limit, |r| r.0), pick(&at.limit, |r| r.1));
        let cpu_ratios = paired_ratios(at.keys.iter().map(|r| r.1), at.limit.iter().map(|r| r.1));
        let cpu_ratio = median(&cpu_ratios);
        let ratio = reads / keys;
        let listed = |runs: &[(f64, f64)]| {
            runs.iter()
                .map(|r| group(r.0))
                .collect::<Vec<_>>()
                .join(", ")
        };
        grid.row(vec![
            format!("{ms} ms"),
            group(reads),
            group(keys),
            format!("{ratio:.2}×"),
            format!("{read_cpu:.1}"),
            format!("{key_cpu:.1}"),
            group(limit_rate),
            format!("{limit_cpu:.1}"),
            format!("{cpu_ratio:.2}×"),
        ]);
        // Reported, no longer a target: issue 39 replaced "readers ≥ 0.9 ×
        // many keys" by the readers' own limit, held in (c).
        report.notes.push(format!(
            "(h) at {ms} ms one-way: {k} readers of one read-write lock (1 node) ÷ many keys' \
             rate: {}/s vs {}/s: {ratio:.2}× (medians of {rounds} rounds; server CPU \
             {read_cpu:.1} µs per read vs {key_cpu:.1} µs per acquisition).",
            group(reads),
            group(keys)
        ));
        report.notes.push(format!(
            "(h) at {ms} ms one-way, {rounds} rounds of {} ms: reads/s of {k} readers of one \
             name {}; acquisitions/s of {k} tasks on their own locks {}; of the Redisson 3.24+ \
             limit's {k} tasks {}; many keys' server CPU per acquisition ÷ the limit's in each \
             round: {}.",
            run_for.as_millis(),
            listed(&at.reads),
            listed(&at.keys),
            listed(&at.limit),
            cpu_ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    report.grids.push(grid);
    Ok(())
}
