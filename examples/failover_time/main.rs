//! Time from a primary's death to the first successful acquire through a
//! Sentinel node and through a Cluster node, against the failover time of
//! Redis itself.
//!
//! ```text
//! cargo run --release --example failover_time               # 5 rounds of each
//! cargo run --release --example failover_time -- --rounds 10
//! cargo run --release --example failover_time -- --only cluster   # or sentinel
//! RUST_LOG=multilock=debug cargo run --release --example failover_time  # with the crate's tracing
//! ```
//!
//! Each round starts a fresh `SentinelGroup` (a primary, 2 replicas, 3
//! sentinels with `down-after-milliseconds 1000`, `failover-timeout 5000`;
//! `redis-server` processes on loopback), builds a `Node::sentinel` and takes
//! and releases one lock, so the node has its connections. Then, from one
//! instant, two loops run side by side:
//!
//! - Redis: every 10 ms, `SENTINEL GET-MASTER-ADDR-BY-NAME` on each
//!   sentinel, until a majority names a new server and it answers `ROLE`
//!   as a master;
//! - ours: `try_lock` with a fresh name (500 ms per attempt, 10 ms between
//!   failed ones) until one is granted on the new primary. Attempts that
//!   fail, or are granted by the old primary, are counted by kind.
//!
//! Round r of N strikes (r - 1) / N s into the node's 1 s poll of the
//! sentinels. Two faults: the primary SIGKILLed, and a planned
//! `SENTINEL FAILOVER`, where the old primary stays up and writable for
//! 10-20 s. There an acquire granted by the old primary (its key is there)
//! does not count, and once one was granted by the new primary a burst of
//! lock/unlock cycles (3 s, 100 cycles) checks that the old primary runs
//! none of our scripts any more (`INFO commandstats`, eval*/fcall calls,
//! before and after).
//!
//! Beside them, a waiter: before the fault, a holder takes another name
//! (its hold replicated: a write and `WAIT` on the primary) and a second
//! owner waits for it in `lock()`; the holder unlocks at the fault (its
//! release goes on in the background until a primary answers). The
//! column "a waiter, its holder released at the fault" is the time to that
//! waiter's grant: what an application waiting in `lock()` sees.
//!
//! Then the same for a Redis Cluster (`cluster.rs`): a fresh `RedisCluster`
//! per round (3 primaries, 3 replicas, `cluster-node-timeout 1000`), a
//! `Node::cluster`, and the primary of one name's slot SIGKILLed or its
//! replica sent `CLUSTER FAILOVER`.

mod cluster;

use std::collections::BTreeMap;
use std::error::Error;
use std::time::{Duration, Instant};

use multilock::redis::{self, aio::MultiplexedConnection};
use multilock::{Client, Guard, Node, Owner};
use multilock_testkit::{GroupMember, SentinelGroup, TestServer};

type Res<T> = Result<T, Box<dyn Error>>;

const SENTINEL_POLL: Duration = Duration::from_millis(10);
/// How long one probe of the sentinels, or one `ROLE`, may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);
const RETRY_PAUSE: Duration = Duration::from_millis(10);
/// A fixed lease: no watchdog renewals add script calls to the count.
const LEASE: Duration = Duration::from_secs(30);
/// Either loop gives up after this long: the round reports "never".
const GIVE_UP: Duration = Duration::from_secs(30);
const BURST_CYCLES: usize = 100;
/// Spreads the burst over 3 s: three of the node's 1 s polls of the sentinels.
const BURST_PAUSE: Duration = Duration::from_millis(30);

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    KillPrimary,
    PlannedFailover,
    /// A Cluster's primary of the measured name's slot SIGKILLed.
    ClusterKill,
    /// `CLUSTER FAILOVER` sent to that primary's replica.
    ClusterFailover,
}

impl Fault {
    /// Whether the old primary stays up (a planned failover).
    fn planned(self) -> bool {
        matches!(self, Fault::PlannedFailover | Fault::ClusterFailover)
    }

    fn cluster(self) -> bool {
        matches!(self, Fault::ClusterKill | Fault::ClusterFailover)
    }

    fn title(self) -> &'static str {
        match self {
            Fault::KillPrimary => "Sentinel, primary SIGKILLed",
            Fault::PlannedFailover => "Sentinel, SENTINEL FAILOVER",
            Fault::ClusterKill => "Cluster, slot's primary SIGKILLed",
            Fault::ClusterFailover => "Cluster, CLUSTER FAILOVER",
        }
    }
}

/// What one round measured, in ms from the kill (or the `SENTINEL FAILOVER`).
#[derive(Default)]
struct Round {
    /// Sentinel: a majority of the sentinels names the new primary and it
    /// answers as one. Cluster: every running node's `CLUSTER SLOTS` names
    /// the replica for the slot.
    redis: Option<i64>,
    /// Cluster: the replica's own `CLUSTER SLOTS` names it for the slot
    /// (it has taken over; the others learn it by gossip).
    claimed: Option<i64>,
    /// Any granted acquire: on a planned failover, usually the old primary's.
    first_any: Option<i64>,
    first_new: Option<i64>,
    /// Cluster: the first acquire+release of the one name that was in
    /// flight, or retried, across the fault (fresh names otherwise).
    first_same: Option<i64>,
    /// When the old primary (still up: a planned failover) granted ours.
    old_grants: Vec<i64>,
    attempts: usize,
    errors: BTreeMap<String, usize>,
    /// Planned failover: scripts the old primary ran during the burst, and
    /// whether it was still a primary at its end.
    burst: Option<(u64, bool)>,
    /// The grant of a waiter in `lock()` whose holder unlocked at the fault.
    waiter: Option<i64>,
}

impl Round {
    fn overhead(&self) -> Option<i64> {
        Some(self.first_new? - self.redis?)
    }

    /// Cluster: from the replica's takeover to ours.
    fn overhead_after_claim(&self) -> Option<i64> {
        Some(self.first_new? - self.claimed?)
    }

    /// Our acquires the old primary granted after the sentinels had switched.
    fn old_grants_after_switch(&self) -> Option<usize> {
        let switched = self.redis?;
        Some(self.old_grants.iter().filter(|&&at| at > switched).count())
    }
}

/// One figure of a round, for the summary.
type Figure = fn(&Round) -> Option<i64>;

#[tokio::main]
async fn main() -> Res<()> {
    // `RUST_LOG=multilock=debug`: the crate's tracing on stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let mut rounds = 5;
    let mut only = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rounds" => rounds = args.next().ok_or("--rounds takes a number")?.parse()?,
            "--only" => match args.next().as_deref() {
                Some("sentinel") => only = Some(false),
                Some("cluster") => only = Some(true),
                _ => return Err("--only takes sentinel or cluster".into()),
            },
            other => {
                let usage = "try --rounds N, --only sentinel|cluster";
                return Err(format!("unknown argument {other}; {usage}").into());
            }
        }
    }
    let faults = [
        Fault::KillPrimary,
        Fault::PlannedFailover,
        Fault::ClusterKill,
        Fault::ClusterFailover,
    ];
    let faults = faults
        .into_iter()
        .filter(|f| only.is_none_or(|c| f.cluster() == c));
    for fault in faults {
        print_header(fault);
        let mut done = Vec::new();
        for round in 1..=rounds {
            let measured = if fault.cluster() {
                cluster::run_round(fault, round, rounds).await?
            } else {
                run_round(fault, round, rounds).await?
            };
            print_row(fault, round, &measured);
            done.push(measured);
        }
        print_summary(fault, &done);
    }
    Ok(())
}

async fn run_round(fault: Fault, round: usize, rounds: usize) -> Res<Round> {
    let mut group = SentinelGroup::start().await?;
    let node = Node::sentinel(group.master_name(), group.sentinel_urls()).build()?;
    let client = Client::new();
    let warm_up = client.lock(&node, "failover:warm-up")?;
    let guard = warm_up.try_lock_for(Duration::ZERO, Some(LEASE)).await?;
    guard.ok_or("warm-up not granted")?.unlock().await?;

    let mut sentinels = Vec::new();
    for url in group.sentinel_urls() {
        sentinels.push(connect(&url).await?);
    }
    let old = group.primary().await?;
    let old_url = group.data_nodes()[old].url();
    let old_port: u16 = old_url.rsplit(':').next().ok_or("a port")?.parse()?;
    let mut old_conn = connect(&old_url).await?;
    let held = format!("failover:{round}:held");
    let waiter = Waiter::start(&client, &node, &held, &old_url, 2).await?;

    // The node polls the sentinels every second from its first request:
    // round r of N strikes (r - 1) / N s later into that second.
    tokio::time::sleep(Duration::from_secs(1) * (round as u32 - 1) / rounds as u32).await;
    let first_try = Instant::now();
    let mut started = first_try;
    match fault {
        // A sentinel may refuse for a moment after the start (INPROG,
        // NOGOODSLAVE): the clock starts at the request it accepts.
        Fault::PlannedFailover => loop {
            started = Instant::now();
            let mut ask = redis::cmd("SENTINEL");
            ask.arg("FAILOVER").arg(group.master_name());
            match ask.query_async::<()>(&mut sentinels[0].clone()).await {
                Ok(()) => break,
                Err(_) if first_try.elapsed() < GIVE_UP => tokio::time::sleep(RETRY_PAUSE).await,
                Err(err) => return Err(err.into()),
            }
        },
        _ => group.kill(GroupMember::Data(old)).await?,
    }
    // The old primary is only asked where an acquire landed while it lives.
    let old_alive = (fault == Fault::PlannedFailover).then_some(&mut old_conn);
    let names = |attempt: usize| format!("failover:{round}:{attempt}");
    let (redis_failover, mut measured, waiter) = tokio::join!(
        redis_failover_time(&sentinels, old_port, started),
        acquire_on_new_primary(&client, &node, old_alive, started, names, false),
        waiter.released_at_fault(started),
    );
    measured.redis = redis_failover;
    measured.waiter = waiter;
    if fault == Fault::PlannedFailover && measured.first_new.is_some() {
        let burst = burst(
            &client,
            &node,
            "failover:burst",
            &old_conn,
            &mut measured.errors,
        );
        measured.burst = Some(burst.await?);
    }
    Ok(measured)
}

/// Redis's own failover time: until a majority of the sentinels name a
/// server other than the old primary, and it answers `ROLE` as a master.
async fn redis_failover_time(
    sentinels: &[MultiplexedConnection],
    old_port: u16,
    started: Instant,
) -> Option<i64> {
    let majority = sentinels.len() / 2 + 1;
    while started.elapsed() < GIVE_UP {
        let asks = sentinels.iter().map(|conn| async move {
            let mut conn = conn.clone();
            let mut ask = redis::cmd("SENTINEL");
            ask.arg("GET-MASTER-ADDR-BY-NAME").arg("mymaster");
            let answer = tokio::time::timeout(PROBE_TIMEOUT, ask.query_async(&mut conn)).await;
            answer.ok().and_then(Result::ok).flatten()
        });
        let mut votes: BTreeMap<(String, u16), usize> = BTreeMap::new();
        for named in futures::future::join_all(asks).await.into_iter().flatten() {
            *votes.entry(named).or_default() += 1;
        }
        let agreed = votes
            .into_iter()
            .find(|(addr, n)| *n >= majority && addr.1 != old_port);
        if let Some(((host, port), _)) = agreed
            && answers_as_master(&format!("redis://{host}:{port}")).await
        {
            return Some(started.elapsed().as_millis() as i64);
        }
        tokio::time::sleep(SENTINEL_POLL).await;
    }
    None
}

async fn answers_as_master(url: &str) -> bool {
    let ask = async {
        let mut conn = connect(url).await.ok()?;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.ok()?;
        Some(matches!(role.first(), Some(redis::Value::BulkString(s)) if s == b"master"))
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, ask).await,
        Ok(Some(true))
    )
}

/// Our loop: try-acquire `name(attempt)` until the new primary grants one.
/// With `old_primary` (it still runs), a grant whose key is on it does not
/// count. With `must_release`, neither does one whose release then fails,
/// and the time is taken once the release succeeded.
async fn acquire_on_new_primary(
    client: &Client,
    node: &Node,
    mut old_primary: Option<&mut MultiplexedConnection>,
    started: Instant,
    mut name: impl FnMut(usize) -> String,
    must_release: bool,
) -> Round {
    let mut measured = Round::default();
    while started.elapsed() < GIVE_UP {
        measured.attempts += 1;
        let name = name(measured.attempts);
        let lock = client.lock(node, name.as_str()).expect("a valid name");
        let attempt = lock.try_lock_for(Duration::ZERO, Some(LEASE));
        let kind = match tokio::time::timeout(ATTEMPT_TIMEOUT, attempt).await {
            Err(_) => "attempt timed out".to_owned(),
            Ok(Err(err)) => kind_of(&err),
            Ok(Ok(None)) => "not granted: held".to_owned(),
            Ok(Ok(Some(guard))) => {
                let at = started.elapsed().as_millis() as i64;
                measured.first_any.get_or_insert(at);
                let mut exists = redis::cmd("EXISTS");
                let on_old = match old_primary.as_deref_mut() {
                    Some(conn) => exists.arg(&name).query_async(conn).await.unwrap_or(0) == 1,
                    None => false,
                };
                let failed = match tokio::time::timeout(ATTEMPT_TIMEOUT, guard.unlock()).await {
                    Ok(Ok(())) => None,
                    Ok(Err(err)) => Some(format!("unlock: {}", kind_of(&err))),
                    Err(_) => Some("unlock timed out".to_owned()),
                };
                if on_old {
                    measured.old_grants.push(at);
                    failed
                        .into_iter()
                        .for_each(|kind| count(&mut measured.errors, kind));
                    "granted by the old primary".to_owned()
                } else if must_release && let Some(kind) = failed {
                    format!("granted, then {kind}")
                } else {
                    failed
                        .into_iter()
                        .for_each(|kind| count(&mut measured.errors, kind));
                    let released = started.elapsed().as_millis() as i64;
                    measured.first_new = Some(if must_release { released } else { at });
                    return measured;
                }
            }
        };
        count(&mut measured.errors, kind);
        tokio::time::sleep(RETRY_PAUSE).await;
    }
    measured
}

/// Lock/unlock cycles of `name` after the switch; returns how many scripts
/// the old primary ran meanwhile (0 when none of ours went there) and
/// whether it was still a primary at the end (else the check is over a
/// shorter window).
async fn burst(
    client: &Client,
    node: &Node,
    name: &str,
    old_primary: &MultiplexedConnection,
    errors: &mut BTreeMap<String, usize>,
) -> Res<(u64, bool)> {
    let before = script_calls(old_primary).await?;
    let lock = client.lock(node, name)?;
    for _ in 0..BURST_CYCLES {
        match lock.try_lock_for(Duration::ZERO, Some(LEASE)).await {
            Ok(Some(guard)) => {
                if let Err(err) = guard.unlock().await {
                    count(errors, format!("burst unlock: {}", kind_of(&err)));
                }
            }
            Ok(None) => count(errors, "burst: not granted".to_owned()),
            Err(err) => count(errors, format!("burst: {}", kind_of(&err))),
        }
        tokio::time::sleep(BURST_PAUSE).await;
    }
    let after = script_calls(old_primary).await?;
    let mut info = redis::cmd("INFO");
    let info: String = info
        .arg("replication")
        .query_async(&mut old_primary.clone())
        .await?;
    Ok((after - before, info.contains("role:master")))
}

/// Calls of eval, evalsha, their `_ro` forms and fcall, rejected and failed
/// ones included (a demoted primary rejects writes: still sent there).
async fn script_calls(conn: &MultiplexedConnection) -> Res<u64> {
    let mut info = redis::cmd("INFO");
    let info: String = info
        .arg("commandstats")
        .query_async(&mut conn.clone())
        .await?;
    let lines = info.lines().map(str::trim);
    let scripts = lines.filter(|l| l.starts_with("cmdstat_eval") || l.starts_with("cmdstat_fcall"));
    let fields = scripts
        .flat_map(|l| l.split([':', ',']))
        .filter_map(|f| f.split_once('='));
    let calls = fields.filter(|(k, _)| matches!(*k, "calls" | "rejected_calls" | "failed_calls"));
    Ok(calls.map(|(_, n)| n.parse::<u64>()).sum::<Result<_, _>>()?)
}

/// A holder of `name` (its hold replicated to `replicas` replicas of the
/// primary at `primary`) and a waiter in `lock()` behind it, which reports
/// when it was granted.
struct Waiter {
    holder: Guard,
    granted: tokio::task::JoinHandle<Option<Instant>>,
}

impl Waiter {
    async fn start(
        client: &Client,
        node: &Node,
        name: &str,
        primary: &str,
        replicas: u64,
    ) -> Res<Waiter> {
        let holder = client.lock(node, name)?.with_owner(Owner::new("holder")?);
        let holder = holder.try_lock_for(Duration::ZERO, Some(LEASE)).await?;
        let holder = holder.ok_or("the holder was not granted")?;
        replicated(primary, name, replicas).await?;
        let waiting = client.lock(node, name)?.with_owner(Owner::new("waiter")?);
        let granted = tokio::spawn(async move {
            let guard = tokio::time::timeout(GIVE_UP, waiting.lock_with_lease(LEASE)).await;
            let at = Instant::now();
            guard.ok()?.ok()?.unlock().await.ok()?;
            Some(at)
        });
        Ok(Waiter { holder, granted })
    }

    /// At the fault: the holder unlocks (in the background: the release
    /// goes on until a primary answers). Then, the waiter's grant in ms
    /// from `started`.
    async fn released_at_fault(self, started: Instant) -> Option<i64> {
        tokio::spawn(self.holder.unlock());
        let granted = self.granted.await.ok()??;
        Some(granted.duration_since(started).as_millis() as i64)
    }
}

/// Waits until `replicas` replicas of the primary at `url` have its writes
/// so far (the hold of `name` among them).
async fn replicated(url: &str, name: &str, replicas: u64) -> Res<()> {
    let acknowledged = multilock_testkit::wait_replicated(url, name, replicas).await?;
    match acknowledged >= replicas {
        true => Ok(()),
        false => Err(format!("{acknowledged} of {replicas} replicas have the hold").into()),
    }
}

async fn connect(url: &str) -> Res<MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    let conn = tokio::time::timeout(PROBE_TIMEOUT, client.get_multiplexed_async_connection());
    Ok(conn.await.map_err(|_| format!("{url}: timed out"))??)
}

fn kind_of(err: &multilock::Error) -> String {
    match err {
        multilock::Error::NodeUnavailable { reason, .. } => format!("{reason:?}"),
        multilock::Error::Redis { source, .. } => format!("{:?}", source.code()),
        multilock::Error::NotHeld { .. } => "NotHeld".to_owned(),
        other => other.to_string(),
    }
}

fn count(errors: &mut BTreeMap<String, usize>, kind: String) {
    *errors.entry(kind).or_default() += 1;
}

fn cell(ms: Option<i64>) -> String {
    ms.map_or("never".to_owned(), |ms| ms.to_string())
}

fn errors_text(errors: &BTreeMap<String, usize>) -> String {
    let kinds: Vec<String> = errors.iter().map(|(k, n)| format!("{n} {k}")).collect();
    Some(kinds.join(", "))
        .filter(|t| !t.is_empty())
        .unwrap_or("none".to_owned())
}

/// A table column of a fault's rounds: its heading and its cell.
type Column = (&'static str, Box<dyn Fn(&Round) -> String>);

fn columns(fault: Fault) -> Vec<Column> {
    let ms = |figure: Figure| -> Box<dyn Fn(&Round) -> String> {
        Box::new(move |r| figure(r).map_or("—".to_owned(), |ms| ms.to_string()))
    };
    let mut columns: Vec<Column> = Vec::new();
    if fault.cluster() {
        columns.push(("replica took the slot", ms(|r| r.claimed)));
        columns.push(("Redis failover (every node switched)", ms(|r| r.redis)));
    } else {
        columns.push(("Redis failover", ms(|r| r.redis)));
    }
    let ours = match (fault.planned(), fault.cluster()) {
        (false, false) => "our first acquire",
        (true, false) => "first on the new primary",
        (_, true) => "our first acquire+release",
    };
    if fault.planned() {
        columns.push(("first acquire (any)", ms(|r| r.first_any)));
    }
    columns.push((ours, ms(|r| r.first_new)));
    columns.push(("overhead", ms(Round::overhead)));
    if fault.cluster() {
        columns.push((
            "overhead after the replica took the slot",
            ms(Round::overhead_after_claim),
        ));
        columns.push(("ours, one name retried", ms(|r| r.first_same)));
    }
    columns.push((
        "a waiter, its holder released at the fault",
        ms(|r| r.waiter),
    ));
    columns.push(("attempts", Box::new(|r| r.attempts.to_string())));
    if fault.planned() {
        let late = "granted by the old primary after Redis switched";
        let late_cell = |r: &Round| {
            r.old_grants_after_switch()
                .map_or("—".to_owned(), |n| n.to_string())
        };
        columns.push((late, Box::new(late_cell)));
        let cluster = fault.cluster();
        let burst = move |r: &Round| match r.burst {
            Some((n, still_primary)) if still_primary || cluster => n.to_string(),
            Some((n, _)) => format!("{n} (demoted by its end)"),
            None => "not run".to_owned(),
        };
        let heading = if cluster {
            "scripts sent to the old primary in the burst"
        } else {
            "scripts run by the old primary in the burst"
        };
        columns.push((heading, Box::new(burst)));
    }
    columns
}

fn print_header(fault: Fault) {
    let from = if fault.planned() {
        "the request"
    } else {
        "the kill"
    };
    println!("\n{}; times in ms from {from}\n", fault.title());
    let columns = columns(fault);
    let headings: Vec<&str> = columns.iter().map(|(heading, _)| *heading).collect();
    println!("| round | {} | not counted |", headings.join(" | "));
    println!("|---|{}---|", "---:|".repeat(columns.len()));
}

fn print_row(fault: Fault, round: usize, r: &Round) {
    let cells: Vec<String> = columns(fault).iter().map(|(_, cell)| cell(r)).collect();
    println!(
        "| {round} | {} | {} |",
        cells.join(" | "),
        errors_text(&r.errors)
    );
}

fn print_summary(fault: Fault, rounds: &[Round]) {
    let title = fault.title();
    println!("\nSummary, {title} ({} rounds), ms\n", rounds.len());
    println!("| | median | min | max | never |\n|---|---:|---:|---:|---:|");
    let mut figures: Vec<(&str, Figure)> = Vec::new();
    if fault.cluster() {
        figures.push(("replica took the slot", |r| r.claimed));
        figures.push(("Redis failover (every node switched)", |r| r.redis));
        figures.push(("our first acquire+release", |r| r.first_new));
        figures.push(("our overhead", Round::overhead));
        figures.push((
            "our overhead after the replica took the slot",
            Round::overhead_after_claim,
        ));
        figures.push(("ours, one name retried", |r| r.first_same));
    } else {
        figures.push(("Redis failover", |r| r.redis));
        figures.push(("our first acquire on the new primary", |r| r.first_new));
        figures.push(("our overhead", Round::overhead));
    }
    figures.push(("a waiter, its holder released at the fault", |r| r.waiter));
    for (what, figure) in figures {
        let mut known: Vec<i64> = rounds.iter().filter_map(figure).collect();
        let never = rounds.len() - known.len();
        known.sort_unstable();
        let median = match known.len() {
            0 => "—".to_owned(),
            n if n % 2 == 1 => known[n / 2].to_string(),
            n => format!("{}", (known[n / 2 - 1] + known[n / 2]) as f64 / 2.0),
        };
        let (min, max) = (cell(known.first().copied()), cell(known.last().copied()));
        println!("| {what} | {median} | {min} | {max} | {never} |");
    }
    let mut errors = BTreeMap::new();
    for (kind, n) in rounds.iter().flat_map(|r| &r.errors) {
        *errors.entry(kind.clone()).or_insert(0) += n;
    }
    println!(
        "\nAttempts not counted, all rounds: {}",
        errors_text(&errors)
    );
}
