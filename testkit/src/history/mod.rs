//! A history of holds and the checker that judges it: who held which lock
//! when, what each holder wrote to a fenced resource, and what was left on
//! the nodes at the end.
//!
//! Chaos tests record into a [`History`] (shared by every task: it is
//! `Send + Sync`), then hand it to [`check`] with what [`leftover_keys`]
//! found, and get a [`Violation`] per broken rule:
//!
//! 1. no two holds of one name overlap within validity, unless both are
//!    shared (read holds of a read-write lock): a hold is valid from its
//!    grant until `min(valid_until, release)`;
//! 2. fencing tokens increase in grant order, per name;
//! 3. a fenced resource rejected no write made within validity (sent and
//!    answered before the hold's validity ended);
//! 4. no lock key is left on any node at the end (nor a fair lock's queue
//!    or deadlines, nor a read hold's timeout key);
//! 5. a fair lock grants the head of its queue (or nobody is queued), and
//!    a queue entry is gone within [`QUEUE_GRACE`] of the end of the wait
//!    that made it: [`QueueMonitor`] replays what the node ran, and
//!    [`History::waited`] records the waits.
//!
//! Besides the rules, [`History::shared_overlaps`] counts the read holds
//! that did overlap: a run that never saw two at once proves no sharing.
//!
//! Every instant is taken on one monotonic clock, in one process, and kept
//! as the time since the history began. This file holds what is recorded
//! and the recorder; `rules.rs` holds the checker, `queue.rs` the replay
//! of fair queues and `leftovers.rs` the end check of the nodes.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use multilock::Guard;

mod leftovers;
mod queue;
mod rules;

pub use leftovers::{Leftover, connect_all, leftover_keys, scan_keys};
pub use queue::{Departure, Outlived, Overtaking, QUEUE_GRACE, QueueEntry, QueueMonitor, Wait};
pub use rules::{Violation, check, shared_overlaps};

/// The number of a hold in its [`History`], in the order they were recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HoldId(pub usize);

impl fmt::Display for HoldId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Whether a hold excludes every other hold of its name or shares it with
/// other shared holds (the read holds of a read-write lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// A lock, a fair lock, a write lock: nobody else at once.
    #[default]
    Exclusive,
    /// A read lock: other readers at once, no writer.
    Shared,
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
    /// Exclusive, or shared with other shared holds.
    pub access: Access,
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

    /// When the holder let its name go, as the checkers of availability
    /// count it: its release, or the end of its validity when never
    /// released; never before `granted`.
    pub fn let_go(&self) -> Duration {
        self.released.unwrap_or(self.valid_until).max(self.granted)
    }

    /// Whether the hold was valid at `at` (since the history began).
    pub fn is_valid_at(&self, at: Duration) -> bool {
        self.granted <= at && at < self.valid_end()
    }
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} by {} ({}", self.id, self.holder, self.kind)?;
        if self.access == Access::Shared {
            write!(f, ", shared")?;
        }
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

/// A recorder of holds and fenced writes, shared by every task of a run
/// (`Send + Sync`; wrap it in an `Arc`). It takes every instant on the
/// monotonic clock and keeps it as the time since [`History::new`].
///
/// # Examples
///
/// ```no_run
/// use std::time::Instant;
/// use multilock_testkit::{FencedStore, History};
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
    /// The wall clock at `origin`: `MONITOR` lines carry the server's.
    origin_wall: SystemTime,
    records: Mutex<Records>,
    queues: Mutex<queue::QueueLog>,
}

#[derive(Debug, Default)]
struct Records {
    holds: Vec<Hold>,
    writes: Vec<FencedWrite>,
    waits: Vec<Wait>,
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
            origin_wall: SystemTime::now(),
            records: Mutex::new(Records::default()),
            queues: Mutex::new(queue::QueueLog::default()),
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

    /// `at`, a wall-clock instant of this machine, as the time since the
    /// history began.
    fn since_wall(&self, at: SystemTime) -> Duration {
        at.duration_since(self.origin_wall).unwrap_or_default()
    }

    fn records(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn queue_log(&self) -> MutexGuard<'_, queue::QueueLog> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a hold granted now: the guard's name, validity
    /// ([`Guard::valid_until`]) and fencing token. Call it as soon as the
    /// acquire returns.
    pub fn granted(&self, guard: &Guard, kind: &str, holder: &str) -> HoldId {
        self.granted_as(guard, Access::Exclusive, kind, holder)
    }

    /// [`History::granted`], for a hold of the given [`Access`]: `Shared`
    /// for a read lock's guard.
    pub fn granted_as(&self, guard: &Guard, access: Access, kind: &str, holder: &str) -> HoldId {
        let id = self.claimed(
            guard.name(),
            kind,
            holder,
            guard.valid_until(),
            guard.fencing_token(),
        );
        if let Some(hold) = self.records().holds.get_mut(id.0) {
            hold.access = access;
        }
        id
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
            access: Access::Exclusive,
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

    /// Records a wait for a fair lock that began at `started` and ended now
    /// (granted or not, failed or cut off): its waiter's queue entry must
    /// be gone within [`QUEUE_GRACE`]. `field` is the waiter's hash field,
    /// `<client-uuid>:<owner>`.
    pub fn waited(&self, name: &str, field: &str, holder: &str, started: Instant) {
        let wait = Wait {
            name: name.to_owned(),
            field: field.to_owned(),
            holder: holder.to_owned(),
            started: self.since_origin(started),
            ended: self.since_origin(Instant::now()),
        };
        self.records().waits.push(wait);
    }

    /// The queue entries a [`QueueMonitor`] replayed so far, and how many
    /// commands on the queues and lock hashes it saw.
    pub fn queue_entries(&self) -> (Vec<QueueEntry>, u64) {
        let log = self.queue_log();
        (log.entries.clone(), log.commands)
    }

    /// How many pairs of shared holds overlapped, per name: the proof that
    /// reads were shared.
    pub fn shared_overlaps(&self) -> BTreeMap<String, usize> {
        shared_overlaps(&self.records().holds)
    }

    /// Since when `name` has been free (since the history began): the
    /// latest end of its recorded holds (the release, or the end of the
    /// validity when never released), or `None` while one of them still
    /// holds it. [`Duration::ZERO`] for a name never held. Reads the
    /// records in place, for a watcher that asks often.
    pub fn free_since(&self, name: &str) -> Option<Duration> {
        let now = self.since_origin(Instant::now());
        let mut free_since = Duration::ZERO;
        for hold in self.records().holds.iter().filter(|h| h.name == name) {
            let end = hold.let_go();
            if end > now {
                return None;
            }
            free_since = free_since.max(end);
        }
        Some(free_since)
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
        let mut violations = check(&records.holds, &records.writes, leftovers);
        let log = self.queue_log();
        let queued = log
            .overtakings
            .iter()
            .cloned()
            .map(Violation::QueueOrder)
            .chain(
                queue::outlived(&log.entries, &records.waits)
                    .into_iter()
                    .map(Violation::QueueEntryOutlived),
            );
        // Before the leftovers, which come last.
        let at = violations
            .iter()
            .position(|v| matches!(v, Violation::Leftover(_)))
            .unwrap_or(violations.len());
        violations.splice(at..at, queued);
        violations
    }
}

/// `d` as seconds since the history began, to the millisecond.
fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RedisProcess, TestServer, protocol};

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
            (
                leftover.node.as_str(),
                leftover.name.as_str(),
                leftover.key.as_str()
            ),
            (url.as_str(), "planted", "planted")
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

    /// A name is free from its last hold's end: its release, or the end
    /// of its validity when never released; never while one still holds.
    #[test]
    fn a_name_is_free_from_its_last_holds_end() {
        let history = History::new();
        assert_eq!(history.free_since("a"), Some(Duration::ZERO), "never held");
        let far = Instant::now() + ms(60_000);
        let released = history.claimed("a", "Lock", "h1", Some(far), None);
        let unreleased = history.claimed("a", "Lock", "h2", Some(far), None);
        history.claimed("b", "Lock", "h3", None, None);
        history.released(released);
        assert_eq!(history.free_since("a"), None, "h2 still holds");
        // An empty validity ends at the grant.
        assert!(history.free_since("b").is_some());
        let mut records = history.records();
        records.holds[unreleased.0].valid_until = records.holds[released.0].granted;
        let release = records.holds[released.0].released.unwrap();
        drop(records);
        assert_eq!(history.free_since("a"), Some(release));
    }

    /// The recorder keeps the latest validity promised and the first
    /// release, on the clock it began with, and its history checks clean.
    #[tokio::test]
    async fn the_recorder_keeps_what_the_guard_said() {
        let server = RedisProcess::start().await.unwrap();
        let client = multilock::Client::new();
        let node = multilock::Node::new(&server.url()).unwrap();
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
