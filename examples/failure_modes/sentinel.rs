//! The Sentinel table: a real primary loss, decided by real sentinels, on
//! the test kit's `SentinelGroup`s (`redis-server` processes on loopback,
//! whichever backend the main table ran on).
//!
//! One protocol per column: the replicas of group 1 stop receiving its
//! primary's writes; client A takes the lock, so A's grant lives on that
//! primary only; the primary is killed (SIGKILL) and the sentinels promote
//! a replica, which never received A's grant; client B tries while A still
//! holds the lock by its lease; then A lets go and B tries again.
//!
//! The replicas are cut off by pointing each (`REPLICAOF`) at a loopback
//! port that accepts and never answers, as the kit's `cut_link` does on
//! processes. Freezing them (SIGSTOP) would not do: the kernel keeps
//! what the primary sent in a frozen replica's socket buffer, and the
//! replica applies A's grant as soon as it runs again.

use std::error::Error;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use multilock::redis;
use multilock::{Client, Guard, Node};
use multilock_testkit::{SentinelGroup, TestServer};

use crate::scenarios::{B_HOLDS, try_until};
use crate::topology::{AnyLock, NAME, client, timed};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// A's lease: longer than the failover and B's first tries together, so
/// that A still holds the lock, by its own lease, while B tries.
const A_LEASE: Duration = Duration::from_secs(30);
/// B's lease (how long B then holds it is the main table's `B_HOLDS`).
const B_LEASE: Duration = Duration::from_secs(4);
/// How long B tries while A holds, then after A let go.
const B_WHILE_HELD: Duration = Duration::from_millis(1500);
const B_AFTER: Duration = Duration::from_secs(3);

/// The lock types compared, one column each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    /// One `Node::sentinel`: the lock follows the group's primary.
    Group,
    /// A RedLock of three `Node::sentinel`s, one per group.
    RedLockOfGroups,
}

impl Column {
    pub const ALL: [Column; 2] = [Column::Group, Column::RedLockOfGroups];

    pub fn title(self) -> &'static str {
        match self {
            Column::Group => "Sentinel group (1 primary + 2 replicas)",
            Column::RedLockOfGroups => "RedLock over 3 Sentinel groups",
        }
    }

    fn groups(self) -> usize {
        match self {
            Column::Group => 1,
            Column::RedLockOfGroups => 3,
        }
    }
}

/// Whether two clients held the lock at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exclusion {
    Kept,
    Lost,
}

/// What B got while A held the lock.
#[derive(Debug, Clone, Copy)]
pub enum WhileHeld {
    /// The lock, this long after B began to try.
    Granted(Duration),
    /// Nothing, for this long.
    Refused(Duration),
}

/// What B got once A let go.
#[derive(Debug, Clone, Copy)]
pub enum AfterRelease {
    /// B held the lock already.
    AlreadyHeld,
    /// The lock, this long after A let go.
    Granted(Duration),
    /// Nothing, for this long.
    NotWithin(Duration),
}

pub struct Outcome {
    pub exclusion: Exclusion,
    pub while_held: WhileHeld,
    pub after_release: AfterRelease,
    /// From the primary's SIGKILL until every sentinel names the promoted
    /// replica, and it is a primary.
    pub failover: Duration,
}

pub enum Cell {
    Done(Outcome),
    Failed(String),
}

/// Runs one column on fresh Sentinel groups, then stops them.
pub async fn run(column: Column) -> Cell {
    match play(column).await {
        Ok(outcome) => Cell::Done(outcome),
        Err(err) => Cell::Failed(err.to_string()),
    }
}

async fn play(column: Column) -> Result<Outcome> {
    let starts = (0..column.groups()).map(|_| SentinelGroup::start());
    let mut groups = futures::future::try_join_all(starts).await?;
    // Every hold here has a lease: the watchdog timeout does not matter.
    let a_client = client(Duration::from_secs(30));
    let b_client = client(Duration::from_secs(30));
    let a_lock = lock_on(&a_client, column, &groups)?;

    // The fault hits group 1 only: the other two stand for the RedLock's
    // majority.
    let silent = SilentPort::open().await?;
    cut_replication(&groups[0], silent.port).await?;
    // Nothing stands in A's way: a refusal is a broken run, not a result.
    let a = match a_lock
        .try_lock_for(Duration::from_secs(3), Some(A_LEASE))
        .await
    {
        Ok(Some(guard)) => Held::watch(guard),
        Ok(None) => return Err("A could not take the free lock".into()),
        Err(err) => return Err(format!("A could not take the free lock: {err}").into()),
    };
    let killed = Instant::now();
    let old = groups[0].kill_primary().await?;
    groups[0].wait_for_failover(old).await?;
    let failover = killed.elapsed();

    // B's nodes are made now: they find the promoted primary at once.
    let b_lock = lock_on(&b_client, column, &groups)?;
    let b_began = Instant::now();
    if let Some(guard) = try_until(&b_lock, B_WHILE_HELD, Some(B_LEASE)).await {
        let granted = Instant::now();
        tokio::time::sleep(B_HOLDS).await;
        let _ = guard.unlock().await;
        let (exclusion, after_release) = match a.release().await {
            // A learned it had lost the lock before B got it: no overlap.
            (told, true) if told <= granted => {
                (Exclusion::Kept, AfterRelease::Granted(granted - told))
            }
            _ => (Exclusion::Lost, AfterRelease::AlreadyHeld),
        };
        return Ok(Outcome {
            exclusion,
            while_held: WhileHeld::Granted(granted - b_began),
            after_release,
            failover,
        });
    }
    let while_held = WhileHeld::Refused(b_began.elapsed());
    let (let_go, _) = a.release().await;
    let after_release = match try_until(&b_lock, B_AFTER, Some(B_LEASE)).await {
        Some(guard) => {
            let waited = let_go.elapsed();
            let _ = guard.unlock().await;
            AfterRelease::Granted(waited)
        }
        None => AfterRelease::NotWithin(B_AFTER),
    };
    Ok(Outcome {
        exclusion: Exclusion::Kept,
        while_held,
        after_release,
        failover,
    })
}

/// The lock as a client sees it: on one Sentinel node, or a RedLock of
/// one Sentinel node per group.
fn lock_on(client: &Client, column: Column, groups: &[SentinelGroup]) -> Result<AnyLock> {
    let nodes = groups
        .iter()
        .map(|g| timed(Node::sentinel(g.master_name(), g.sentinel_urls())))
        .collect::<multilock::Result<Vec<Node>>>()?;
    Ok(match column {
        Column::Group => AnyLock::Single(client.lock(&nodes[0], NAME)?),
        Column::RedLockOfGroups => AnyLock::Red(client.red_lock_on(&nodes, NAME)?),
    })
}

/// Points every replica of `group` at `silent`: from then on the primary's
/// writes stay on the primary, as when replication lags.
async fn cut_replication(group: &SentinelGroup, silent: u16) -> Result<()> {
    let primary = group.primary().await?;
    let replicas = group.data_nodes().iter().enumerate();
    for (_, replica) in replicas.filter(|&(i, _)| i != primary) {
        let client = redis::Client::open(replica.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let mut replicaof = redis::cmd("REPLICAOF");
        replicaof.arg("127.0.0.1").arg(silent);
        replicaof.query_async::<()>(&mut conn).await?;
    }
    Ok(())
}

/// A loopback port that accepts connections and never answers: a replica
/// pointed at it waits for a primary that never speaks.
struct SilentPort {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl SilentPort {
    async fn open() -> std::io::Result<SilentPort> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            // Kept open, so the replica waits rather than reconnects.
            let mut accepted = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                accepted.push(socket);
            }
        });
        Ok(SilentPort { port, task })
    }
}

impl Drop for SilentPort {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A's hold, watched in a task: it ends when `lost()` fires or A lets go.
struct Held {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(Instant, bool)>,
}

impl Held {
    fn watch(guard: Guard) -> Held {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let lost = tokio::select! {
                _ = guard.lost() => true,
                _ = stopped => false,
            };
            let end = Instant::now();
            let _ = tokio::time::timeout(Duration::from_secs(1), guard.unlock()).await;
            (end, lost)
        });
        Held { stop, task }
    }

    /// A lets go, or had already learned it lost the lock: when, and
    /// whether it was told.
    async fn release(self) -> (Instant, bool) {
        let _ = self.stop.send(());
        self.task.await.unwrap_or((Instant::now(), false))
    }
}

/// The cells of one column, in the table's row order.
fn cells(cell: &Cell) -> [String; 4] {
    let Cell::Done(o) = cell else {
        return std::array::from_fn(|_| "failed".to_owned());
    };
    let exclusion = match o.exclusion {
        Exclusion::Kept => "kept",
        Exclusion::Lost => "LOST: two holders",
    };
    let while_held = match o.while_held {
        WhileHeld::Granted(d) => format!("granted in {} ms", d.as_millis()),
        WhileHeld::Refused(d) => format!("refused for {:.1} s", d.as_secs_f64()),
    };
    let after_release = match o.after_release {
        AfterRelease::AlreadyHeld => "— (B held it already)".to_owned(),
        AfterRelease::Granted(d) => format!("{} ms", d.as_millis()),
        AfterRelease::NotWithin(d) => format!("not within {:.0} s", d.as_secs_f64()),
    };
    let failover = format!("{:.1} s", o.failover.as_secs_f64());
    [exclusion.to_owned(), while_held, after_release, failover]
}

/// A column's cells on one line, for the progress output.
pub fn cell_text(cell: &Cell) -> String {
    match cell {
        Cell::Done(_) => cells(cell).join(" / "),
        Cell::Failed(_) => "failed".to_owned(),
    }
}

const ROWS: [&str; 4] = [
    "mutual exclusion",
    "B while A holds",
    "B after A let go",
    "failover (kill to promoted)",
];

pub const TITLE: &str = "Sentinel failover: a real primary loss, replication lagging";

/// What the fault is, and why each row is there.
const LEGEND: &str = "\
fault: group 1's replicas stop receiving its primary's writes; A takes the lock (30 s lease),
  so its grant lives on that primary only; the primary is killed and the sentinels promote a
  replica that never saw the grant; B then tries. The RedLock's other two groups are untouched.
- mutual exclusion: LOST when B got the lock while A still held it by its lease. That is the
  double grant asynchronous replication allows: Redis acknowledges A's write before any
  replica has it, and a failover keeps only what the replicas had;
- B while A holds: B's tries for 1.5 s once the sentinels agree on the promoted replica. The
  group grants B, its new primary being empty; the RedLock refuses B, A still holding the
  two groups that did not fail over, a majority;
- B after A let go: availability after the failover: how soon B gets the lock once A unlocks;
- failover: from the primary's SIGKILL until all three sentinels name the promoted replica
  (down-after-milliseconds 1000, then their vote); locks on the group wait that long.";

pub fn print_table(results: &[(Column, Cell)]) {
    let first = 29;
    let width = 40;
    let mut out = format!("{TITLE}\n{:<first$}", "");
    for (column, _) in results {
        let _ = write!(out, "| {:<width$}", column.title());
    }
    out.push('\n');
    out.push_str(&"-".repeat(first));
    for _ in results {
        let _ = write!(out, "+{}", "-".repeat(width + 1));
    }
    out.push('\n');
    let columns: Vec<[String; 4]> = results.iter().map(|(_, cell)| cells(cell)).collect();
    for (i, row) in ROWS.iter().enumerate() {
        let _ = write!(out, "{row:<first$}");
        for column in &columns {
            let _ = write!(out, "| {:<width$}", column[i]);
        }
        out.push('\n');
    }
    println!("{out}");
    println!("{LEGEND}");
    for (column, cell) in results {
        if let Cell::Failed(err) = cell {
            println!("  {} / {}: FAILED: {err}", TITLE, column.title());
        }
    }
}
