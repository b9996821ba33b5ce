//! The contenders: this crate, rslock and the limit behind one interface
//! (acquire, release, lock+unlock), the latency samples they produce, and
//! the helpers that run them in tasks.

use std::time::{Duration, Instant};

use futures::future::join_all;
use multilock::testkit::protocol;
use multilock::{Guard, Lock, MultiLock, RedLock};
use redis::aio::MultiplexedConnection;
use redis::{FromRedisValue, RedisResult, ScriptInvocation};
use tokio::task::JoinSet;

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

/// The limit: a bare connection per node sending the crate's acquire and
/// release script calls, as the crate's protocol module builds them, and
/// nothing else.
#[derive(Clone)]
pub struct Limit {
    conns: Vec<MultiplexedConnection>,
    name: String,
    field: String,
}

impl Limit {
    pub fn new(conns: Vec<MultiplexedConnection>, name: String) -> Limit {
        Limit {
            conns,
            field: protocol::field(&uuid::Uuid::new_v4().to_string(), "limit"),
            name,
        }
    }

    /// One acquire, as hold a fresh id (as the crate makes them); the id
    /// names the hold for its release.
    async fn acquire(&self) -> BenchResult<String> {
        let hold_id = protocol::new_hold_id();
        let invocation = protocol::acquire(&self.name, &self.field, LEASE, &hold_id);
        for reply in self.on_every_node::<Vec<i64>>(&invocation).await {
            let reply = reply?;
            if reply.first() != Some(&1) {
                return Err(format!("the limit found {} taken: {reply:?}", self.name).into());
            }
        }
        Ok(hold_id)
    }

    async fn release(&self, hold_id: &str) -> BenchResult {
        let invocation = protocol::release(&self.name, &self.field, hold_id);
        for reply in self.on_every_node::<Option<i64>>(&invocation).await {
            if reply? != Some(1) {
                return Err(format!("the limit did not hold {}", self.name).into());
            }
        }
        Ok(())
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
// Latencies

/// Latency samples, sorted, in nanoseconds.
#[derive(Clone, Default)]
pub struct Latencies(pub Vec<u64>);

impl Latencies {
    pub fn new(mut nanos: Vec<u64>) -> Latencies {
        nanos.sort_unstable();
        Latencies(nanos)
    }

    /// The `q` quantile (nearest rank), in µs.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let rank = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1] as f64 / 1e3
    }

    pub fn p50(&self) -> f64 {
        self.quantile(0.50)
    }

    pub fn p99(&self) -> f64 {
        self.quantile(0.99)
    }

    pub fn max(&self) -> f64 {
        self.quantile(1.0)
    }

    pub fn mean(&self) -> f64 {
        let sum: u64 = self.0.iter().sum();
        sum as f64 / self.0.len().max(1) as f64 / 1e3
    }
}

pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The figures shown for a latency series.
pub type Stat = (&'static str, fn(&Latencies) -> f64);
pub const STATS: [Stat; 3] = [
    ("p50", Latencies::p50),
    ("p99", Latencies::p99),
    ("mean", Latencies::mean),
];

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
