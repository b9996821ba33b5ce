//! Where a contended lock's hand-off spends its time, stage by stage.
//!
//! K = 8 tasks contend on one lock in the hand-off loop of the benchmark's
//! section (b): each holder holds 1 ms, releases, then steps back until
//! another task was granted, so every grant goes to a parked waiter. For
//! every hand-off the tool lines up, on one clock (`CLOCK_REALTIME`, which
//! is also the clock of the server's MONITOR timestamps: same machine):
//!
//! 1. the PUBLISH of the holder's release script on the server (MONITOR
//!    stamps each command, scripts' included, as it starts, in µs),
//! 2. the holder's release reply read in the client,
//! 3. the unlock message read off the subscription connection,
//! 4. the woken waiter's task polled (a wrapper around its acquire future),
//! 5. its acquire request handed to the shared connection,
//! 6. the acquire EVALSHA started on the server (6': its last command),
//! 7. the grant reply read in the client,
//! 8. `lock_with_lease` returned to the waiter.
//!
//! Client stamps come from the library's static TRACE events
//! (`multilock::request_sent`, `multilock::reply_received`,
//! `multilock::unlock_message`), recorded by the small `tracing_subscriber`
//! layer below. It prints each stage's p50, p90, p99 and mean, its mean over
//! the slowest 1 % of hand-offs (by the benchmark's gap: holder's `unlock`
//! returned → waiter's `lock_with_lease` returned), and the stage of 1→8
//! that dominates the mean and the one that dominates the slowest 1 %.
//!
//! ```text
//! cargo run --release --example handoff_timeline            # 2,000 hand-offs
//! cargo run --release --example handoff_timeline -- 5000    # more
//! ```
//!
//! It starts its own `redis-server`. MONITOR costs the server a few µs per
//! command, scripts' commands included: the server stages (6→6' most) and
//! the gap are longer than in the benchmark (on a quiet 2-core machine, a
//! gap of about 100-125 µs on average instead of 75-85 µs without MONITOR).

use std::collections::HashMap;
use std::error::Error;
use std::future::Future;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::ThreadId;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use multilock::{Client, Node};
use multilock_testkit::{RedisProcess, TestServer, protocol};
use tokio::sync::watch;
use tokio::task::{Id, JoinSet};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata};
use tracing_subscriber::layer::{Context as LayerContext, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

const TASKS: usize = 8;
const HOLD: Duration = Duration::from_millis(1);
const LEASE: Duration = Duration::from_secs(30);
/// Grants left out at the start: connections, scripts, subscription.
const WARM_UP: usize = 100;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum What {
    Sent,
    Reply,
    Message,
    Polled,
    Granted,
    Released,
}

/// Every event: wall-clock ns, what, and the task and thread it happened in.
type Stamp = (u64, What, Option<Id>, ThreadId);
static EVENTS: Mutex<Vec<Stamp>> = Mutex::new(Vec::new());

fn record(what: What) {
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let (task, thread) = (tokio::task::try_id(), std::thread::current().id());
    EVENTS.lock().unwrap().push((at, what, task, thread));
}

/// Records the library's timeline events; every other callsite is disabled.
struct Timeline;

fn library_event(name: &str) -> Option<What> {
    match name {
        "multilock::request_sent" => Some(What::Sent),
        "multilock::reply_received" => Some(What::Reply),
        "multilock::unlock_message" => Some(What::Message),
        _ => None,
    }
}

impl<S: tracing::Subscriber> Layer<S> for Timeline {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        match meta.is_event() && library_event(meta.name()).is_some() {
            true => Interest::always(),
            false => Interest::never(),
        }
    }

    fn on_event(&self, event: &Event<'_>, _: LayerContext<'_, S>) {
        if let Some(what) = library_event(event.metadata().name()) {
            record(what);
        }
    }
}

/// Records each poll of the future it wraps: the waiter's wake-ups.
struct Polled<F>(Pin<Box<F>>);

impl<F: Future> Future for Polled<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        record(What::Polled);
        self.0.as_mut().poll(cx)
    }
}

/// A MONITOR connection. Not read during the run (a reader woken per
/// command would take CPU from the tasks it watches): the server buffers
/// what the socket cannot take.
fn monitor(port: u16) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.write_all(b"MONITOR\r\n")?;
    stream.read_exact(&mut [0u8; 5])?; // "+OK\r\n": on from here
    Ok(stream)
}

/// Wall-clock ns (from MONITOR's µs): each PUBLISH (the release script's),
/// and each acquire EVALSHA's start and its script's last command.
fn server_times(mut monitor: TcpStream, acquire: &str) -> std::io::Result<Server> {
    monitor.set_read_timeout(Some(Duration::from_millis(300)))?;
    let mut lines = Vec::new();
    match monitor.read_to_end(&mut lines) {
        Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Err(e)?,
        _ => {} // read until quiet
    }
    let mut server = Server::default();
    let mut in_acquire = false;
    for line in String::from_utf8_lossy(&lines).lines() {
        // +1700000000.123456 [0 127.0.0.1:40000] "EVALSHA" "<sha>" ...
        // +1700000000.123470 [0 lua] "publish" "<channel>" "0"
        let Some((ts, rest)) = line.strip_prefix('+').and_then(|l| l.split_once(' ')) else {
            continue;
        };
        let mut quoted = rest.split('"').skip(1).step_by(2);
        // Seconds and 6 digits of µs.
        let (Ok(us), Some(cmd)) = (ts.replace('.', "").parse::<u64>(), quoted.next()) else {
            continue;
        };
        let at = us * 1000;
        if !rest.starts_with("[0 lua]") {
            in_acquire = quoted.next() == Some(acquire);
            if in_acquire {
                server.acquire_starts.push(at);
                server.acquire_ends.push(at);
            }
        } else if cmd.eq_ignore_ascii_case("publish") {
            server.publishes.push(at);
        } else if in_acquire {
            *server.acquire_ends.last_mut().expect("after its start") = at;
        }
    }
    Ok(server)
}

/// What MONITOR saw, in wall-clock ns, each sorted.
#[derive(Default)]
struct Server {
    publishes: Vec<u64>,
    acquire_starts: Vec<u64>,
    acquire_ends: Vec<u64>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let handoffs: usize = std::env::args().nth(1).map_or(Ok(2000), |a| a.parse())?;
    tracing_subscriber::registry().with(Timeline).init();
    let server = RedisProcess::start().await?;
    let node = Node::new(&server.url())?;
    let lock = Client::new().lock(&node, "handoff:timeline")?;
    lock.lock_with_lease(LEASE).await?.unlock().await?;
    let monitor = monitor(server.port())?;

    let last = (WARM_UP + handoffs + 1) as u64;
    let grants = Arc::new(watch::channel(0u64).0);
    let mut set = JoinSet::new();
    for _ in 0..TASKS {
        let (lock, grants) = (lock.clone(), grants.clone());
        set.spawn(async move {
            let mut others = grants.subscribe();
            loop {
                let guard = Polled(Box::pin(lock.lock_with_lease(LEASE))).await?;
                record(What::Granted);
                grants.send_modify(|count| *count += 1);
                let grant = *grants.borrow(); // no other grant while held
                tokio::time::sleep(HOLD).await;
                guard.unlock().await?;
                record(What::Released);
                if grant >= last {
                    return Ok::<(), multilock::Error>(());
                }
                let next = others.wait_for(|count| *count > grant);
                let _ = tokio::time::timeout(Duration::from_millis(500), next).await;
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    let scripts = protocol::scripts();
    let acquire = scripts.iter().find(|s| s.0 == "acquire").expect("a script");
    report(&server_times(monitor, &acquire.2)?);
    Ok(())
}

/// The stages, as (from, to) indexes into a hand-off's times: 0 the holder's
/// unlock returned, 1 to 8 as in the module docs, 9 the acquire script's last
/// command on the server.
const STAGES: [(&str, usize, usize); 11] = [
    ("1→2  PUBLISH executed → holder's reply read", 1, 2),
    ("2→   holder's reply read → its unlock returned", 2, 0),
    ("1→3  PUBLISH executed → unlock message read", 1, 3),
    ("3→4  message read → waiter polled", 3, 4),
    ("4→5  waiter polled → acquire handed to conn", 4, 5),
    ("5→6  acquire handed → started on server", 5, 6),
    ("6→6' acquire started → its last command (server)", 6, 9),
    ("6'→7 acquire's last command → grant reply read", 9, 7),
    ("7→8  grant reply read → lock_with_lease returned", 7, 8),
    ("1→8  PUBLISH executed → waiter's lock returned", 1, 8),
    ("gap  holder unlocked → waiter locked (bench (b))", 0, 8),
];
/// The stages that add up to 1→8.
const CHAIN: [usize; 7] = [2, 3, 4, 5, 6, 7, 8];

fn last_at_or_before(times: &[u64], t: u64) -> Option<u64> {
    let i = times.partition_point(|&x| x <= t);
    i.checked_sub(1).map(|i| times[i])
}

fn first_at_or_after(times: &[u64], t: u64) -> Option<u64> {
    times.get(times.partition_point(|&x| x < t)).copied()
}

fn report(server: &Server) {
    let mut events = std::mem::take(&mut *EVENTS.lock().unwrap());
    events.sort_unstable_by_key(|e| e.0);
    let mut by: HashMap<(Option<Id>, What), Vec<u64>> = HashMap::new();
    let mut grants = Vec::new();
    let thread: HashMap<u64, ThreadId> = events.iter().map(|e| (e.0, e.3)).collect();
    for &(at, what, task, _) in &events {
        match what {
            What::Message => by.entry((None, what)).or_default().push(at),
            What::Granted => grants.push((at, task)),
            _ => by.entry((task, what)).or_default().push(at),
        }
    }
    let times = |task, what| by.get(&(task, what)).map_or(&[][..], Vec::as_slice);
    let (mut hand_offs, mut early, mut unmatched) = (Vec::new(), 0, 0);
    for pair in grants.windows(2).skip(WARM_UP) {
        let ((granted, holder), (t8, waiter)) = (pair[0], pair[1]);
        let Some(t0) = first_at_or_after(times(holder, What::Released), granted) else {
            continue;
        };
        if t8 < t0 {
            early += 1;
            continue;
        }
        let matched = (|| {
            let t2 = last_at_or_before(times(holder, What::Reply), t0)?;
            let t7 = last_at_or_before(times(waiter, What::Reply), t8)?;
            let t5 = last_at_or_before(times(waiter, What::Sent), t7)?;
            let t4 = last_at_or_before(times(waiter, What::Polled), t5)?;
            let t3 = last_at_or_before(times(None, What::Message), t4)?;
            let t1 = last_at_or_before(&server.publishes, t3.min(t2)).filter(|&t| t > granted)?;
            let i = server.acquire_starts.partition_point(|&t| t < t5);
            let t6 = *server.acquire_starts.get(i).filter(|&&t| t <= t7)?;
            Some([t0, t1, t2, t3, t4, t5, t6, t7, t8, server.acquire_ends[i]])
        })();
        match matched {
            Some(times) => hand_offs.push(times),
            None => unmatched += 1,
        }
    }
    hand_offs.sort_unstable_by_key(|h| h[8] - h[0]);
    let slowest = &hand_offs[hand_offs.len() - hand_offs.len().div_ceil(100)..];
    println!(
        "{} hand-offs, K={TASKS}, µs ({early} granted before the holder's unlock returned and \
     {unmatched} not woken by the release's message left out)\n",
        hand_offs.len()
    );
    let head = ("stage", "p50", "p90", "p99", "mean", "slowest 1%");
    println!(
        "{:<54}{:>8}{:>8}{:>8}{:>8}{:>12}",
        head.0, head.1, head.2, head.3, head.4, head.5
    );
    let mut means = Vec::new();
    for (name, from, to) in STAGES {
        let us = |h: &[u64; 10]| (h[to] as f64 - h[from] as f64) / 1000.0;
        let mut v: Vec<f64> = hand_offs.iter().map(us).collect();
        v.sort_unstable_by(f64::total_cmp);
        let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let tail = slowest.iter().map(us).sum::<f64>() / slowest.len() as f64;
        println!(
            "{name:<54}{:>8.1}{:>8.1}{:>8.1}{mean:>8.1}{tail:>12.1}",
            q(0.5),
            q(0.9),
            q(0.99)
        );
        means.push((name, mean, tail));
    }
    let chain: Vec<_> = CHAIN.iter().map(|&i| means[i]).collect();
    let top = |pick: fn(&(&str, f64, f64)) -> f64| {
        let best = chain.iter().max_by(|a, b| pick(a).total_cmp(&pick(b)));
        let best = best.expect("stages");
        let total: f64 = chain.iter().map(pick).sum();
        format!("{} ({:.1} of {total:.1} µs)", best.0, pick(best))
    };
    // The message read after the holder's reply: on the worker that read that, or the other.
    let after = hand_offs.iter().filter(|h| h[3] > h[2]);
    let (same, other): (Vec<_>, Vec<_>) = after.partition(|h| thread[&h[2]] == thread[&h[3]]);
    let p50 = |v: Vec<&[u64; 10]>| {
        let mut v: Vec<u64> = v.iter().map(|h| (h[3] - h[2]) / 1000).collect();
        v.sort_unstable();
        format!(
            "{} times, {} µs after it (p50)",
            v.len(),
            v.get(v.len() / 2).unwrap_or(&0)
        )
    };
    let (same, other) = (p50(same), p50(other));
    println!(
        "\nunlock message read after the holder's reply, on the worker thread that had read it: {same}; on the other worker: {other}"
    );
    println!("dominates the mean of 1→8: {}", top(|s| s.1));
    println!("dominates 1→8 in the slowest 1% (by gap): {}", top(|s| s.2));
}
