//! A history of holds and the checker that judges it: who held which lock
//! when, what each holder wrote to a fenced resource, and what was left on
//! the nodes at the end.
//!
//! Chaos tests record into a [`History`] (shared by every task: it is
//! `Send + Sync`), then hand it to [`check`] with what [`leftover_keys`]
//! found, and get a [`Violation`] per broken rule:
//!
//! 1. no two holds of one name overlap within validity: a hold is valid
//!    from its grant until `min(valid_until, release)`;
//! 2. fencing tokens increase in grant order, per name;
//! 3. a fenced resource rejected no write made within validity (sent and
//!    answered before the hold's validity ended);
//! 4. no lock key is left on any node at the end.
//!
//! Every instant is taken on one monotonic clock, in one process, and kept
//! as the time since the history began. This file holds what is recorded
//! and the recorder; `rules.rs` holds the checker.

use std::fmt;
use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::PollLimit;
use crate::Guard;

mod rules;

pub use rules::{Violation, check};

/// The number of a hold in its [`History`], in the order they were recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HoldId(pub usize);

impl fmt::Display for HoldId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One hold of a lock, as its holder saw it. Times are since the history
/// began.
///
/// A hold is *valid* from `granted` until [`Hold::valid_end`]: the earlier
/// of `valid_until` (the latest validity the guard promised while held) and
/// `released` (when the holder stopped relying on it). Record a re-entrant
/// hold once, as its outermost acquire: two holds of one holder are
/// compared like any others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// Its number in the history.
    pub id: HoldId,
    /// The lock's name.
    pub name: String,
    /// What kind of lock it is (`"RedLock"`, `"MultiLock"`, ...): for reports.
    pub kind: String,
    /// Who held it (a client and a task, say): for reports.
    pub holder: String,
    /// When the acquire returned the guard.
    pub granted: Duration,
    /// The latest instant the guard said the hold was valid until; `granted`
    /// when it never said so (an empty validity).
    pub valid_until: Duration,
    /// When the holder let go (called unlock, dropped the guard); `None` if it
    /// never did while recorded.
    pub released: Option<Duration>,
    /// The fencing token, for a fenced lock.
    pub token: Option<u64>,
}

impl Hold {
    /// The end of the hold's validity: `min(valid_until, released)`, never
    /// before `granted`.
    pub fn valid_end(&self) -> Duration {
        let end = match self.released {
            Some(released) => released.min(self.valid_until),
            None => self.valid_until,
        };
        end.max(self.granted)
    }

    /// Whether the hold was valid at `at` (since the history began).
    pub fn is_valid_at(&self, at: Duration) -> bool {
        self.granted <= at && at < self.valid_end()
    }
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} by {} ({}", self.id, self.holder, self.kind)?;
        if let Some(token) = self.token {
            write!(f, ", token {token}")?;
        }
        write!(
            f,
            ") valid {}–{}",
            secs(self.granted),
            secs(self.valid_end())
        )?;
        match self.released {
            Some(released) if released > self.valid_until => {
                write!(f, " (released at {}, after its validity)", secs(released))
            }
            Some(_) => Ok(()),
            None => write!(f, " (never released)"),
        }
    }
}

/// One write of a holder to a fenced resource (a
/// [`FencedStore`](super::FencedStore)), with the token it carried. Times
/// are since the history began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedWrite {
    /// The hold the writer believed it had.
    pub hold: HoldId,
    /// The token the write carried.
    pub token: u64,
    /// When the write was sent.
    pub sent: Duration,
    /// When its answer came.
    pub done: Duration,
    /// Whether the resource applied it (`false`: it had seen a higher token).
    pub accepted: bool,
}

/// A lock key found on a node at the end of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// The node's URL.
    pub node: String,
    /// The lock's name (the key).
    pub name: String,
    /// The hash's fields (`<client-uuid>:<owner>`) and hold counts.
    pub fields: Vec<(String, String)>,
    /// The key's remaining TTL; `None` when it has none.
    pub ttl: Option<Duration>,
}

impl fmt::Display for Leftover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|(field, count)| format!("{field}={count}"))
            .collect();
        write!(
            f,
            "lock key {:?} left on {} (held by [{}], ",
            self.name,
            self.node,
            fields.join(", ")
        )?;
        match self.ttl {
            Some(ttl) => write!(f, "TTL {ttl:.1?})"),
            None => write!(f, "no TTL)"),
        }
    }
}

/// A recorder of holds and fenced writes, shared by every task of a run
/// (`Send + Sync`; wrap it in an `Arc`). It takes every instant on the
/// monotonic clock and keeps it as the time since [`History::new`].
///
/// # Examples
///
/// ```no_run
/// use std::time::Instant;
/// use multilock::testkit::{FencedStore, History};
///
/// # async fn demo(red: multilock::RedLock, store: FencedStore) -> multilock::Result<()> {
/// let history = History::new();
/// let guard = red.lock().await?;
/// let hold = history.granted(&guard, "RedLock", "worker 1");
/// if let (Some(token), Some(valid_until)) = (guard.fencing_token(), guard.valid_until()) {
///     if Instant::now() < valid_until {
///         let sent = Instant::now();
///         let accepted = store.write(token, "worker 1").await.unwrap();
///         history.wrote(hold, token, sent, accepted);
///     }
/// }
/// history.released(hold);
/// guard.unlock().await?;
/// assert!(history.check(&[]).is_empty());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct History {
    origin: Instant,
    records: Mutex<Records>,
}

#[derive(Debug, Default)]
struct Records {
    holds: Vec<Hold>,
    writes: Vec<FencedWrite>,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    /// An empty history that begins now.
    pub fn new() -> History {
        History {
            origin: Instant::now(),
            records: Mutex::new(Records::default()),
        }
    }

    /// When the history began.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// `at` as the time since the history began (zero for an instant before).
    pub fn since_origin(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.origin)
    }

    fn records(&self) -> std::sync::MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a hold granted now: the guard's name, validity
    /// ([`Guard::valid_until`]) and fencing token. Call it as soon as the
    /// acquire returns.
    pub fn granted(&self, guard: &Guard, kind: &str, holder: &str) -> HoldId {
        self.claimed(
            guard.name(),
            kind,
            holder,
            guard.valid_until(),
            guard.fencing_token(),
        )
    }

    /// Records a hold that its holder believes it has from now until
    /// `valid_until` (`None`: an empty validity), whatever the lock says:
    /// for holders that do not take it from a [`Guard`].
    pub fn claimed(
        &self,
        name: &str,
        kind: &str,
        holder: &str,
        valid_until: Option<Instant>,
        token: Option<u64>,
    ) -> HoldId {
        let granted = self.since_origin(Instant::now());
        let mut records = self.records();
        let id = HoldId(records.holds.len());
        records.holds.push(Hold {
            id,
            name: name.to_owned(),
            kind: kind.to_owned(),
            holder: holder.to_owned(),
            granted,
            valid_until: valid_until.map_or(granted, |v| self.since_origin(v).max(granted)),
            released: None,
            token,
        });
        id
    }

    /// Records a later reading of the hold's validity (a renewal moved it):
    /// the hold keeps the latest instant any reading promised.
    pub fn observed(&self, hold: HoldId, valid_until: Option<Instant>) {
        let Some(valid_until) = valid_until else {
            return;
        };
        let valid_until = self.since_origin(valid_until);
        if let Some(hold) = self.records().holds.get_mut(hold.0) {
            hold.valid_until = hold.valid_until.max(valid_until);
        }
    }

    /// Records that the holder lets go now: call it just before the unlock
    /// (or the drop of the guard), once it no longer acts as the holder.
    pub fn released(&self, hold: HoldId) {
        let now = self.since_origin(Instant::now());
        if let Some(hold) = self.records().holds.get_mut(hold.0) {
            hold.released.get_or_insert(now);
        }
    }

    /// Records a write to a fenced resource, sent at `sent` and answered now
    /// (`accepted`: applied).
    pub fn wrote(&self, hold: HoldId, token: u64, sent: Instant, accepted: bool) {
        let write = FencedWrite {
            hold,
            token,
            sent: self.since_origin(sent),
            done: self.since_origin(Instant::now()),
            accepted,
        };
        self.records().writes.push(write);
    }

    /// The holds recorded so far.
    pub fn holds(&self) -> Vec<Hold> {
        self.records().holds.clone()
    }

    /// The fenced writes recorded so far.
    pub fn writes(&self) -> Vec<FencedWrite> {
        self.records().writes.clone()
    }

    /// [`check`]s the history recorded so far, with the keys `leftovers`
    /// that remained at the end.
    pub fn check(&self, leftovers: &[Leftover]) -> Vec<Violation> {
        let records = self.records();
        check(&records.holds, &records.writes, leftovers)
    }
}

/// The lock keys among `names` still present on any of the nodes at
/// `urls`: polls every 20 ms until none remains or `settle` has passed
/// (background releases and rollbacks may still be under way), and returns
/// what remains then; empty when every key is gone.
///
/// Give it less time than the shortest lease used, or key expiry does the
/// releases' work and hides what they left.
///
/// # Errors
///
/// When a node cannot be reached or answers with an error.
///
/// # Cancel safety
///
/// Cancel safe: read only.
pub async fn leftover_keys(
    urls: &[String],
    names: &[String],
    settle: Duration,
) -> io::Result<Vec<Leftover>> {
    let mut connections = Vec::with_capacity(urls.len());
    for url in urls {
        let connection = redis::Client::open(url.as_str())
            .map_err(io::Error::other)?
            .get_multiplexed_async_connection()
            .await
            .map_err(io::Error::other)?;
        connections.push((url, connection));
    }
    let poll = PollLimit::new(settle);
    loop {
        let mut found = Vec::new();
        for (url, connection) in &mut connections {
            for name in names {
                let (fields, ttl_ms): (Vec<(String, String)>, i64) = redis::pipe()
                    .hgetall(name)
                    .pttl(name)
                    .query_async(connection)
                    .await
                    .map_err(io::Error::other)?;
                if ttl_ms == -2 {
                    continue;
                }
                found.push(Leftover {
                    node: (*url).clone(),
                    name: name.clone(),
                    fields,
                    ttl: u64::try_from(ttl_ms).ok().map(Duration::from_millis),
                });
            }
        }
        if found.is_empty() || poll.is_spent() {
            return Ok(found);
        }
        poll.tick(String::new).await?;
    }
}

/// `d` as seconds since the history began, to the millisecond.
fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{RedisProcess, TestServer, protocol};

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// A lock key written by the crate's own acquire is found on its node
    /// and reported; once released, nothing is.
    #[tokio::test]
    async fn leftover_keys_finds_a_planted_lock_key() {
        let server = RedisProcess::start().await.unwrap();
        let url = server.url();
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let field = protocol::field("client", "owner");
        let hold_id = protocol::new_hold_id();
        let _: redis::Value = protocol::acquire("planted", &field, ms(30_000), &hold_id)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        let urls = [url.clone()];
        let names = ["planted".to_owned(), "clean".to_owned()];
        let found = leftover_keys(&urls, &names, ms(100)).await.unwrap();
        let [leftover] = &found[..] else {
            panic!("expected one leftover, found {found:?}");
        };
        assert_eq!(
            (leftover.node.as_str(), leftover.name.as_str()),
            (url.as_str(), "planted")
        );
        assert_eq!(leftover.fields, vec![(field.clone(), "1".to_owned())]);
        assert!(leftover.ttl.is_some_and(|t| t > ms(20_000)), "{leftover:?}");
        assert!(matches!(
            &check(&[], &[], &found)[..],
            [Violation::Leftover(l)] if l == leftover
        ));

        let _: redis::Value = protocol::release("planted", &field, &hold_id)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            leftover_keys(&urls, &names, ms(100)).await.unwrap(),
            Vec::new()
        );
    }

    /// The recorder keeps the latest validity promised and the first
    /// release, on the clock it began with, and its history checks clean.
    #[tokio::test]
    async fn the_recorder_keeps_what_the_guard_said() {
        let server = RedisProcess::start().await.unwrap();
        let client = crate::Client::new();
        let node = crate::Node::new(&server.url()).unwrap();
        let lock = client.lock(&node, "recorded").unwrap().with_fencing();
        let history = History::new();

        let guard = lock.lock_with_lease(ms(10_000)).await.unwrap();
        let id = history.granted(&guard, "Lock", "me");
        let token = guard.fencing_token().unwrap();
        let promised = guard.valid_until().unwrap();
        history.observed(id, Some(promised - ms(5_000)));
        history.wrote(id, token, Instant::now(), true);
        history.released(id);
        guard.unlock().await.unwrap();
        history.released(id);

        let [hold] = &history.holds()[..] else {
            panic!("one hold recorded");
        };
        assert_eq!((hold.name.as_str(), hold.token), ("recorded", Some(token)));
        assert_eq!(hold.valid_until, history.since_origin(promised));
        assert!(hold.released.is_some_and(|r| r < hold.valid_until));
        assert_eq!(history.writes().len(), 1);
        assert_eq!(history.check(&[]), Vec::new());

        // A holder that ignores the lock and writes with a token it kept,
        // after a real holder wrote a higher one, is caught twice.
        let rogue_until = Some(Instant::now() + ms(1_000));
        let stale = history.claimed("recorded", "Lock", "rogue", rogue_until, None);
        let guard = lock.lock_with_lease(ms(10_000)).await.unwrap();
        let later = history.granted(&guard, "Lock", "me");
        history.wrote(later, guard.fencing_token().unwrap(), Instant::now(), true);
        history.wrote(stale, token, Instant::now(), false);
        history.released(later);
        guard.unlock().await.unwrap();
        let rules: Vec<&str> = history.check(&[]).iter().map(Violation::rule).collect();
        assert_eq!(rules, ["overlap", "rejected write"]);
    }
}
