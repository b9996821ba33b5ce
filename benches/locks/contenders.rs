//! The contenders: this crate, rslock and the limits behind one interface
//! (acquire, release, lock+unlock), and the helpers that run them in tasks.

use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::join_all;
use multilock::{Guard, Lock, MultiLock, Owner, RedLock};
use multilock_testkit::protocol::{self, AcquireReply};
use multilock_testkit::{redisson, redisson_rwlock};
use redis::aio::MultiplexedConnection;
use redis::{FromRedisValue, RedisResult, ScriptInvocation};
use tokio::task::JoinSet;

use crate::stats::{Latencies, nanos};
use crate::{BenchResult, LEASE};

/// Something that locks and unlocks: this crate, rslock, or the limit.
#[derive(Clone)]
pub enum Contender {
    /// This crate; `lease: None` takes the lock under the watchdog.
    Multilock {
        lock: AnyLock,
        lease: Option<Duration>,
    },
    Rslock {
        manager: rslock::LockManager,
        resource: String,
    },
    Limit(Limit),
}

/// The crate's three interchangeable lock types.
#[derive(Clone)]
pub enum AnyLock {
    Single(Lock),
    Multi(MultiLock),
    Red(RedLock),
}

/// A hold, handed back to the contender that made it.
pub enum Held {
    Guard(Guard),
    Rslock(rslock::Lock),
    /// The limit's hold, named by the id its acquire was sent with.
    Limit(String),
}

impl Held {
    /// The owner of the crate's hold: every acquire has one of its own, and
    /// its calls name it in their hash field (`<client-uuid>:<owner>`).
    pub fn owner(&self) -> Option<Owner> {
        match self {
            Held::Guard(guard) => Some(guard.owner().clone()),
            Held::Rslock(_) | Held::Limit(_) => None,
        }
    }
}

impl Contender {
    pub fn multilock(lock: AnyLock) -> Contender {
        Contender::Multilock {
            lock,
            lease: Some(LEASE),
        }
    }

    /// Acquires, waiting as long as it takes (the limit makes one attempt:
    /// it is only measured on free locks).
    pub async fn acquire(&self) -> BenchResult<Held> {
        Ok(match self {
            Contender::Multilock { lock, lease } => Held::Guard(lock.acquire(*lease).await?),
            Contender::Rslock { manager, resource } => {
                Held::Rslock(manager.acquire_no_guard(resource.as_str(), LEASE).await?)
            }
            Contender::Limit(limit) => Held::Limit(limit.acquire().await?),
        })
    }

    pub async fn release(&self, held: Held) -> BenchResult {
        match (self, held) {
            (_, Held::Guard(guard)) => guard.unlock().await?,
            // Best effort by design: rslock reports nothing.
            (_, Held::Rslock(lock)) => lock.release().await,
            (Contender::Limit(limit), Held::Limit(hold_id)) => limit.release(&hold_id).await?,
            (_, Held::Limit(_)) => unreachable!("only the limit makes a limit hold"),
        }
        Ok(())
    }

    pub async fn lock_unlock(&self) -> BenchResult {
        let held = self.acquire().await?;
        self.release(held).await
    }
}

impl AnyLock {
    async fn acquire(&self, lease: Option<Duration>) -> multilock::Result<Guard> {
        match (self, lease) {
            (AnyLock::Single(lock), Some(lease)) => lock.lock_with_lease(lease).await,
            (AnyLock::Single(lock), None) => lock.lock().await,
            (AnyLock::Multi(lock), Some(lease)) => lock.lock_with_lease(lease).await,
            (AnyLock::Multi(lock), None) => lock.lock().await,
            (AnyLock::Red(lock), Some(lease)) => lock.lock_with_lease(lease).await,
            (AnyLock::Red(lock), None) => lock.lock().await,
        }
    }
}

/// Which scripts a limit sends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Protocol {
    /// Redisson 3.24+'s (`multilock_testkit::redisson`): the acquire, the
    /// unlock that reads and writes its latch, and a `DEL` of the latch sent
    /// after the unlock's reply without waiting (on several nodes: each
    /// node's after its own reply). The limit every figure is
    /// held to: the protocol a Redisson-compatible lock competes with.
    Redisson,
    /// The crate's own script calls (`multilock_testkit::protocol`), each
    /// release deleting the previous one's latch as the crate's do: the cost
    /// of the crate's protocol alone.
    Crate,
    /// Redisson 3.24+'s read lock of a read-write lock
    /// (`multilock_testkit::redisson_rwlock`): the read acquire (a timeout
    /// key per hold), the read unlock with its latch (which, while other
    /// readers remain, reads every reader's timeout key to set the hash's
    /// TTL), and the latch's `DEL`, not awaited. Many limits on one name
    /// are many readers of one lock, each with a field of its own.
    RedissonRead,
    /// The crate's own read lock script calls (read acquire; read release
    /// deleting the previous one's latch): the limit of the crate's readers.
    CrateRead,
}

/// A limit: a bare connection per node sending one protocol's lock+unlock
/// and nothing else. On one node the calls go one after the other; on
/// several, each goes to all nodes at once (`join_all`).
#[derive(Clone)]
pub struct Limit {
    conns: Vec<MultiplexedConnection>,
    name: String,
    field: String,
    protocol: Protocol,
    /// The crate's protocol: latches of releases that replied, for the next
    /// release to delete.
    spent: Arc<Mutex<Vec<String>>>,
}

impl Limit {
    pub fn new(conns: Vec<MultiplexedConnection>, name: String, protocol: Protocol) -> Limit {
        Limit {
            conns,
            field: protocol::field(&uuid::Uuid::new_v4().to_string(), "limit"),
            name,
            protocol,
            spent: Arc::default(),
        }
    }

    /// One acquire; returns the id its release names (the crate's hold id;
    /// Redisson names its unlock request at the unlock).
    async fn acquire(&self) -> BenchResult<String> {
        match self.protocol {
            Protocol::Redisson | Protocol::RedissonRead => {
                let invocation = if self.protocol == Protocol::Redisson {
                    redisson::acquire(&self.name, &self.field, LEASE)
                } else {
                    redisson_rwlock::read_acquire(&self.name, &self.field, LEASE)
                };
                for reply in self.on_every_node::<Option<i64>>(&invocation).await {
                    if let Some(pttl) = reply? {
                        return Err(
                            format!("the limit found {} taken ({pttl} ms)", self.name).into()
                        );
                    }
                }
                Ok(String::new())
            }
            Protocol::Crate | Protocol::CrateRead => {
                let hold_id = protocol::new_hold_id();
                let invocation = if self.protocol == Protocol::Crate {
                    protocol::acquire(&self.name, &self.field, LEASE, &hold_id)
                } else {
                    protocol::read_acquire(&self.name, &self.field, LEASE, &hold_id)
                };
                for reply in self.on_every_node::<AcquireReply>(&invocation).await {
                    let reply = reply?;
                    if !matches!(reply, AcquireReply::Granted { .. }) {
                        return Err(
                            format!("the limit found {} taken: {reply:?}", self.name).into()
                        );
                    }
                }
                Ok(hold_id)
            }
        }
    }

    async fn release(&self, hold_id: &str) -> BenchResult {
        let (invocation, request) = match self.protocol {
            Protocol::Redisson => {
                let request = redisson::new_request_id();
                (
                    redisson::release(&self.name, &self.field, &request, LEASE),
                    request,
                )
            }
            Protocol::RedissonRead => {
                let request = redisson::new_request_id();
                (
                    redisson_rwlock::read_release(&self.name, &self.field, &request),
                    request,
                )
            }
            Protocol::Crate | Protocol::CrateRead => {
                let spent = std::mem::take(&mut *self.spent.lock().expect("never poisoned"));
                let invocation = if self.protocol == Protocol::Crate {
                    protocol::release_deleting(&self.name, &self.field, hold_id, spent)
                } else {
                    protocol::read_release_deleting(&self.name, &self.field, hold_id, spent)
                };
                (invocation, hold_id.to_owned())
            }
        };
        let redisson = matches!(self.protocol, Protocol::Redisson | Protocol::RedissonRead);
        let latch = redisson.then_some(request.as_str());
        // One node: the call alone, as `on_every_node` sends it.
        let replies = match self.conns.as_slice() {
            [conn] => vec![self.release_on(conn, &invocation, latch).await],
            conns => {
                let each = conns
                    .iter()
                    .map(|conn| self.release_on(conn, &invocation, latch));
                join_all(each).await
            }
        };
        for reply in replies {
            // A read release replies 0 while other readers remain.
            let reply = reply?;
            let read = matches!(self.protocol, Protocol::RedissonRead | Protocol::CrateRead);
            if !(reply == Some(1) || read && reply == Some(0)) {
                return Err(format!("the limit did not hold {}", self.name).into());
            }
        }
        if !redisson {
            let latch = protocol::unlock_latch(&self.name, &request);
            self.spent.lock().expect("never poisoned").push(latch);
        }
        Ok(())
    }

    /// One node's release; then, given Redisson's `latch` (its request id),
    /// the latch's `DEL`, not awaited. Redisson's client deletes a node's
    /// latch once that node's unlock replied (`RedissonBaseLock::
    /// unlockInnerAsync`: the `DEL` in the unlock future's `thenApply`), and
    /// a MultiLock or a RedLock unlocks each of its locks so: one node's
    /// `DEL` leaves while the other nodes' unlocks are still on their way.
    async fn release_on(
        &self,
        conn: &MultiplexedConnection,
        invocation: &ScriptInvocation<'_>,
        latch: Option<&str>,
    ) -> BenchResult<Option<i64>> {
        let reply = invocation.invoke_async(&mut conn.clone()).await?;
        if let Some(request) = latch {
            delete_latch_unawaited(conn, &self.name, request).await?;
        }
        Ok(reply)
    }

    /// One node: the call alone. Several: to all of them at once.
    async fn on_every_node<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Vec<RedisResult<T>> {
        if let [conn] = self.conns.as_slice() {
            return vec![invocation.invoke_async(&mut conn.clone()).await];
        }
        join_all(self.conns.iter().map(|conn| {
            let mut conn = conn.clone();
            async move { invocation.invoke_async(&mut conn).await }
        }))
        .await
    }
}

// ---------------------------------------------------------------------------
// Running contenders in tasks

/// Times lock+unlock of one contender, one after the other, for `run_for`.
pub async fn time_lock_unlock_for(
    contender: Contender,
    run_for: Duration,
) -> BenchResult<Latencies> {
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let mut samples = Vec::new();
        while started.elapsed() < run_for {
            let op = Instant::now();
            contender.lock_unlock().await?;
            samples.push(nanos(op.elapsed()));
        }
        BenchResult::Ok(Latencies::new(samples))
    });
    task.await?
}

/// How long the tasks of a finished case get to leave (each needs one more
/// grant after the end of the run).
pub const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// Awaits every task of `set`, at most `limit`; the first error wins.
pub async fn join_within(mut set: JoinSet<BenchResult>, limit: Duration) -> BenchResult {
    let all = async {
        while let Some(joined) = set.join_next().await {
            joined??;
        }
        BenchResult::Ok(())
    };
    match tokio::time::timeout(limit, all).await {
        Ok(result) => result,
        Err(_) => Err(format!("tasks still running after {limit:?}").into()),
    }
}

/// What Redisson's client does once an unlock replied: deletes the unlock
/// latch `request` of lock `name`, without waiting for the reply. Netty
/// writes such a command to the channel and returns; here redis-rs's own
/// no-reply send does the same (it awaits only the hand-over to the
/// connection's pipeline, and the reply is read and dropped there). A task
/// spawned per unlock to await the reply would model it less well: it wakes
/// the runtime's other worker on every cycle, which then finds the limit's
/// next reply sooner, a scheduling effect worth ~10 % of the limit's 1-node
/// cycle in long runs here, and none of Redisson's protocol.
pub async fn delete_latch_unawaited(
    conn: &MultiplexedConnection,
    name: &str,
    request: &str,
) -> BenchResult {
    let mut delete = redisson::delete_latch(name, request);
    delete.set_no_response(true);
    delete.exec_async(&mut conn.clone()).await?;
    Ok(())
}

/// K tasks, each on its own lock, lock+unlock in a loop: acquisitions per
/// second after a warm-up tenth, and acquisitions over the whole run (the
/// servers' CPU is read around all of it).
pub async fn many_locks(
    make: impl Fn(usize) -> BenchResult<Contender>,
    tasks: usize,
    run_for: Duration,
) -> BenchResult<(f64, usize)> {
    run_locks(make, tasks, run_for, None).await
}

/// [`many_locks`] at an offered load: `offered` lock+unlocks per second
/// over all tasks, each task starting one every `tasks / offered` seconds
/// on a schedule of its own (the tasks' schedules spread evenly over one
/// period), and at once when it is behind.
pub async fn paced_locks(
    make: impl Fn(usize) -> BenchResult<Contender>,
    tasks: usize,
    run_for: Duration,
    offered: f64,
) -> BenchResult<(f64, usize)> {
    let period = Duration::from_secs_f64(tasks as f64 / offered);
    run_locks(make, tasks, run_for, Some(period)).await
}

/// [`many_locks`], each task starting a lock+unlock every `period` when
/// one is given.
async fn run_locks(
    make: impl Fn(usize) -> BenchResult<Contender>,
    tasks: usize,
    run_for: Duration,
    period: Option<Duration>,
) -> BenchResult<(f64, usize)> {
    let start = Instant::now();
    let counted_from = start + run_for / 10;
    let stop_at = start + run_for;
    let done = Arc::new(AtomicUsize::new(0));
    let all = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for i in 0..tasks {
        let contender = make(i)?;
        let (done, all) = (done.clone(), all.clone());
        let mut schedule =
            period.map(|period| (start + period.mul_f64(i as f64 / tasks as f64), period));
        set.spawn(async move {
            while Instant::now() < stop_at {
                if let Some((next, period)) = schedule.as_mut() {
                    tokio::time::sleep_until((*next).into()).await;
                    *next += *period;
                }
                contender.lock_unlock().await?;
                all.fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                if now >= counted_from && now < stop_at {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
            BenchResult::Ok(())
        });
    }
    join_within(set, DRAIN_LIMIT).await?;
    let rate = done.load(Ordering::Relaxed) as f64 / (stop_at - counted_from).as_secs_f64();
    Ok((rate, all.load(Ordering::Relaxed)))
}
