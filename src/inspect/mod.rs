//! What an operator asks during an incident: who holds a lock, on which
//! nodes, since when, and who waits. [`Lock::inspect`](crate::Lock::inspect)
//! and [`QuorumLock::inspect`](crate::QuorumLock::inspect) read each node
//! in one read-only request and report what they found here: a
//! [`LockState`] per node that answered, and a [`Verdict`] over all of them.
//!
//! Everything is reported as the server stores it, in Redisson's format,
//! whoever wrote it: a Redisson client's owner is its thread id, a
//! node-redisson client's whatever it chose.

use std::time::{Duration, SystemTime};

use crate::error::Error;

mod verdict;

pub use verdict::{Claim, Verdict};

/// One inspection of a lock: what each of its nodes holds, and the verdict.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
/// use multilock::inspect::Verdict;
/// let inspection = red.inspect().await?;
/// match &inspection.verdict {
///     Verdict::Held(claims) => println!("held by {}", claims[0].field),
///     Verdict::Free => println!("free"),
///     other => println!("{other:?}"),
/// }
/// for node in &inspection.nodes {
///     println!("{}: {:?}", node.node, node.state.as_ref().map(|s| s.holders.len()));
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Inspection {
    /// How many nodes must hold the lock for it to be held: 1 for a
    /// single-node lock, every node for a `MultiLock`, N/2+1 for a
    /// `RedLock`.
    pub quorum: usize,
    /// Each node's answer, in the order of the lock's parts.
    pub nodes: Vec<NodeInspection>,
    /// Who holds the lock, judged from the nodes' answers against the
    /// quorum.
    pub verdict: Verdict,
}

impl Inspection {
    /// The inspection of `nodes`, judged against `quorum`.
    pub(crate) fn new(quorum: usize, nodes: Vec<NodeInspection>) -> Inspection {
        let verdict = Verdict::judge(quorum, &nodes);
        Inspection {
            quorum,
            nodes,
            verdict,
        }
    }
}

/// One node's answer: the lock's state there, or why the node did not give
/// it within its timeout.
#[derive(Debug)]
#[non_exhaustive]
pub struct NodeInspection {
    /// The node's address, as [`Node::addr`](crate::Node::addr) gives it
    /// (never with a password).
    pub node: String,
    /// The lock's name on this node (a `MultiLock`'s parts may differ).
    pub name: String,
    /// What the node holds for the lock, or the error that kept it from
    /// answering (a timeout, a refused connection, ...).
    pub state: Result<LockState, Error>,
}

/// What one node stores for a lock, read at one instant (one read-only
/// script). Empty fields mean the node has nothing of that kind.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// The holders, in the order the server lists the hash's fields.
    pub holders: Vec<Holder>,
    /// The lock key's remaining time to live; `None` when the key does not
    /// exist (the lock is free) or has no expiry.
    pub ttl: Option<Duration>,
    /// A read-write lock's mode; `None` for the other kinds, or when free.
    pub mode: Option<Mode>,
    /// A fair lock's queue, head first.
    pub queue: Vec<Waiter>,
    /// The fencing counter (`redisson_lock_token:{name}`): the last token
    /// granted on this node, when the lock is fenced.
    pub fencing_counter: Option<u64>,
    /// The server's clock when it answered: what a [`Waiter::deadline`],
    /// written in a client's clock, compares with.
    pub server_time: SystemTime,
    /// Whether a list was cut short: more than 10,000 fields or waiters, or
    /// more than 1,000 read holds in all (those past it have no TTL
    /// listed). One inspect never holds the server long.
    pub truncated: bool,
    /// Keys of the lock's family that hold another type (a stray key under
    /// a queue's or counter's name), each with the server's error: read
    /// apart, so they hide nothing else.
    pub unreadable: Vec<String>,
}

impl LockState {
    /// Whether anyone holds the lock on this node: the hash has a holder's
    /// field, whatever its count says (under Redisson's rule such a field
    /// keeps everyone else out).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let inspection = lock.inspect().await?;
    /// if let Ok(state) = &inspection.nodes[0].state {
    ///     println!("held: {}", state.is_held());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }
}

/// A read-write lock's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Readers hold it (and a writer may hold read holds of its own).
    Read,
    /// A writer holds it.
    Write,
}

impl Mode {
    /// `"read"` or `"write"`, as Redisson stores it.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(multilock::inspect::Mode::Write.as_str(), "write");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

/// One holder: a field of the lock's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The hash field as stored: `<client-uuid>:<owner>`, with `:write`
    /// after a writer's.
    pub field: String,
    /// The client's id: the field up to its first `:` (the whole field
    /// when it has none).
    pub client_id: String,
    /// The owner within the client: our task or explicit owner, a
    /// Redisson client's thread id.
    pub owner: String,
    /// The hold count (re-entries included). A value that is not a count
    /// (another client's bug) reads as 0: the field still holds the lock.
    pub holds: u64,
    /// Whether this is a read-write lock's writer.
    pub writer: bool,
    /// A reader's holds, one per hold (1..=`holds`), each with the time to
    /// live of its timeout key; `None` for a hold whose key expired (a
    /// crashed reader's, not yet cleaned up). Empty for other holders.
    pub read_holds: Vec<Option<Duration>>,
}

impl Holder {
    /// The holder of `field` whose value is `count`: the client id and
    /// owner split at the field's first `:`, and a writer's `:write` taken
    /// off.
    pub(crate) fn new(field: String, count: String, writer: bool) -> Holder {
        let holds = count.trim().parse().unwrap_or(0);
        let who = if writer {
            field.strip_suffix(":write").unwrap_or(&field)
        } else {
            &field
        };
        let (client_id, owner) = split_field(who);
        Holder {
            client_id,
            owner,
            field,
            holds,
            writer,
            read_holds: Vec::new(),
        }
    }
}

/// A fair lock's waiter.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiter {
    /// The waiter's field, `<client-uuid>:<owner>`.
    pub field: String,
    /// The waiter's client id.
    pub client_id: String,
    /// The waiter's owner within its client.
    pub owner: String,
    /// When the waiter's place expires unless it is granted first, in the
    /// clock of the client that queued it; `None` when the queue holds no
    /// deadline for it.
    pub deadline: Option<SystemTime>,
}

impl Waiter {
    pub(crate) fn new(field: String, deadline: Option<SystemTime>) -> Waiter {
        let (client_id, owner) = split_field(&field);
        Waiter {
            field,
            client_id,
            owner,
            deadline,
        }
    }
}

/// A lock found by [`Node::find_locks`](crate::Node::find_locks).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FoundLock {
    /// The lock's name (its hash's key).
    pub name: String,
    /// The address of the server that holds it (a Cluster's primary).
    pub node: String,
    /// Whether the hash is a read-write lock's (it has a `mode`).
    pub read_write: bool,
}

/// What [`Node::find_locks`](crate::Node::find_locks) found, and the
/// servers it could not scan (a Cluster's shard down: the others' locks are
/// still listed).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct FoundLocks {
    /// The locks found, by name.
    pub locks: Vec<FoundLock>,
    /// The servers whose scan failed, each with its error.
    pub unscanned: Vec<Unscanned>,
}

/// A server [`Node::find_locks`](crate::Node::find_locks) could not scan.
#[derive(Debug)]
#[non_exhaustive]
pub struct Unscanned {
    /// The server's address.
    pub node: String,
    /// Why its scan failed.
    pub error: Error,
}

/// `<client-uuid>:<owner>` as its two parts. A client id is a UUID (no
/// `:`); the owner may hold any character.
fn split_field(field: &str) -> (String, String) {
    match field.split_once(':') {
        Some((client_id, owner)) => (client_id.to_owned(), owner.to_owned()),
        None => (field.to_owned(), String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_split_at_the_first_colon_and_writers_lose_their_suffix() {
        let reader = Holder::new("c0ffee:task:7".into(), "2".into(), false);
        assert_eq!(reader.holds, 2);
        assert_eq!(
            (reader.client_id.as_str(), reader.owner.as_str()),
            ("c0ffee", "task:7")
        );
        let writer = Holder::new("c0ffee:42:write".into(), "many".into(), true);
        assert_eq!(writer.holds, 0);
        assert_eq!(
            (writer.client_id.as_str(), writer.owner.as_str()),
            ("c0ffee", "42")
        );
        assert_eq!(writer.field, "c0ffee:42:write");
        let odd = Waiter::new("no-colon".into(), None);
        assert_eq!(
            (odd.client_id.as_str(), odd.owner.as_str()),
            ("no-colon", "")
        );
    }
}
