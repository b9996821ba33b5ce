//! `--locks fresh`: every acquire is on a name nobody used before, fenced,
//! on the RedLock nodes, one of which was killed before the workers started
//! and stays dead. A new name has no fencing counter anywhere, so no node
//! can prove its first token: the grant must come from the wall-clock floor
//! once a quorum answered, not wait for the dead node. Each name is granted
//! twice (the checker's token order rule then proves the second token above
//! the first) before its worker moves on. The run fails when a name's first
//! grant comes more than [`FRESH_WAIT_LIMIT`] after its first attempt
//! (retries of the same name included), or never came and the stop came
//! later than that.
//!
//! The end check cannot list every lock name (there are thousands), so it
//! scans the live RedLock nodes for any key but the fencing counters (and
//! their vouches) and the release latches (which expire): the lock keys of every fresh name
//! used, and of any other.

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use multilock_testkit::{
    History, Leftover, PollLimit, RedisProcess, TestServer, connect_all, scan_keys,
};
use rand::RngExt;
use rand::rngs::StdRng;
use redis::aio::MultiplexedConnection;
use tokio::sync::watch;

use crate::workers::{Outcome, Worker};

/// The longest a fresh name may wait for its first grant.
pub const FRESH_WAIT_LIMIT: Duration = Duration::from_secs(3);

/// Grants per name before its worker moves on.
const GRANTS_PER_NAME: u32 = 2;

/// One fresh name: when it was first tried, first granted, and how often.
#[derive(Debug, Clone)]
pub struct FreshName {
    pub name: String,
    pub first_attempt: Instant,
    pub first_grant: Option<Instant>,
    pub grants: u32,
}

/// Every fresh name tried so far, shared by the workers.
#[derive(Debug, Default)]
pub struct FreshLog(Mutex<Vec<FreshName>>);

impl FreshLog {
    /// A name tried for the first time now: its number in the log.
    fn begin(&self, name: &str) -> usize {
        let mut names = self.0.lock().unwrap();
        names.push(FreshName {
            name: name.to_owned(),
            first_attempt: Instant::now(),
            first_grant: None,
            grants: 0,
        });
        names.len() - 1
    }

    fn granted(&self, entry: usize) {
        let mut names = self.0.lock().unwrap();
        let name = &mut names[entry];
        name.first_grant.get_or_insert_with(Instant::now);
        name.grants += 1;
    }

    pub fn names(&self) -> Vec<FreshName> {
        self.0.lock().unwrap().clone()
    }
}

/// A worker of fresh names: `hc:fresh:<label>:<n>`, each taken until it was
/// granted twice, until `stop`.
pub async fn run(mut worker: Worker, mut stop: watch::Receiver<bool>) {
    for n in 0u64.. {
        if *stop.borrow() {
            return;
        }
        let name = format!("hc:fresh:{}:{n}", worker.label);
        // The same construction as every fixed name's, which succeeded.
        let target = worker
            .fenced_red_target(name)
            .expect("a fenced RedLock of a valid name");
        let entry = worker.shared.fresh.begin(&target.name);
        let mut grants = 0;
        while grants < GRANTS_PER_NAME && !*stop.borrow() {
            let (lock, access) = target.locks[0].clone();
            let outcome = worker.acquire(lock, &mut stop).await;
            if let Outcome::Granted(_) = outcome {
                worker.shared.fresh.granted(entry);
                grants += 1;
            }
            worker.conclude(outcome, access, target.store.clone()).await;
        }
    }
}

/// Kills one of `servers` at random, before the workers start, and takes
/// it out of them: it stays dead to the end (the caller keeps it, so that
/// its port stays reserved).
pub async fn kill_one(
    servers: &mut Vec<RedisProcess>,
    rng: &mut StdRng,
) -> io::Result<RedisProcess> {
    let mut dead = servers.remove(rng.random_range(0..servers.len()));
    dead.kill().await?;
    Ok(dead)
}

/// What the fresh names showed, for the verdict and the report.
#[derive(Debug, Default)]
pub struct FreshFigures {
    pub tried: usize,
    pub granted: usize,
    pub granted_twice: usize,
    /// The longest wait for a first grant: (wait, name, first attempt since
    /// the history began).
    pub longest: Option<(Duration, String, Duration)>,
    /// Names over the limit: (name, wait, first attempt since the history
    /// began, granted); a name never granted waited until the stop.
    pub slow: Vec<(String, Duration, Duration, bool)>,
    /// Names still waiting at the stop, for less than the limit.
    pub pending: usize,
}

impl FreshFigures {
    pub fn of(log: &FreshLog, history: &History, stop: Instant) -> FreshFigures {
        let names = log.names();
        let mut figures = FreshFigures {
            tried: names.len(),
            ..FreshFigures::default()
        };
        for name in names {
            let began = history.since_origin(name.first_attempt);
            let wait = name.first_grant.unwrap_or(stop) - name.first_attempt;
            if name.first_grant.is_some() {
                figures.granted += 1;
                figures.granted_twice += usize::from(name.grants >= GRANTS_PER_NAME);
                if figures.longest.as_ref().is_none_or(|(w, ..)| wait > *w) {
                    figures.longest = Some((wait, name.name.clone(), began));
                }
            } else if wait <= FRESH_WAIT_LIMIT {
                figures.pending += 1;
            }
            if wait > FRESH_WAIT_LIMIT {
                let granted = name.first_grant.is_some();
                figures.slow.push((name.name, wait, began, granted));
            }
        }
        figures
    }

    /// Whether every fresh name was granted in time.
    pub fn ok(&self) -> bool {
        self.slow.is_empty() && self.granted > 0
    }

    pub fn print(&self) {
        let longest = match &self.longest {
            Some((wait, name, began)) => format!(
                "{:.3} s ({name}, first tried at {:.1} s)",
                wait.as_secs_f64(),
                began.as_secs_f64()
            ),
            None => "none".to_owned(),
        };
        println!(
            "  fresh names: {} tried, {} granted ({} twice), {} still waiting at the stop (within the limit); \
             longest wait for a first grant {longest}",
            self.tried, self.granted, self.granted_twice, self.pending
        );
        if self.granted == 0 {
            println!("  fresh names: NONE granted");
        }
        let never = self.slow.iter().filter(|s| !s.3).count();
        if !self.slow.is_empty() {
            println!(
                "  fresh names whose first grant took more than {FRESH_WAIT_LIMIT:?}: {} ({never} never granted)",
                self.slow.len()
            );
        }
        for (name, wait, began, granted) in self.slow.iter().take(10) {
            println!(
                "    - {name}: first tried at {:.1} s, {} after {:.2} s",
                began.as_secs_f64(),
                if *granted {
                    "granted"
                } else {
                    "still not granted at the stop"
                },
                wait.as_secs_f64()
            );
        }
        if self.slow.len() > 10 {
            println!("    ... and {} more", self.slow.len() - 10);
        }
    }
}

/// What the end scan saw on the live RedLock nodes besides the lock keys.
#[derive(Debug, Default, Clone, Copy)]
pub struct Scanned {
    /// Fencing counters and their vouches.
    pub counters: usize,
    pub latches: usize,
}

/// Every key on the live RedLock nodes `urls` but the fencing counters
/// (and their vouches) and the release latches: polls every 20 ms until
/// none remains or `settle` has passed (background releases and rollbacks
/// may still be under way), and returns what remains then, with what the
/// last scan skipped.
pub async fn leftovers(urls: &[String], settle: Duration) -> io::Result<(Vec<Leftover>, Scanned)> {
    let mut connections = connect_all(urls).await?;
    let poll = PollLimit::new(settle);
    loop {
        let mut found = Vec::new();
        let mut scanned = Scanned::default();
        for (url, connection) in &mut connections {
            let keys = scan_keys(connection, None)
                .await
                .map_err(io::Error::other)?;
            for key in keys {
                if key.starts_with("redisson_lock_token:")
                    || key.starts_with("multilock_token_vouch:")
                {
                    scanned.counters += 1;
                } else if key.starts_with("redisson_unlock_latch:") {
                    scanned.latches += 1;
                } else if let Some(leftover) =
                    read(connection, url, key).await.map_err(io::Error::other)?
                {
                    found.push(leftover);
                }
            }
        }
        if found.is_empty() || poll.is_spent() {
            return Ok((found, scanned));
        }
        poll.tick(String::new).await?;
    }
}

/// A key found by the scan, as a leftover: a hash's fields (a lock key),
/// else its type; `None` if it went meanwhile.
async fn read(
    connection: &mut MultiplexedConnection,
    url: &str,
    key: String,
) -> redis::RedisResult<Option<Leftover>> {
    let (kind, ttl_ms): (String, i64) = redis::pipe()
        .cmd("TYPE")
        .arg(&key)
        .pttl(&key)
        .query_async(connection)
        .await?;
    let fields = match kind.as_str() {
        "none" => return Ok(None),
        "hash" => {
            redis::cmd("HGETALL")
                .arg(&key)
                .query_async(connection)
                .await?
        }
        other => vec![(format!("a {other}"), String::new())],
    };
    Ok(Some(Leftover {
        node: url.to_owned(),
        name: key.clone(),
        key,
        fields,
        ttl: u64::try_from(ttl_ms).ok().map(Duration::from_millis),
    }))
}
