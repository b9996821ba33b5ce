//! The workers: each takes locks of one kind over and over, on a random
//! name, in a random way, sometimes cut off mid-acquire; while it holds, it
//! writes its fencing token to the name's fenced store as long as the guard
//! says it is valid; every hold and write goes into the history, and every
//! wait for a fair lock on its own node too. `fresh.rs` runs the workers of
//! fresh names with the pieces here.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use multilock::{
    Client, DistributedLock, Error, Guard, Lock, MultiLock, Node, Owner, RedLock, Result,
};
use multilock_testkit::{Access, FencedStore, History, protocol};
use rand::RngExt;
use rand::rngs::StdRng;
use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle};

use crate::fresh::FreshLog;
use crate::scenario::Scenario;
use crate::{NODE_TIMEOUT, NodeSets};

/// The kind of lock a worker takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A RedLock of reentrant locks.
    Red,
    /// A MultiLock of reentrant locks.
    Multi,
    /// A RedLock of read locks or of write locks (a fourth are writes).
    ReadWrite,
    /// A fair lock on a node of its own.
    Fair,
    /// A RedLock of fair locks.
    FairRed,
    /// A fenced RedLock of reentrant locks on a name never used before.
    Fresh,
}

/// A group of nodes: the five RedLock nodes, the three MultiLock nodes,
/// the fair lock's node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nodes {
    Red,
    Multi,
    Fair,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Red => "RedLock",
            Kind::Multi => "MultiLock",
            Kind::ReadWrite => "RW RedLock",
            Kind::Fair => "FairLock",
            Kind::FairRed => "Fair RedLock",
            Kind::Fresh => "Fresh RedLock",
        }
    }

    /// The nodes its locks live on.
    pub fn nodes(self) -> Nodes {
        match self {
            Kind::Red | Kind::ReadWrite | Kind::FairRed | Kind::Fresh => Nodes::Red,
            Kind::Multi => Nodes::Multi,
            Kind::Fair => Nodes::Fair,
        }
    }
}

/// The key of lock `name`'s fenced store.
pub fn store_key(name: &str) -> String {
    format!("store:{name}")
}

/// What the workers of one kind did, for the report.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub acquired: u64,
    pub acquired_fenced: u64,
    /// A bounded wait that ended without the lock.
    pub not_granted: u64,
    /// Acquire errors by kind, with the first message of each.
    pub errors: BTreeMap<&'static str, (u64, String)>,
    /// Acquires cut off: by a timeout, by aborting their task, by the stop.
    pub cut_timeout: u64,
    pub cut_abort: u64,
    pub cut_stop: u64,
    /// Holds that ended before planned: validity over, or `lost()`.
    pub ended_early: u64,
    pub unlocked: u64,
    pub unlock_not_held: u64,
    /// Unlock errors other than "not held", by kind, with the first message.
    pub unlock_failed: BTreeMap<&'static str, (u64, String)>,
    pub dropped: u64,
    pub writes_accepted: u64,
    pub writes_refused: u64,
    pub write_errors: u64,
}

/// The workers' counts, per kind; shared by every worker.
#[derive(Debug, Default)]
pub struct Stats(Mutex<BTreeMap<Kind, Counts>>);

impl Stats {
    fn update(&self, kind: Kind, update: impl FnOnce(&mut Counts)) {
        update(self.0.lock().unwrap().entry(kind).or_default());
    }

    /// The counts of one kind so far.
    pub fn of(&self, kind: Kind) -> Counts {
        self.0
            .lock()
            .unwrap()
            .get(&kind)
            .cloned()
            .unwrap_or_default()
    }
}

/// What every worker shares.
pub struct Shared {
    pub history: Arc<History>,
    pub stats: Arc<Stats>,
    pub store_url: String,
    pub scenario: Scenario,
    /// Each fresh name's attempts and grants (`--locks fresh`).
    pub fresh: FreshLog,
}

/// A RedLock, a MultiLock or a lock of one node.
#[derive(Clone)]
pub enum AnyLock {
    Red(RedLock),
    Multi(MultiLock),
    Single(Lock),
}

/// One name a worker locks: its locks (a read-write lock's read and write
/// locks; one lock otherwise), and the fenced store its fenced holds write.
pub struct Target {
    pub name: Arc<str>,
    pub locks: Vec<(AnyLock, Access)>,
    pub store: Option<FencedStore>,
}

/// How an acquire is made; `Some(lease)` or the watchdog.
#[derive(Debug, Clone, Copy)]
enum How {
    Lock(Option<Duration>),
    TryFor(Duration, Option<Duration>),
}

/// How an acquire is cut off.
#[derive(Debug, Clone, Copy)]
pub enum Cut {
    Timeout,
    Abort,
    Stop,
}

pub enum Outcome {
    Granted(Guard),
    NotGranted,
    Failed(Error),
    Cut(Cut),
}

impl From<Result<Option<Guard>>> for Outcome {
    fn from(result: Result<Option<Guard>>) -> Outcome {
        match result {
            Ok(Some(guard)) => Outcome::Granted(guard),
            Ok(None) => Outcome::NotGranted,
            Err(err) => Outcome::Failed(err),
        }
    }
}

/// One worker: a client, an owner of its own, the locks of one kind.
pub struct Worker {
    kind: Kind,
    /// Its hash field, `<client-uuid>:<owner>`: how a fair queue names it.
    field: String,
    pub label: String,
    targets: Vec<Target>,
    pub shared: Arc<Shared>,
    rng: StdRng,
    /// What a worker of fresh names makes its locks with.
    client: Client,
    red_nodes: Vec<Node>,
    owner: Owner,
}

impl Worker {
    pub fn new(
        client: &Client,
        nodes: &NodeSets,
        kind: Kind,
        label: String,
        shared: Arc<Shared>,
        rng: StdRng,
    ) -> Result<Worker> {
        // An explicit owner: an acquire may run in a task of its own (to be
        // aborted), and the guard outlives that task.
        let owner = Owner::new(format!("hc-{label}"))?;
        let names = shared
            .scenario
            .plans
            .iter()
            .filter(|plan| plan.kind == kind)
            .flat_map(|plan| plan.names.iter().copied());
        let mut targets = Vec::new();
        for (name, fenced) in names {
            let red = |locks: Vec<Lock>| -> Result<AnyLock> {
                let lock = client.red_lock(locks)?.with_owner(owner.clone());
                Ok(AnyLock::Red(if fenced {
                    lock.with_fencing()
                } else {
                    lock
                }))
            };
            let locks = match kind {
                // A fresh worker has no fixed names: see fenced_red_target.
                Kind::Red | Kind::Fresh => {
                    let lock = client
                        .red_lock_on(&nodes.red, name)?
                        .with_owner(owner.clone());
                    vec![(
                        AnyLock::Red(if fenced { lock.with_fencing() } else { lock }),
                        Access::Exclusive,
                    )]
                }
                Kind::Multi => {
                    let lock = client
                        .multi_lock_on(&nodes.multi, name)?
                        .with_owner(owner.clone())
                        .with_node_timeout(NODE_TIMEOUT)?;
                    vec![(
                        AnyLock::Multi(if fenced { lock.with_fencing() } else { lock }),
                        Access::Exclusive,
                    )]
                }
                Kind::ReadWrite => {
                    let rws = nodes
                        .red
                        .iter()
                        .map(|node| client.read_write_lock(node, name))
                        .collect::<Result<Vec<_>>>()?;
                    // Reads are not fenced: they share.
                    let reads = client
                        .red_lock(rws.iter().map(|rw| rw.read().clone()).collect())?
                        .with_owner(owner.clone());
                    let writes = red(rws.iter().map(|rw| rw.write().clone()).collect())?;
                    vec![
                        (AnyLock::Red(reads), Access::Shared),
                        (writes, Access::Exclusive),
                    ]
                }
                Kind::Fair => {
                    let lock = client
                        .fair_lock(&nodes.fair[0], name)?
                        .with_owner(owner.clone());
                    let lock = if fenced { lock.with_fencing() } else { lock };
                    vec![(AnyLock::Single(lock), Access::Exclusive)]
                }
                Kind::FairRed => {
                    let fair = nodes
                        .red
                        .iter()
                        .map(|node| client.fair_lock(node, name))
                        .collect::<Result<Vec<_>>>()?;
                    vec![(red(fair)?, Access::Exclusive)]
                }
            };
            let store = fenced.then(|| FencedStore::new(&shared.store_url, store_key(name)));
            targets.push(Target {
                name: name.into(),
                locks,
                store,
            });
        }
        Ok(Worker {
            kind,
            field: protocol::field(client.id(), owner.as_str()),
            label,
            targets,
            shared,
            rng,
            client: client.clone(),
            red_nodes: nodes.red.clone(),
            owner,
        })
    }

    /// A fenced RedLock of `name` on the RedLock nodes, with its fenced
    /// store: what a worker of fresh names takes, one name after another.
    pub fn fenced_red_target(&self, name: String) -> Result<Target> {
        let lock = self
            .client
            .red_lock_on(&self.red_nodes, name.as_str())?
            .with_owner(self.owner.clone())
            .with_fencing();
        Ok(Target {
            store: Some(FencedStore::new(&self.shared.store_url, store_key(&name))),
            name: name.into(),
            locks: vec![(AnyLock::Red(lock), Access::Exclusive)],
        })
    }

    /// Acquires and holds until `stop`; a hold under way when it comes is
    /// finished and released.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        if self.kind == Kind::Fresh {
            return crate::fresh::run(self, stop).await;
        }
        while !*stop.borrow() {
            let target = self.rng.random_range(0..self.targets.len());
            let (lock, access) = self.pick_lock(target);
            let started = Instant::now();
            let outcome = self.acquire(lock, &mut stop).await;
            if self.kind == Kind::Fair {
                let name = &self.targets[target].name;
                self.shared
                    .history
                    .waited(name, &self.field, &self.label, started);
            }
            self.journal(&self.targets[target].name, &outcome, started);
            let store = self.targets[target].store.clone();
            self.conclude(outcome, access, store).await;
        }
    }

    /// One acquire of `lock`, made in a way picked at random, cut off as
    /// picked or by the stop.
    pub async fn acquire(&mut self, lock: AnyLock, stop: &mut watch::Receiver<bool>) -> Outcome {
        let how = self.pick_how();
        let cut = self.pick_cut();
        tokio::select! {
            outcome = attempt(lock, how, cut) => outcome,
            _ = stop.wait_for(|stopped| *stopped) => Outcome::Cut(Cut::Stop),
        }
    }

    /// Tells the journal of an acquire of `name` that did not grant.
    fn journal(&self, name: &str, outcome: &Outcome, started: Instant) {
        let (label, waited) = (&self.label, started.elapsed());
        match outcome {
            Outcome::Granted(_) => {}
            Outcome::NotGranted => {
                tracing::info!(target: "history_checker", lock = %name, worker = %label, ?waited, "not granted within a bounded wait");
            }
            Outcome::Failed(err) => {
                tracing::info!(target: "history_checker", lock = %name, worker = %label, ?waited, error = %err, "acquire failed");
            }
            Outcome::Cut(cut) => {
                tracing::info!(target: "history_checker", lock = %name, worker = %label, ?waited, ?cut, "acquire cut off");
            }
        }
    }

    /// What follows an acquire: the hold (writing to `store` while valid)
    /// and its release, or the count of what went wrong.
    pub async fn conclude(&mut self, outcome: Outcome, access: Access, store: Option<FencedStore>) {
        match outcome {
            Outcome::Granted(guard) => self.hold(store, access, guard).await,
            Outcome::NotGranted => self.count(|c| c.not_granted += 1),
            Outcome::Failed(err) => {
                self.count(|c| tally(&mut c.errors, &err));
                // A failed bounded wait: don't spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Outcome::Cut(Cut::Timeout) => self.count(|c| c.cut_timeout += 1),
            Outcome::Cut(Cut::Abort) => self.count(|c| c.cut_abort += 1),
            Outcome::Cut(Cut::Stop) => self.count(|c| c.cut_stop += 1),
        }
    }

    fn count(&self, update: impl FnOnce(&mut Counts)) {
        self.shared.stats.update(self.kind, update);
    }

    /// The target's lock: of a read-write lock, the read lock three times
    /// in four.
    fn pick_lock(&mut self, target: usize) -> (AnyLock, Access) {
        let locks = &self.targets[target].locks;
        let pick = if locks.len() > 1 && self.rng.random_bool(0.25) {
            1
        } else {
            0
        };
        locks[pick].clone()
    }

    /// `lock()` or a bounded wait; a fixed lease or the watchdog.
    fn pick_how(&mut self) -> How {
        let lease = self
            .rng
            .random_bool(0.6)
            .then_some(self.shared.scenario.lease);
        if self.rng.random_bool(0.5) {
            How::Lock(lease)
        } else {
            let wait = Duration::from_millis(self.rng.random_range(200..3_000));
            How::TryFor(wait, lease)
        }
    }

    /// A fifth of the acquires are cut off after 1–80 ms.
    fn pick_cut(&mut self) -> Option<(Cut, Duration)> {
        let after = Duration::from_millis(self.rng.random_range(1..80));
        match self.rng.random_range(0..100) {
            0..12 => Some((Cut::Timeout, after)),
            12..20 => Some((Cut::Abort, after)),
            _ => None,
        }
    }

    /// Mostly short holds, some long ones (the watchdog renews those).
    /// A `rolling` run holds briefly (its point is many fenced grants, and
    /// its lease is 2 s): a fiftieth of its holds outlive the lease.
    fn pick_hold(&mut self) -> Duration {
        let ms = if self.shared.scenario.short_holds {
            match self.rng.random_range(0..100) {
                0..90 => self.rng.random_range(1..20),
                90..98 => self.rng.random_range(20..200),
                _ => self.rng.random_range(2_000..3_000),
            }
        } else {
            match self.rng.random_range(0..100) {
                0..85 => self.rng.random_range(1..50),
                85..97 => self.rng.random_range(50..500),
                _ => self.rng.random_range(1_000..4_000),
            }
        };
        Duration::from_millis(ms)
    }

    /// Holds for a while, writing the token while the guard is valid, then
    /// unlocks (or drops the guard).
    async fn hold(&mut self, store: Option<FencedStore>, access: Access, guard: Guard) {
        let history = self.shared.history.clone();
        let id = history.granted_as(&guard, access, self.kind.label(), &self.label);
        let fenced = guard.fencing_token().is_some();
        self.count(|c| {
            c.acquired += 1;
            c.acquired_fenced += u64::from(fenced);
        });
        let end = Instant::now() + self.pick_hold();
        loop {
            let valid_until = guard.valid_until();
            history.observed(id, valid_until);
            if valid_until.is_none_or(|v| Instant::now() >= v) {
                self.count(|c| c.ended_early += 1);
                break;
            }
            if let (Some(store), Some(token)) = (&store, guard.fencing_token()) {
                let sent = Instant::now();
                match store.write(token, &self.label).await {
                    Ok(accepted) => {
                        history.wrote(id, token, sent, accepted);
                        self.count(|c| {
                            if accepted {
                                c.writes_accepted += 1;
                            } else {
                                c.writes_refused += 1;
                            }
                        });
                    }
                    Err(_) => self.count(|c| c.write_errors += 1),
                }
            }
            let now = Instant::now();
            if now >= end {
                break;
            }
            let nap = (end - now).min(Duration::from_millis(self.rng.random_range(20..150)));
            tokio::select! {
                _ = tokio::time::sleep(nap) => {}
                _ = guard.lost() => {
                    self.count(|c| c.ended_early += 1);
                    break;
                }
            }
        }
        history.released(id);
        if self.rng.random_bool(0.85) {
            let name = guard.name().to_owned();
            let result = guard.unlock().await;
            self.count(|c| match &result {
                Ok(()) => c.unlocked += 1,
                Err(Error::NotHeld { .. }) => c.unlock_not_held += 1,
                Err(err) => tally(&mut c.unlock_failed, err),
            });
            if let Err(err) = result {
                tracing::info!(target: "history_checker", lock = %name, worker = %self.label, error = %err, "unlock failed");
            }
        } else {
            tracing::info!(target: "history_checker", lock = %guard.name(), worker = %self.label, "guard dropped: released in the background");
            drop(guard);
            self.count(|c| c.dropped += 1);
        }
    }
}

/// One acquire, cut off as `cut` says.
async fn attempt(lock: AnyLock, how: How, cut: Option<(Cut, Duration)>) -> Outcome {
    match cut {
        None => lock.acquire(how).await.into(),
        Some((Cut::Timeout, after)) => match tokio::time::timeout(after, lock.acquire(how)).await {
            Ok(result) => result.into(),
            Err(_) => Outcome::Cut(Cut::Timeout),
        },
        Some((_, after)) => {
            let mut task = AbortOnDrop(tokio::spawn(async move { lock.acquire(how).await }));
            tokio::select! {
                result = &mut task.0 => joined(result),
                _ = tokio::time::sleep(after) => {
                    task.0.abort();
                    // Ok if it finished before the abort landed.
                    joined((&mut task.0).await)
                }
            }
        }
    }
}

/// The outcome of an acquire run in a task of its own: cancelled by our
/// abort (or by the runtime shutting down), or as it returned.
fn joined(result: std::result::Result<Result<Option<Guard>>, JoinError>) -> Outcome {
    match result {
        Ok(result) => result.into(),
        Err(err) if err.is_cancelled() => Outcome::Cut(Cut::Abort),
        Err(err) => std::panic::resume_unwind(err.into_panic()),
    }
}

/// A task aborted when its handle is dropped: an acquire cut off by the
/// stop must not live on.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl AnyLock {
    async fn acquire(&self, how: How) -> Result<Option<Guard>> {
        match self {
            AnyLock::Red(lock) => acquire(lock, how).await,
            AnyLock::Multi(lock) => acquire(lock, how).await,
            AnyLock::Single(lock) => acquire(lock, how).await,
        }
    }
}

async fn acquire<L: DistributedLock>(lock: &L, how: How) -> Result<Option<Guard>> {
    match how {
        How::Lock(None) => lock.lock().await.map(Some),
        How::Lock(Some(lease)) => lock.lock_with_lease(lease).await.map(Some),
        How::TryFor(wait, lease) => lock.try_lock_for(wait, lease).await,
    }
}

/// Counts `err` under its kind, keeping the first message of each kind.
fn tally(errors: &mut BTreeMap<&'static str, (u64, String)>, err: &Error) {
    errors
        .entry(error_kind(err))
        .or_insert_with(|| (0, err.to_string()))
        .0 += 1;
}

/// A short name for an error.
fn error_kind(err: &Error) -> &'static str {
    match err {
        Error::NoQuorum(_) => "no quorum",
        Error::NodeUnavailable { .. } => "node unavailable",
        Error::NotHeld { .. } => "not held",
        Error::InvalidArgument(_) => "invalid argument",
        Error::Redis { .. } => "redis",
        _ => "other",
    }
}
