//! Fair queues as the server saw them. A `MONITOR` connection on a fair
//! lock's node streams every command, the ones that scripts run included,
//! in the order the server ran them: replayed, they give each queue entry's
//! life (when it was pushed, and when it was granted, given up or dropped as
//! stale) and each grant's place in the queue, free of any client's view.
//!
//! Two rules come from it (see [`check`](super::check)):
//! - a fresh grant goes to the head of the queue, or the queue is empty
//!   (once stale heads are dropped): a waiter that stays queued is never
//!   overtaken by one queued after it;
//! - a queue entry is gone within [`QUEUE_GRACE`] of the end of the wait
//!   that made it (granted, timed out, failed or cancelled).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{FutureExt, StreamExt};

use super::History;
#[cfg(test)]
use super::Violation;
use crate::redisson_fair;

/// How long after its wait ended a queue entry may still be there: a
/// give-up sent while the node is paused (the history checker pauses it for
/// up to 2.5 s) waits for it, and one that fails is retried with backoff.
pub const QUEUE_GRACE: Duration = Duration::from_secs(5);

/// How a queue entry left the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// Its waiter was granted the lock.
    Granted,
    /// Its waiter gave up (the give-up script took it out).
    Left,
    /// A script dropped it as a stale head (its deadline had passed).
    Stale,
}

/// One entry of a fair lock's queue, from its push to its departure, as the
/// node ran them. Times are since the history began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueEntry {
    /// The lock's name.
    pub name: String,
    /// The waiter's hash field, `<client-uuid>:<owner>`.
    pub field: String,
    /// When the node pushed it.
    pub queued: Duration,
    /// When it left, and how; `None` while it is (or was, at the end) queued.
    pub departed: Option<(Duration, Departure)>,
}

/// One wait for a fair lock: an acquire call of one waiter, from its start
/// to its end (granted, not granted, failed or cancelled). Times are since
/// the history began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    /// The lock's name.
    pub name: String,
    /// The waiter's hash field, `<client-uuid>:<owner>`.
    pub field: String,
    /// Who waited: for reports.
    pub holder: String,
    /// When the acquire began.
    pub started: Duration,
    /// When it ended.
    pub ended: Duration,
}

/// A fresh grant made while someone else headed the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overtaking {
    /// The lock's name.
    pub name: String,
    /// The field granted.
    pub granted: String,
    /// The head of the queue then.
    pub head: String,
    /// How many were queued then.
    pub queued: usize,
    /// When, since the history began.
    pub at: Duration,
}

impl fmt::Display for Overtaking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} was granted {:?} at {:.3} s while {} headed its queue of {}",
            self.granted,
            self.name,
            self.at.as_secs_f64(),
            self.head,
            self.queued
        )
    }
}

/// What the replay of the node's commands found.
#[derive(Debug, Default)]
pub(super) struct QueueLog {
    pub(super) entries: Vec<QueueEntry>,
    pub(super) overtakings: Vec<Overtaking>,
    /// Commands replayed (for reports: a log that saw nothing proves nothing).
    pub(super) commands: u64,
}

/// The keys of one fair lock and its replayed state.
struct Replayed {
    name: String,
    queue_key: String,
    /// Indexes into `QueueLog::entries`, head first.
    queue: VecDeque<usize>,
    /// Hold counts per field, from the `HINCRBY`s seen (an expiry is not
    /// seen: a field can look held after its key expired, which only makes
    /// a grant look like a re-entry, never a grant look unfair).
    holds: BTreeMap<String, i64>,
    /// The field the script being replayed took out of the queue to grant.
    granting: Option<String>,
}

/// Follows a node's `MONITOR` stream in the background and replays the
/// fair queues of `names` into a [`History`]. Dropping it stops the
/// follower; [`QueueMonitor::stop`] lets it replay what it has read first.
#[derive(Debug)]
pub struct QueueMonitor {
    task: tokio::task::JoinHandle<()>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl QueueMonitor {
    /// Connects to the node at `url` and starts following it: every fair
    /// lock among `names` is replayed from now on (start it before any
    /// waiter queues).
    ///
    /// # Errors
    ///
    /// When the node cannot be reached or refuses `MONITOR`.
    pub async fn start(history: Arc<History>, url: &str, names: &[&str]) -> io::Result<Self> {
        let client = redis::Client::open(url).map_err(io::Error::other)?;
        let monitor = client.get_async_monitor().await.map_err(io::Error::other)?;
        let mut replay = Replay::new(history, names);
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut lines = monitor.into_on_message::<String>();
            loop {
                tokio::select! {
                    line = lines.next() => match line {
                        Some(line) => replay.line(&line),
                        None => break,
                    },
                    _ = &mut stopped => {
                        // Whatever the server sent before the stop.
                        while let Some(Some(line)) = lines.next().now_or_never() {
                            replay.line(&line);
                        }
                        break;
                    }
                }
            }
            replay.flush();
        });
        Ok(QueueMonitor {
            task,
            stop: Some(stop),
        })
    }

    /// Stops following, once what has arrived is replayed.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for QueueMonitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The replay: one script (a client command and the commands it ran) at a
/// time, so that a grant's `LREM` is known for what it is.
struct Replay {
    history: Arc<History>,
    locks: Vec<Replayed>,
    /// The commands of the script being read: (at, arguments).
    script: Vec<(Duration, Vec<String>)>,
}

impl Replay {
    fn new(history: Arc<History>, names: &[&str]) -> Replay {
        Replay {
            history,
            locks: names
                .iter()
                .map(|name| Replayed {
                    name: (*name).to_owned(),
                    queue_key: redisson_fair::queue(name),
                    queue: VecDeque::new(),
                    holds: BTreeMap::new(),
                    granting: None,
                })
                .collect(),
            script: Vec::new(),
        }
    }

    fn line(&mut self, line: &str) {
        let Some((at, from_script, args)) = parse_monitor_line(line) else {
            return;
        };
        if !from_script {
            self.flush();
        }
        let at = self.history.since_wall(at);
        self.script.push((at, args));
    }

    /// Replays the script read so far.
    fn flush(&mut self) {
        let script = std::mem::take(&mut self.script);
        if script.is_empty() {
            return;
        }
        let mut log = self.history.queue_log();
        for lock in &mut self.locks {
            lock.granting = None;
        }
        for (i, (at, args)) in script.iter().enumerate() {
            let [command, key, rest @ ..] = &args[..] else {
                continue;
            };
            let command = command.to_ascii_lowercase();
            for lock in &mut self.locks {
                if *key == lock.queue_key {
                    log.commands += 1;
                    lock.queue_command(&command, rest, *at, &script[i + 1..], &mut log);
                } else if *key == lock.name {
                    log.commands += 1;
                    lock.hash_command(&command, rest, *at, &mut log);
                }
            }
        }
    }
}

impl Replayed {
    fn queue_command(
        &mut self,
        command: &str,
        rest: &[String],
        at: Duration,
        later: &[(Duration, Vec<String>)],
        log: &mut QueueLog,
    ) {
        match (command, rest) {
            ("rpush", fields) => {
                for field in fields {
                    self.queue.push_back(log.entries.len());
                    log.entries.push(QueueEntry {
                        name: self.name.clone(),
                        field: field.clone(),
                        queued: at,
                        departed: None,
                    });
                }
            }
            ("lpop", _) => {
                let Some(entry) = self.queue.pop_front() else {
                    return;
                };
                // Redisson's own grant pops its caller; ours and Redisson's
                // drops of stale heads pop them.
                let field = log.entries[entry].field.clone();
                let how = if self.grants(&field, later) {
                    self.granting = Some(field);
                    Departure::Granted
                } else {
                    Departure::Stale
                };
                log.entries[entry].departed = Some((at, how));
            }
            ("lrem", [_, field]) => {
                let Some(position) = self
                    .queue
                    .iter()
                    .position(|e| log.entries[*e].field == *field)
                else {
                    return;
                };
                let granted = self.grants(field, later);
                if granted && position > 0 {
                    log.overtakings.push(Overtaking {
                        name: self.name.clone(),
                        granted: field.clone(),
                        head: log.entries[self.queue[0]].field.clone(),
                        queued: self.queue.len(),
                        at,
                    });
                }
                if granted {
                    self.granting = Some(field.clone());
                }
                if let Some(entry) = self.queue.remove(position) {
                    let how = if granted {
                        Departure::Granted
                    } else {
                        Departure::Left
                    };
                    log.entries[entry].departed = Some((at, how));
                }
            }
            _ => {}
        }
    }

    /// Whether the rest of the script counts a first hold of `field`: the
    /// grant path takes the caller out of the queue, then counts its hold.
    fn grants(&self, field: &str, later: &[(Duration, Vec<String>)]) -> bool {
        later.iter().any(|(_, args)| {
            matches!(&args[..], [c, k, f, n]
                if c.eq_ignore_ascii_case("hincrby") && *k == self.name && f == field && n == "1")
        })
    }

    fn hash_command(&mut self, command: &str, rest: &[String], at: Duration, log: &mut QueueLog) {
        match (command, rest) {
            ("hincrby", [field, by]) => {
                let by: i64 = by.parse().unwrap_or(0);
                let held = self.holds.entry(field.clone()).or_insert(0);
                let fresh = by == 1 && *held <= 0 && self.granting.as_ref() != Some(field);
                *held += by;
                // A grant of someone not queued while others are (a queued
                // caller's grant was checked at its `LREM`).
                if fresh && let Some(head) = self.queue.front() {
                    log.overtakings.push(Overtaking {
                        name: self.name.clone(),
                        granted: field.clone(),
                        head: log.entries[*head].field.clone(),
                        queued: self.queue.len(),
                        at,
                    });
                }
            }
            ("hdel", fields) => {
                for field in fields {
                    self.holds.remove(field);
                }
            }
            ("del", _) => self.holds.clear(),
            _ => {}
        }
    }
}

/// A `MONITOR` line: `1795694766.659797 [0 lua] "rpush" "key" "value"`,
/// as (wall-clock time, run by a script, arguments).
fn parse_monitor_line(line: &str) -> Option<(SystemTime, bool, Vec<String>)> {
    let (stamp, rest) = line.split_once(' ')?;
    let secs: f64 = stamp.parse().ok()?;
    let at = UNIX_EPOCH + Duration::from_secs_f64(secs);
    let (source, quoted) = rest.split_once("] ")?;
    let from_script = source.ends_with(" lua");
    Some((at, from_script, unquote_all(quoted)?))
}

/// The arguments of a `MONITOR` line: quoted, with the server's escapes
/// (`\"`, `\\`, `\n`, `\r`, `\t`, `\a`, `\b`, `\xHH`).
fn unquote_all(mut text: &str) -> Option<Vec<String>> {
    let mut args = Vec::new();
    loop {
        text = text.trim_start();
        if text.is_empty() {
            return Some(args);
        }
        let mut chars = text.strip_prefix('"')?.char_indices();
        let mut bytes = Vec::new();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i + 2,
                '\\' => {
                    let (_, escaped) = chars.next()?;
                    match escaped {
                        'n' => bytes.push(b'\n'),
                        'r' => bytes.push(b'\r'),
                        't' => bytes.push(b'\t'),
                        'a' => bytes.push(7),
                        'b' => bytes.push(8),
                        'x' => {
                            let high = chars.next()?.1.to_digit(16)?;
                            let low = chars.next()?.1.to_digit(16)?;
                            bytes.push((high * 16 + low) as u8);
                        }
                        other => {
                            let mut buf = [0; 4];
                            bytes.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
                        }
                    }
                }
                other => {
                    let mut buf = [0; 4];
                    bytes.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
                }
            }
        };
        args.push(String::from_utf8_lossy(&bytes).into_owned());
        text = &text[end..];
    }
}

/// A queue entry that outlived its owner's wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outlived {
    /// The entry, as the node kept it.
    pub entry: QueueEntry,
    /// The wait that made it.
    pub wait: Wait,
}

impl fmt::Display for Outlived {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}'s queue entry in {:?} (queued at {:.3} s) ",
            self.wait.holder,
            self.entry.name,
            self.entry.queued.as_secs_f64()
        )?;
        match self.entry.departed {
            Some((at, how)) => write!(f, "left ({how:?}) at {:.3} s", at.as_secs_f64())?,
            None => write!(f, "never left")?,
        }
        write!(
            f,
            ", its wait ended at {:.3} s",
            self.wait.ended.as_secs_f64()
        )
    }
}

/// The entries that stayed longer than [`QUEUE_GRACE`] after the wait that
/// made them ended: the wait of the same waiter that had begun when the
/// node queued it (the latest such).
pub(super) fn outlived(entries: &[QueueEntry], waits: &[Wait]) -> Vec<Outlived> {
    let mut found = Vec::new();
    for entry in entries {
        let Some(wait) = waits
            .iter()
            .filter(|w| w.name == entry.name && w.field == entry.field)
            .filter(|w| w.started <= entry.queued)
            .max_by_key(|w| w.started)
        else {
            continue;
        };
        let limit = wait.ended + QUEUE_GRACE;
        if entry.departed.is_none_or(|(at, _)| at > limit) {
            found.push(Outlived {
                entry: entry.clone(),
                wait: wait.clone(),
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_lines_are_parsed_with_their_escapes() {
        let (at, lua, args) =
            parse_monitor_line(r#"1795694766.659797 [0 lua] "rpush" "q:{a}" "u\"1\\\x41\n""#)
                .unwrap();
        assert!(lua);
        assert_eq!(args, ["rpush", "q:{a}", "u\"1\\A\n"]);
        let secs = at.duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        assert!((secs - 1_795_694_766.659_797).abs() < 1e-5);
        let (_, lua, args) =
            parse_monitor_line(r#"1.5 [0 127.0.0.1:55404] "evalsha" "abc" "1" "k""#).unwrap();
        assert!(!lua);
        assert_eq!(args.len(), 4);
        assert_eq!(parse_monitor_line("OK"), None);
    }

    /// Two waiters of a real fair lock are granted in queue order and leave
    /// nothing; a grant planted past the head, and an entry whose wait
    /// ended without a give-up, are both found.
    #[tokio::test]
    async fn the_replay_finds_an_overtaking_and_an_entry_left_behind() {
        use crate::{RedisProcess, TestServer, poll_until, protocol};
        use multilock::{Client, Node, Owner};
        use std::time::Instant;

        let server = RedisProcess::start().await.unwrap();
        let history = Arc::new(History::new());
        let name = "replayed";
        let monitor = QueueMonitor::start(history.clone(), &server.url(), &[name])
            .await
            .unwrap();
        let client = Client::new();
        let node = Node::new(&server.url()).unwrap();
        let lock = client.fair_lock(&node, name).unwrap();
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let queue = redisson_fair::queue(name);
        let watcher = conn.clone();
        let queued = |n: usize| {
            let (conn, queue) = (watcher.clone(), queue.clone());
            poll_until(
                Duration::from_secs(5),
                move || format!("{n} waiters queued"),
                move || {
                    let (mut conn, queue) = (conn.clone(), queue.clone());
                    async move {
                        let len: usize = redis::cmd("LLEN")
                            .arg(&queue)
                            .query_async(&mut conn)
                            .await
                            .ok()?;
                        (len == n).then_some(())
                    }
                },
            )
        };

        let holder = lock.with_owner(Owner::new("holder").unwrap());
        let guard = holder
            .lock_with_lease(Duration::from_secs(30))
            .await
            .unwrap();
        let mut waiters = Vec::new();
        for (i, owner) in ["a", "b"].into_iter().enumerate() {
            let waiter = lock.with_owner(Owner::new(owner).unwrap());
            let history = history.clone();
            let field = protocol::field(client.id(), owner);
            waiters.push(tokio::spawn(async move {
                let started = Instant::now();
                let guard = waiter.lock_with_lease(Duration::from_secs(30)).await;
                history.waited(name, &field, owner, started);
                let granted_at = Instant::now();
                guard.unwrap().unlock().await.unwrap();
                granted_at
            }));
            queued(i + 1).await.unwrap();
        }
        guard.unlock().await.unwrap();
        let (a, b) = (
            waiters.remove(0).await.unwrap(),
            waiters.remove(0).await.unwrap(),
        );
        assert!(a < b, "a was queued first");
        // The monitor reads its lines on a connection of its own: b's grant
        // may be replayed a moment after b's unlock returned.
        let entries = poll_until(
            Duration::from_secs(5),
            || "both grants replayed".to_owned(),
            || {
                let (entries, _) = history.queue_entries();
                let replayed = entries.len() == 2 && entries.iter().all(|e| e.departed.is_some());
                std::future::ready(replayed.then_some(entries))
            },
        )
        .await
        .unwrap_or_else(|_| history.queue_entries().0);
        let departures: Vec<_> = entries.iter().map(|e| e.departed.map(|d| d.1)).collect();
        assert_eq!(departures, [Some(Departure::Granted); 2], "{entries:?}");
        assert_eq!(history.check(&[]), Vec::new());

        // Planted: x queues behind a holder y, then z is granted past x,
        // and x's wait ends without giving up.
        let started = Instant::now();
        let _: i64 = redis::cmd("HINCRBY")
            .arg(name)
            .arg("y:1")
            .arg(1)
            .query_async(&mut conn)
            .await
            .unwrap();
        let queued_x: Option<i64> = redisson_fair::acquire(
            name,
            "x:1",
            Duration::from_secs(30),
            Duration::from_secs(60),
            redisson_fair::now_ms(),
        )
        .invoke_async(&mut conn)
        .await
        .unwrap();
        assert!(queued_x.is_some());
        let _: () = redis::pipe()
            .del(name)
            .hincr(name, "z:1", 1)
            .ignore()
            .query_async(&mut conn)
            .await
            .unwrap();
        history.waited(name, "x:1", "x", started);
        monitor.stop().await;
        let rules: Vec<&str> = history.check(&[]).iter().map(Violation::rule).collect();
        assert_eq!(rules, ["queue order", "queue entry outlived its wait"]);
    }
}
