//! Failure modes side by side: what a single master with an async replica
//! (plain, and with `WAIT`-based replica sync), a `MultiLock` and a
//! `RedLock` do when servers die, freeze, restart empty or are cut off, and
//! when a holder stalls past its lease.
//!
//! ```text
//! cargo run --example failure_modes                 # containers if Docker works, else processes
//! cargo run --example failure_modes -- --processes  # local redis-server processes only
//! ```
//!
//! Containers use the test kit's image (`MULTILOCK_REDIS_IMAGE`, default
//! `redis:7`; offline: `bash docker/build-local-image.sh` and
//! `MULTILOCK_REDIS_IMAGE=multilock-redis:local`). Without Docker the same
//! scenarios run on `redis-server` processes, except the network partition,
//! which needs containers.
//!
//! Every scenario is one protocol: client A takes the lock, a fault is
//! injected, client B tries while A still believes it holds the lock
//! (phase 1), then A lets go and B tries again (phase 2). Printed: a table
//! of scenario × lock type with "mutual exclusion kept? / lock available? /
//! B's time to acquire", and `target/failure_modes.svg`, a timeline of who
//! held the lock when.

use std::fmt::Write as _;
use std::io;
use std::time::{Duration, Instant};

use multilock::testkit::{
    RedisContainer, RedisProcess, ReplicatedPair, Side, TestServer, wait_replica_acks,
};
use multilock::{Client, Error, Guard, Lock, MultiLock, Node, RedLock};

/// Per-request timeouts of every node.
const NODE_TIMEOUT: Duration = Duration::from_millis(300);
/// Fixed lease of the holders that use one.
const LEASE: Duration = Duration::from_secs(4);
/// Watchdog timeout of the partition scenario's holder.
const WATCHDOG: Duration = Duration::from_millis(1500);
/// How long B holds the lock once it has it (so it shows on the timeline).
const B_HOLDS: Duration = Duration::from_millis(300);
const NAME: &str = "resource";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Containers,
    Processes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Single,
    SingleSync,
    Multi,
    Red,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Single, Kind::SingleSync, Kind::Multi, Kind::Red];

    fn title(self) -> &'static str {
        match self {
            Kind::Single => "single + replica",
            Kind::SingleSync => "single + replica, WAIT 1",
            Kind::Multi => "MultiLock (3)",
            Kind::Red => "RedLock (5)",
        }
    }

    fn is_single(self) -> bool {
        matches!(self, Kind::Single | Kind::SingleSync)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Failover,
    TwoDown,
    Paused,
    Restart,
    DelayedRestart,
    CutOff,
    Stall,
}

impl Scenario {
    const ALL: [Scenario; 7] = [
        Scenario::Failover,
        Scenario::TwoDown,
        Scenario::Paused,
        Scenario::Restart,
        Scenario::DelayedRestart,
        Scenario::CutOff,
        Scenario::Stall,
    ];

    fn title(self) -> &'static str {
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
}

// ---------------------------------------------------------------- servers

/// A server of either backend.
enum Server {
    Container(RedisContainer),
    Process(RedisProcess),
}

impl Server {
    fn url(&self) -> String {
        match self {
            Server::Container(s) => s.url(),
            Server::Process(s) => s.url(),
        }
    }

    /// The address clients on the other side of a partition use.
    fn other_side_url(&self) -> String {
        match self {
            Server::Container(s) => s.url_from(Side::B),
            Server::Process(s) => s.url(),
        }
    }

    async fn kill(&mut self) -> io::Result<()> {
        match self {
            Server::Container(s) => s.kill().await,
            Server::Process(s) => s.kill().await,
        }
    }

    async fn pause(&mut self) -> io::Result<()> {
        match self {
            Server::Container(s) => s.pause().await,
            Server::Process(s) => s.pause().await,
        }
    }

    async fn unpause(&mut self) -> io::Result<()> {
        match self {
            Server::Container(s) => s.unpause().await,
            Server::Process(s) => s.unpause().await,
        }
    }

    async fn restart(&mut self) -> io::Result<()> {
        match self {
            Server::Container(s) => s.restart().await,
            Server::Process(s) => s.restart().await,
        }
    }

    /// Cuts the holder's side only (containers).
    async fn cut_holder_side(&mut self) -> io::Result<()> {
        match self {
            Server::Container(s) => s.partition_side(Side::A).await,
            Server::Process(_) => Err(io::Error::other("a partition needs containers")),
        }
    }

    async fn rm(self) {
        if let Server::Container(s) = self {
            let _ = s.rm().await;
        }
    }
}

async fn command<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> io::Result<T> {
    let run = async {
        let mut conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        cmd.query_async::<T>(&mut conn).await
    };
    match tokio::time::timeout(Duration::from_secs(3), run).await {
        Ok(reply) => reply.map_err(io::Error::other),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "no reply")),
    }
}

/// Makes the primary sync a (re)connecting replica at once, not after the
/// default 5 s wait for more replicas (containers get the same as a flag).
async fn tune_primary(url: &str) -> io::Result<()> {
    let _: String = command(
        url,
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("repl-diskless-sync-delay")
            .arg(0),
    )
    .await?;
    Ok(())
}

/// The servers of one lock type: for the single kinds a primary and its
/// replica; else 3 or 5 independent masters.
struct Topology {
    kind: Kind,
    backend: Backend,
    servers: Vec<Server>,
}

impl Topology {
    async fn start(kind: Kind, backend: Backend) -> io::Result<Topology> {
        let servers = match (kind.is_single(), backend) {
            (true, Backend::Containers) => {
                let ReplicatedPair { primary, replica } = ReplicatedPair::start().await?;
                vec![Server::Container(primary), Server::Container(replica)]
            }
            (true, Backend::Processes) => {
                let mut pair = RedisProcess::start_many(2).await?;
                let replica = pair.pop().expect("two");
                let primary = pair.pop().expect("two");
                tune_primary(&primary.url()).await?;
                let _: String = command(
                    &replica.url(),
                    redis::cmd("REPLICAOF").arg("127.0.0.1").arg(primary.port()),
                )
                .await?;
                wait_replica_acks(&primary.url(), Duration::from_secs(20)).await?;
                vec![Server::Process(primary), Server::Process(replica)]
            }
            (false, Backend::Containers) => {
                let n = if kind == Kind::Multi { 3 } else { 5 };
                RedisContainer::start_many_two_sided(n)
                    .await?
                    .into_iter()
                    .map(Server::Container)
                    .collect()
            }
            (false, Backend::Processes) => {
                let n = if kind == Kind::Multi { 3 } else { 5 };
                RedisProcess::start_many(n)
                    .await?
                    .into_iter()
                    .map(Server::Process)
                    .collect()
            }
        };
        Ok(Topology {
            kind,
            backend,
            servers,
        })
    }

    /// The lock as a client sees it. `urls` picks each server's address.
    fn lock_on(&self, client: &Client, urls: Vec<String>) -> AnyLock {
        let nodes: Vec<Node> = urls.into_iter().map(node).collect();
        match self.kind {
            Kind::Single => AnyLock::Single(client.lock(&nodes[0], NAME).unwrap()),
            Kind::SingleSync => AnyLock::Single(
                client
                    .lock(&nodes[0], NAME)
                    .unwrap()
                    .with_replica_sync(1, Duration::from_millis(200))
                    .unwrap(),
            ),
            Kind::Multi => AnyLock::Multi(client.multi_lock_on(&nodes, NAME).unwrap()),
            Kind::Red => AnyLock::Red(client.red_lock_on(&nodes, NAME).unwrap()),
        }
    }

    /// The lock on the primary (single kinds) or on every master.
    fn lock(&self, client: &Client) -> AnyLock {
        let urls = if self.kind.is_single() {
            vec![self.servers[0].url()]
        } else {
            self.servers.iter().map(Server::url).collect()
        };
        self.lock_on(client, urls)
    }

    /// The lock through the other side of a partition.
    fn lock_from_other_side(&self, client: &Client) -> AnyLock {
        let urls = if self.kind.is_single() {
            vec![self.servers[0].other_side_url()]
        } else {
            self.servers.iter().map(Server::other_side_url).collect()
        };
        self.lock_on(client, urls)
    }

    /// The lock on the promoted replica (single kinds).
    fn lock_on_replica(&self, client: &Client) -> AnyLock {
        self.lock_on(client, vec![self.servers[1].url()])
    }

    /// Stops replication to the replica: containers leave the replication
    /// network; a process replica is pointed at a dead address.
    async fn cut_replication(&mut self) -> io::Result<()> {
        match &mut self.servers[1] {
            Server::Container(replica) => replica.partition_side(Side::B).await,
            Server::Process(replica) => {
                let dead = std::net::TcpListener::bind("127.0.0.1:0")?
                    .local_addr()?
                    .port();
                let _: String = command(
                    &replica.url(),
                    redis::cmd("REPLICAOF").arg("127.0.0.1").arg(dead),
                )
                .await?;
                Ok(())
            }
        }
    }

    async fn promote_replica(&mut self) -> io::Result<()> {
        if let Server::Container(replica) = &mut self.servers[1] {
            replica.heal_side(Side::B).await?;
        }
        let _: String = command(
            &self.servers[1].url(),
            redis::cmd("REPLICAOF").arg("NO").arg("ONE"),
        )
        .await?;
        Ok(())
    }

    async fn rm(self) {
        for server in self.servers {
            server.rm().await;
        }
    }
}

fn node(url: String) -> Node {
    Node::builder(url)
        .connect_timeout(NODE_TIMEOUT)
        .response_timeout(NODE_TIMEOUT)
        .build()
        .expect("valid URL")
}

fn client(watchdog: Duration) -> Client {
    Client::builder()
        .watchdog_timeout(watchdog)
        .build()
        .unwrap()
}

/// The three lock types behind one face.
#[derive(Clone)]
enum AnyLock {
    Single(Lock),
    Multi(MultiLock),
    Red(RedLock),
}

impl AnyLock {
    async fn try_lock_for(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> multilock::Result<Option<Guard>> {
        match self {
            AnyLock::Single(l) => l.try_lock_for(wait, lease).await,
            AnyLock::Multi(l) => l.try_lock_for(wait, lease).await,
            AnyLock::Red(l) => l.try_lock_for(wait, lease).await,
        }
    }

    fn fenced(&self) -> AnyLock {
        match self {
            AnyLock::Single(l) => AnyLock::Single(l.with_fencing()),
            AnyLock::Multi(l) => AnyLock::Multi(l.with_fencing()),
            AnyLock::Red(l) => AnyLock::Red(l.with_fencing()),
        }
    }
}

// ---------------------------------------------------------------- runs

/// Who held the lock when, on one scenario's clock.
#[derive(Default)]
struct Timeline {
    /// `(client, from, to)`: A's span is as long as A believed it held.
    spans: Vec<(char, Duration, Duration)>,
    marks: Vec<(Duration, String)>,
    end: Duration,
}

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

    fn mark(&mut self, label: impl Into<String>) {
        let at = self.now();
        self.timeline.marks.push((at, label.into()));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exclusion {
    Kept,
    Lost,
    /// Two clients believed they held the lock, but the stale one's write
    /// was rejected by its fencing token.
    Fenced,
    /// A never got the lock (refused, say, by replica sync): nothing to
    /// keep, and not to be mistaken for "kept".
    Refused,
}

struct Outcome {
    exclusion: Exclusion,
    available: bool,
    time_to_acquire: Option<Duration>,
}

enum Cell {
    Done(Outcome, Timeline, Vec<String>),
    NotApplicable(&'static str),
    Failed(String),
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
            run.timeline.marks.push((to, "A told: lost".to_owned()));
        }
    }
}

/// Tries until granted or `wait` is spent; errors (no quorum, replica
/// sync, node down) count as "not now".
async fn try_until(lock: &AnyLock, wait: Duration, lease: Option<Duration>) -> Option<Guard> {
    let started = Instant::now();
    loop {
        let left = wait.saturating_sub(started.elapsed());
        if let Ok(Some(guard)) = lock
            .try_lock_for(left.min(Duration::from_millis(500)), lease)
            .await
        {
            return Some(guard);
        }
        if started.elapsed() >= wait {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
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
        // Both believe they hold the lock: B works, then both let go.
        let latency = run.now() - phase_1;
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
            time_to_acquire: Some(latency),
        };
    }
    if let Some(a) = a {
        run.mark("A lets go");
        a.release(run).await;
    }
    let phase_2 = run.now();
    let granted = try_until(b, after, Some(LEASE)).await;
    let time_to_acquire = granted.as_ref().map(|_| run.now() - phase_2);
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
        time_to_acquire,
    }
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

/// A takes the lock with `lease` (`None`: the watchdog), within 3 s.
async fn take(run: &mut Run, lock: &AnyLock, lease: Option<Duration>) -> Option<Held> {
    match lock.try_lock_for(Duration::from_secs(3), lease).await {
        Ok(Some(guard)) => Some(hold(run, guard)),
        Ok(None) => {
            run.mark("A: not acquired");
            None
        }
        Err(err) => {
            let short = match &err {
                Error::ReplicaSync { .. } => "A refused (no ack)".to_owned(),
                _ => "A failed".to_owned(),
            };
            run.mark(short);
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
    t.servers[3].pause().await?;
    t.servers[4].pause().await?;
    let a = take(run, &t.lock(a_client), Some(LEASE)).await;
    t.servers[3].unpause().await?;
    t.servers[4].unpause().await?;
    run.mark("A holds 3 of 5");
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(a)
}

/// Restarts `server` empty; a process primary gets its replication
/// settings back.
async fn restart_empty(server: &mut Server, kind: Kind, backend: Backend) -> io::Result<()> {
    server.restart().await?;
    if kind.is_single() && backend == Backend::Processes {
        tune_primary(&server.url()).await?;
    }
    Ok(())
}

async fn scenario(s: Scenario, t: &mut Topology, run: &mut Run) -> io::Result<Option<Outcome>> {
    let a_client = client(WATCHDOG);
    let b_client = client(WATCHDOG);
    let kind = t.kind;
    Ok(Some(match s {
        Scenario::Failover => {
            if kind.is_single() {
                t.cut_replication().await?;
                run.mark("link cut");
                let a = take(run, &t.lock(&a_client), Some(LEASE)).await;
                t.servers[0].kill().await?;
                run.mark("primary killed");
                t.promote_replica().await?;
                run.mark("promoted");
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
                t.servers[0].kill().await?;
                run.mark("node 1 killed");
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
            t.servers[0].kill().await?;
            t.servers[1].kill().await?;
            run.mark(if kind.is_single() {
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
            t.servers[0].pause().await?;
            run.mark(if kind.is_single() {
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
            t.servers[0].unpause().await?;
            outcome
        }
        Scenario::Restart => {
            let a = take_bare_majority(t, run, &a_client).await?;
            let index = if kind == Kind::Multi { 1 } else { 0 };
            restart_empty(&mut t.servers[index], kind, t.backend).await?;
            run.mark(if kind.is_single() {
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
            t.servers[0].kill().await?;
            run.mark("node 1 down");
            let b = t.lock(&b_client);
            let backend = t.backend;
            let node = &mut t.servers[0];
            let delayed_restart = async {
                tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
                restart_empty(node, kind, backend).await
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
            if t.backend == Backend::Processes {
                return Ok(None);
            }
            let a = take(run, &t.lock(&a_client), None).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let cut = match kind {
                Kind::Single | Kind::SingleSync | Kind::Multi => 1,
                Kind::Red => 3,
            };
            for server in &mut t.servers[..cut] {
                server.cut_holder_side().await?;
            }
            run.mark(if cut == 1 {
                "A cut off node 1"
            } else {
                "A cut off 3 of 5"
            });
            let b = t.lock_from_other_side(&b_client);
            contest(run, a, &b, WATCHDOG * 3, Duration::from_secs(2)).await
        }
        Scenario::Stall => return stall(t, run, &a_client, &b_client).await,
    }))
}

/// A fenced store: a write carries its writer's token and is applied only
/// if no higher token was seen.
const FENCED_SET: &str = r"
local highest = tonumber(redis.call('get', KEYS[2]) or '0')
if tonumber(ARGV[1]) < highest then
    return 0
end
redis.call('set', KEYS[2], ARGV[1])
redis.call('set', KEYS[1], ARGV[2])
return 1
";

async fn fenced_set(store: &str, token: u64, value: &str) -> io::Result<bool> {
    let mut conn = redis::Client::open(store)
        .map_err(io::Error::other)?
        .get_multiplexed_async_connection()
        .await
        .map_err(io::Error::other)?;
    let applied: i64 = redis::Script::new(FENCED_SET)
        .key("data")
        .key("data:token")
        .arg(token)
        .arg(value)
        .invoke_async(&mut conn)
        .await
        .map_err(io::Error::other)?;
    Ok(applied == 1)
}

/// A takes a fenced lock with a 1 s lease and stalls for 1.5 s without
/// looking at `lost()`; B takes the lock meanwhile and writes; A's late
/// write carries the older token.
async fn stall(
    t: &mut Topology,
    run: &mut Run,
    a_client: &Client,
    b_client: &Client,
) -> io::Result<Option<Outcome>> {
    const SHORT: Duration = Duration::from_secs(1);
    let store = match t.backend {
        Backend::Containers => Server::Container(RedisContainer::start().await?),
        Backend::Processes => Server::Process(RedisProcess::start().await?),
    };
    let store_url = store.url();
    let a_lock = t.lock(a_client).fenced();
    let b_lock = t.lock(b_client).fenced();
    let Ok(Some(a)) = a_lock
        .try_lock_for(Duration::from_secs(3), Some(SHORT))
        .await
    else {
        store.rm().await;
        return Err(io::Error::other("A could not take a free lock"));
    };
    let a_from = run.now();
    let a_token = a.fencing_token().expect("fenced");
    run.mark("A stalls");
    let b_task = tokio::spawn(async move {
        let started = Instant::now();
        let guard = try_until(&b_lock, Duration::from_secs(4), Some(LEASE)).await;
        guard.map(|g| (g, Instant::now(), started.elapsed()))
    });
    tokio::time::sleep(SHORT + Duration::from_millis(500)).await;
    let b = b_task.await.expect("B task");
    let mut outcome = Outcome {
        exclusion: Exclusion::Kept,
        available: b.is_some(),
        time_to_acquire: None,
    };
    if let Some((b, granted_at, waited)) = b {
        let b_token = b.fencing_token().expect("fenced");
        fenced_set(&store_url, b_token, "B").await?;
        // A wakes up, still believing it holds the lock, and writes.
        let a_applied = fenced_set(&store_url, a_token, "A").await?;
        run.timeline.spans.push(('A', a_from, run.now()));
        run.mark(if a_applied {
            "A's late write applied"
        } else {
            "A's late write rejected"
        });
        tokio::time::sleep(B_HOLDS).await;
        let _ = b.unlock().await;
        run.timeline
            .spans
            .push(('B', granted_at - run.t0, run.now()));
        outcome.time_to_acquire = Some(waited);
        outcome.exclusion = match (overlap(&run.timeline), a_applied) {
            (false, _) => Exclusion::Kept,
            (true, false) => Exclusion::Fenced,
            (true, true) => Exclusion::Lost,
        };
    }
    drop(a);
    store.rm().await;
    Ok(Some(outcome))
}

async fn run_cell(s: Scenario, kind: Kind, backend: Backend) -> Cell {
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
        Ok(Some(outcome)) => Cell::Done(outcome, run.timeline, run.notes),
        Ok(None) => Cell::NotApplicable("needs containers"),
        Err(err) => Cell::Failed(err.to_string()),
    }
}

// ---------------------------------------------------------------- output

fn cell_text(cell: &Cell) -> String {
    match cell {
        Cell::Done(o, ..) => {
            let exclusion = match o.exclusion {
                Exclusion::Kept => "kept",
                Exclusion::Lost => "LOST",
                Exclusion::Fenced => "fenced",
                Exclusion::Refused => "A refused",
            };
            let available = if o.available { "yes" } else { "no" };
            let time = o
                .time_to_acquire
                .map_or("—".to_owned(), |d| format!("{} ms", d.as_millis()));
            format!("{exclusion} / {available} / {time}")
        }
        Cell::NotApplicable(why) => format!("n/a ({why})"),
        Cell::Failed(_) => "failed".to_owned(),
    }
}

fn print_table(results: &[(Scenario, Vec<Cell>)]) {
    let first = 30;
    let width = 26;
    let mut out = format!("{:<first$}", "scenario");
    for kind in Kind::ALL {
        let _ = write!(out, "| {:<width$}", kind.title());
    }
    out.push('\n');
    out.push_str(&"-".repeat(first));
    for _ in Kind::ALL {
        let _ = write!(out, "+{}", "-".repeat(width + 1));
    }
    out.push('\n');
    for (scenario, cells) in results {
        let _ = write!(out, "{:<first$}", scenario.title());
        for cell in cells {
            let _ = write!(out, "| {:<width$}", cell_text(cell));
        }
        out.push('\n');
    }
    println!("{out}");
    println!(
        "cells: mutual exclusion (kept / LOST: two holders at once / fenced: two holders, the \
         stale write rejected by its fencing token / A refused: the first client never got it) \
         / lock available to the second client / its \
         time to acquire (while the first held it, or after the first let go)"
    );
    for (scenario, cells) in results {
        for (kind, cell) in Kind::ALL.iter().zip(cells) {
            match cell {
                Cell::Done(_, _, notes) => {
                    for note in notes {
                        println!("  {} / {}: {note}", scenario.title(), kind.title());
                    }
                }
                Cell::Failed(err) => {
                    println!("  {} / {}: FAILED: {err}", scenario.title(), kind.title())
                }
                Cell::NotApplicable(_) => {}
            }
        }
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The timelines as a grid: a row per scenario, a column per lock type.
fn svg(results: &[(Scenario, Vec<Cell>)], backend: Backend) -> String {
    const LEFT: f64 = 190.0;
    const TOP: f64 = 56.0;
    const CELL_W: f64 = 300.0;
    const CELL_H: f64 = 96.0;
    const PAD: f64 = 10.0;
    let span_max = results
        .iter()
        .flat_map(|(_, cells)| cells)
        .filter_map(|c| match c {
            Cell::Done(_, t, _) => Some(t.end.as_secs_f64()),
            _ => None,
        })
        .fold(1.0, f64::max)
        .ceil();
    let scale = (CELL_W - 2.0 * PAD) / span_max;
    let width = LEFT + CELL_W * Kind::ALL.len() as f64 + PAD;
    let height = TOP + CELL_H * results.len() as f64 + 40.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{PAD}" y="20" font-size="15" font-weight="bold">Who held the lock when ({})</text>"#,
        match backend {
            Backend::Containers => "Docker containers",
            Backend::Processes => "redis-server processes",
        }
    );
    for (i, kind) in Kind::ALL.iter().enumerate() {
        let x = LEFT + CELL_W * i as f64 + PAD;
        let _ = writeln!(
            s,
            r#"<text x="{x}" y="{}" font-weight="bold">{}</text>"#,
            TOP - 8.0,
            escape(kind.title())
        );
    }
    for (row, (scenario, cells)) in results.iter().enumerate() {
        let y0 = TOP + CELL_H * row as f64;
        let _ = writeln!(
            s,
            r#"<text x="{PAD}" y="{}" font-weight="bold">{}</text>"#,
            y0 + 30.0,
            escape(scenario.title())
        );
        for (col, cell) in cells.iter().enumerate() {
            let x0 = LEFT + CELL_W * col as f64;
            let _ = writeln!(
                s,
                r##"<rect x="{x0}" y="{y0}" width="{CELL_W}" height="{CELL_H}" fill="none" stroke="#ccc"/>"##
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" fill="{}">{}</text>"#,
                x0 + PAD,
                y0 + CELL_H - 8.0,
                match cell {
                    Cell::Done(o, ..) if o.exclusion == Exclusion::Lost => "#c00",
                    _ => "#333",
                },
                escape(&cell_text(cell))
            );
            let Cell::Done(_, timeline, _) = cell else {
                continue;
            };
            let x = |d: Duration| x0 + PAD + d.as_secs_f64() * scale;
            let lane = |who: char| if who == 'A' { y0 + 32.0 } else { y0 + 50.0 };
            for second in 0..=span_max as u32 {
                let tx = x(Duration::from_secs(second.into()));
                let _ = writeln!(
                    s,
                    r##"<line x1="{tx}" y1="{}" x2="{tx}" y2="{}" stroke="#eee"/>"##,
                    y0 + 28.0,
                    y0 + 66.0
                );
            }
            for who in ['A', 'B'] {
                let _ = writeln!(
                    s,
                    r##"<text x="{}" y="{}" fill="#666">{who}</text>"##,
                    x0 + 1.0,
                    lane(who) + 9.0
                );
            }
            for &(who, from, to) in &timeline.spans {
                let color = if who == 'A' { "#3b6fb6" } else { "#e08a1e" };
                let _ = writeln!(
                    s,
                    r#"<rect x="{}" y="{}" width="{}" height="12" fill="{color}" opacity="0.85"/>"#,
                    x(from),
                    lane(who),
                    (x(to) - x(from)).max(1.5)
                );
            }
            for &(_, a_from, a_to) in timeline.spans.iter().filter(|s| s.0 == 'A') {
                for &(_, b_from, b_to) in timeline.spans.iter().filter(|s| s.0 == 'B') {
                    let (from, to) = (a_from.max(b_from), a_to.min(b_to));
                    if from < to {
                        let _ = writeln!(
                            s,
                            r##"<rect x="{}" y="{}" width="{}" height="32" fill="#d00" opacity="0.3"/>"##,
                            x(from),
                            lane('A') - 1.0,
                            x(to) - x(from)
                        );
                    }
                }
            }
            for (i, (at, label)) in timeline.marks.iter().enumerate() {
                let mx = x(*at);
                let _ = writeln!(
                    s,
                    r##"<line x1="{mx}" y1="{}" x2="{mx}" y2="{}" stroke="#900" stroke-dasharray="2,2"/>"##,
                    y0 + 2.0,
                    y0 + 66.0
                );
                let _ = writeln!(
                    s,
                    r##"<text x="{}" y="{}" fill="#900" font-size="9">{}</text>"##,
                    mx + 2.0,
                    y0 + 9.0 + 8.5 * (i % 3) as f64,
                    escape(label)
                );
            }
        }
    }
    let _ = writeln!(
        s,
        r##"<text x="{PAD}" y="{}" fill="#333">Bars: A (blue) from its grant until it let go or was told the lock was lost; B (orange) while it held. Red: both at once. Dashed: faults. Grid: 1 s.</text>"##,
        height - 16.0
    );
    s.push_str("</svg>\n");
    s
}

// ---------------------------------------------------------------- main

async fn pick_backend() -> Backend {
    if std::env::args().any(|a| a == "--processes") {
        return Backend::Processes;
    }
    match RedisContainer::start().await {
        Ok(probe) => {
            let _ = probe.rm().await;
            Backend::Containers
        }
        Err(err) => {
            println!("containers unavailable ({err}); using redis-server processes");
            Backend::Processes
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = pick_backend().await;
    println!("backend: {backend:?}");
    let started = Instant::now();
    let mut results = Vec::new();
    for scenario in Scenario::ALL {
        let mut cells = Vec::new();
        for kind in Kind::ALL {
            let cell_started = Instant::now();
            let cell = run_cell(scenario, kind, backend).await;
            println!(
                "  {:<30} {:<26} {:<28} ({:.1} s)",
                scenario.title(),
                kind.title(),
                cell_text(&cell),
                cell_started.elapsed().as_secs_f64()
            );
            cells.push(cell);
        }
        results.push((scenario, cells));
    }
    println!();
    print_table(&results);
    let path = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("failure_modes.svg");
    std::fs::create_dir_all(path.parent().expect("in target/"))?;
    std::fs::write(&path, svg(&results, backend))?;
    println!(
        "\ntimeline: {} (total {:.0} s)",
        path.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
