//! The crate's one error type.
//!
//! Every failure that concerns a Redis node names the node by its address
//! (`host:port`, never the password) and keeps the cause in
//! [`std::error::Error::source`]; messages do not repeat the cause.

use std::fmt;
use std::time::Duration;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when locking.
///
/// "Not acquired within the wait" is not an error: `try_lock*` returns
/// `Ok(None)` for it.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Bad input, rejected before anything was sent: an empty name, a lease
    /// or watchdog timeout under [`MIN_LEASE`](crate::MIN_LEASE) or over
    /// [`MAX_LEASE`](crate::MAX_LEASE), no locks, the same node twice in a
    /// RedLock, a bad URL.
    InvalidArgument(String),
    /// An unlock by someone who does not hold the lock: another owner holds it,
    /// or it expired.
    NotHeld {
        /// The lock's name.
        lock: String,
        /// The nodes where it was not held: the lock's one node for a
        /// single-node lock; for a quorum lock, every node that said so
        /// (with those that released, they made a quorum).
        nodes: Vec<String>,
    },
    /// A node could not be reached, or did not answer in time.
    NodeUnavailable {
        /// The node's address (no password).
        node: String,
        /// Why: refused, timed out, disconnected.
        reason: Unavailable,
        /// The underlying error, when there is one.
        source: Option<redis::RedisError>,
    },
    /// The node answered with an error (for example `WRONGTYPE` when the
    /// lock's key holds something that is not a hash).
    Redis {
        /// The node's address (no password).
        node: String,
        /// The server's error.
        source: redis::RedisError,
    },
    /// A multi-node operation did not reach its quorum.
    NoQuorum(QuorumError),
    /// The lock could no longer be proven held (its guard's `lost()` fired)
    /// before the work given to `run_locked` finished: the work was dropped
    /// at its next await point.
    LockLost {
        /// The lock's name.
        lock: String,
    },
    /// The lock was granted on the primary but fewer replicas than required
    /// acknowledged it in time; it was released again.
    ReplicaSync {
        /// The lock's name.
        lock: String,
        /// The node (primary) it was granted on.
        node: String,
        /// Replicas required.
        required: u32,
        /// Replicas that acknowledged.
        acknowledged: u32,
    },
}

/// Why a node was unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unavailable {
    /// The connection was refused or could not be established.
    Refused,
    /// Connecting, waiting for a pooled connection or waiting for the reply
    /// took longer than the node's timeout; or so did the rollback of the
    /// same owner's earlier request, which its next request waits for.
    Timeout,
    /// The connection broke while the request was under way: it may or may
    /// not have been applied.
    Disconnected,
    /// Not sent: a recent request to the node timed out or was refused, and
    /// it has not answered a probe since (see [`Node::health`]).
    ///
    /// [`Node::health`]: crate::Node::health
    Suspect,
    /// A node that is a Sentinel group's primary: no sentinel answered and
    /// no primary was known yet, the sentinels name none for the master
    /// name, or the server they name is not a primary (a failover under
    /// way). Nothing was sent.
    NoPrimary,
    /// A node that is a Redis Cluster: no node gave the slot map, or no
    /// primary served the lock's slot within the response timeout
    /// (`CLUSTERDOWN`, `TRYAGAIN`, redirects that did not settle during a
    /// failover or slot migration, or a server the slot map named that
    /// answers as a replica now). Nothing was applied.
    NoShard,
}

/// A multi-node operation that fell short of its quorum.
#[derive(Debug)]
#[non_exhaustive]
pub struct QuorumError {
    /// The lock's name (the first part's name for a MultiLock of many names).
    pub lock: String,
    /// Nodes that granted (or released).
    pub succeeded: usize,
    /// Nodes required.
    pub required: usize,
    /// Nodes of the lock.
    pub nodes: usize,
    /// The nodes that granted (or released, or extended).
    pub succeeded_on: Vec<String>,
    /// Every other node of the lock, and why: its answer, its error, or
    /// [`FailureCause::NoAnswer`] when it had not answered when the round
    /// ended.
    pub failures: Vec<NodeFailure>,
}

/// One node's part of a [`QuorumError`].
#[derive(Debug)]
#[non_exhaustive]
pub struct NodeFailure {
    /// The node's address (no password).
    pub node: String,
    /// What happened there.
    pub cause: FailureCause,
}

/// What happened on one node of a failed multi-node operation.
#[derive(Debug)]
#[non_exhaustive]
pub enum FailureCause {
    /// Another owner holds the lock there, with this remaining TTL when known.
    Taken(Option<Duration>),
    /// The request there failed.
    Failed(Error),
    /// No answer yet when the operation ended (it had its quorum, or could
    /// no longer reach it): the request may still be applied there, and is
    /// then undone or adopted.
    NoAnswer,
    /// An unlock or extension of a guard that never held this node (it did
    /// not grant when the lock was acquired, nor later): nothing was sent
    /// there, and the node counts neither for the quorum nor against it.
    NeverGranted,
}

impl Error {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }

    /// Classifies a redis-rs error raised while talking to `node`.
    pub(crate) fn from_redis(node: &str, err: redis::RedisError) -> Self {
        // A refused password is the server's answer, not a broken link
        // (redis-rs files it under "reconnect").
        let reason = if err.kind() == redis::ErrorKind::AuthenticationFailed {
            None
        } else if err.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel {
            Some(Unavailable::NoPrimary)
        } else if is_cluster_unsettled(&err) {
            Some(Unavailable::NoShard)
        } else if err.is_timeout() {
            Some(Unavailable::Timeout)
        } else if err.is_connection_refusal() {
            Some(Unavailable::Refused)
        } else if err.is_io_error() || err.is_unrecoverable_error() {
            Some(Unavailable::Disconnected)
        } else {
            None
        };
        match reason {
            Some(reason) => Error::NodeUnavailable {
                node: node.to_owned(),
                reason,
                source: Some(err),
            },
            None => Error::Redis {
                node: node.to_owned(),
                source: err,
            },
        }
    }

    /// True for [`Error::NodeUnavailable`].
    pub fn is_node_unavailable(&self) -> bool {
        matches!(self, Error::NodeUnavailable { .. })
    }

    /// True when trying again cannot help: bad input, or an answer of the
    /// server that only a change of configuration or data mends:
    ///
    /// - a refused password (`WRONGPASS`, `NOAUTH`) or an ACL refusal
    ///   (`NOPERM`);
    /// - the lock's key holding another type (`WRONGTYPE`), or keys in
    ///   different slots (`CROSSSLOT`);
    /// - a plain `ERR` reply: an unknown or renamed command, a server that
    ///   is not what the node says (a Cluster node's seed with cluster
    ///   support off), a script error.
    ///
    /// Everything else passes: a node unavailable, and the server's
    /// conditions (`BUSY` running a script, `OOM`, `MISCONF` after a failed
    /// snapshot, `LOADING`, `READONLY` and `MASTERDOWN` in a failover,
    /// `TRYAGAIN`, `CLUSTERDOWN`, `NOSCRIPT`, the client limit reached).
    /// A list of what is permanent, so that an answer not foreseen here is
    /// waited out rather than ending a wait it might not end.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::InvalidArgument(_) => true,
            Error::Redis { source, .. } => is_permanent_answer(source),
            Error::NoQuorum(q) => q.is_permanent(),
            _ => false,
        }
    }

    /// True for a server that refused the request untried and keeps its
    /// data meanwhile: busy running a script (`BUSY`), out of memory
    /// (`OOM`), refusing writes after a failed snapshot (`MISCONF`). Not a
    /// server that is loading (`LOADING`: it restarted) or demoted
    /// (`READONLY`): what it held may be gone.
    pub(crate) fn is_refused_in_passing(&self) -> bool {
        matches!(self.condition(), Some("BUSY" | "OOM" | "MISCONF"))
    }

    /// The code of a passing condition the server answered with (`BUSY`,
    /// `OOM`, `LOADING`, ...), also when a script of Redis before 7
    /// wrapped it in an `ERR`.
    pub(crate) fn condition(&self) -> Option<&'static str> {
        match self {
            Error::Redis { source, .. } => condition_of(source),
            _ => None,
        }
    }

    /// True when a request may have been applied although no reply came back
    /// (a timeout or a broken connection): a rollback must cover that node.
    pub(crate) fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            Error::NodeUnavailable {
                reason: Unavailable::Timeout | Unavailable::Disconnected,
                ..
            }
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(msg) => write!(f, "invalid argument: {msg}"),
            Error::NotHeld { lock, nodes } => match nodes.as_slice() {
                [node] => write!(f, "lock {lock:?} is not held by this owner on node {node}"),
                nodes => write!(
                    f,
                    "lock {lock:?} is not held by this owner on nodes [{}]",
                    nodes.join(", ")
                ),
            },
            Error::NodeUnavailable { node, reason, .. } => {
                let why = match reason {
                    Unavailable::Refused => "connection refused or failed",
                    Unavailable::Timeout => "timed out",
                    Unavailable::Disconnected => "connection lost",
                    Unavailable::Suspect => {
                        "suspect (a recent request timed out or was refused); not sent"
                    }
                    Unavailable::NoPrimary => "the sentinels name no primary that answers as one",
                    Unavailable::NoShard => {
                        "no primary of the cluster serves the lock's slot now; not applied"
                    }
                };
                write!(f, "node {node} unavailable: {why}")
            }
            Error::Redis { node, .. } => write!(f, "node {node} answered with an error"),
            Error::NoQuorum(q) => q.fmt(f),
            Error::LockLost { lock } => write!(
                f,
                "lock {lock:?} was lost before its work finished; the work was dropped"
            ),
            Error::ReplicaSync {
                lock,
                node,
                required,
                acknowledged,
            } => write!(
                f,
                "lock {lock:?} on node {node}: {acknowledged} of {required} replicas acknowledged; released"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::NodeUnavailable {
                source: Some(s), ..
            } => Some(s),
            Error::Redis { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl fmt::Display for QuorumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lock {:?}: {} of {} required nodes (of {})",
            self.lock, self.succeeded, self.required, self.nodes
        )?;
        let list = |cause: fn(&FailureCause) -> bool| -> Vec<&str> {
            self.failures
                .iter()
                .filter(|n| cause(&n.cause))
                .map(|n| n.node.as_str())
                .collect()
        };
        if !self.succeeded_on.is_empty() {
            write!(f, "; succeeded on [{}]", self.succeeded_on.join(", "))?;
        }
        let taken = list(|c| matches!(c, FailureCause::Taken(_)));
        if !taken.is_empty() {
            write!(f, "; taken on [{}]", taken.join(", "))?;
        }
        let silent = list(|c| matches!(c, FailureCause::NoAnswer));
        if !silent.is_empty() {
            write!(f, "; no answer yet from [{}]", silent.join(", "))?;
        }
        let never = list(|c| matches!(c, FailureCause::NeverGranted));
        if !never.is_empty() {
            write!(f, "; never granted on [{}]", never.join(", "))?;
        }
        for n in &self.failures {
            if let FailureCause::Failed(e) = &n.cause {
                // The per-node error is part of this message (there is no
                // single source to return), so spell out its cause here.
                write!(f, "; {e}")?;
                if let Some(src) = std::error::Error::source(e) {
                    write!(f, " ({src})")?;
                }
            }
        }
        Ok(())
    }
}

impl QuorumError {
    /// True when the nodes that failed for good ([`Error::is_permanent`])
    /// are enough on their own to keep the quorum out of reach.
    pub fn is_permanent(&self) -> bool {
        let permanent = self
            .failures
            .iter()
            .filter(|f| matches!(&f.cause, FailureCause::Failed(e) if e.is_permanent()))
            .count();
        permanent > 0 && self.nodes.saturating_sub(permanent) < self.required
    }
}

impl From<QuorumError> for Error {
    fn from(e: QuorumError) -> Self {
        Error::NoQuorum(e)
    }
}

/// A Redis Cluster's answer that the request did not run because the slot
/// had no settled primary: a redirect, `TRYAGAIN` or `CLUSTERDOWN`.
fn is_cluster_unsettled(err: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    matches!(
        err.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
        )
    )
}

/// Whether the server's answer `err` is one no retry changes (see
/// [`Error::is_permanent`]).
fn is_permanent_answer(err: &redis::RedisError) -> bool {
    use redis::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig
    ) {
        return true;
    }
    let Some((code, detail)) = server_answer(err) else {
        return false;
    };
    match code.as_str() {
        "WRONGTYPE" | "NOAUTH" | "WRONGPASS" | "NOPERM" | "CROSSSLOT" => true,
        "ERR" => !detail.contains("max number of clients") && wrapped_condition(&detail).is_none(),
        _ => false,
    }
}

/// The code and detail of the server's error reply `err` carries: its own,
/// or the first of a pipeline's (a new connection's setup pipeline, which
/// loads the scripts, fails as a whole with the server's first refusal).
fn server_answer(err: &redis::RedisError) -> Option<(String, String)> {
    let answers = err.clone().into_server_errors()?;
    let (_, first) = answers.first()?;
    Some((
        first.code().to_owned(),
        first.details().unwrap_or_default().to_owned(),
    ))
}

/// The passing condition `err` reports, if any: its code, or the code a
/// script of Redis before 7 wrapped in an `ERR`.
pub(crate) fn condition_of(err: &redis::RedisError) -> Option<&'static str> {
    let (code, detail) = server_answer(err)?;
    match CONDITIONS.iter().find(|c| **c == code) {
        Some(known) => Some(known),
        None if code == "ERR" => wrapped_condition(&detail),
        None => None,
    }
}

/// The condition in Redis 6's wrapper of a failed call inside a script,
/// `ERR Error running script (call to f_…): @user_script:1: @user_script:
/// 1: -OOM command not allowed…`. Only that shape: other `ERR` replies may
/// quote a key name, which may hold anything.
fn wrapped_condition(detail: &str) -> Option<&'static str> {
    if !detail.starts_with("Error running script") {
        return None;
    }
    CONDITIONS
        .iter()
        .find(|c| detail.contains(&format!(": -{c} ")))
        .copied()
}

/// Conditions a server answers with for a while.
const CONDITIONS: &[&str] = &[
    "BUSY",
    "OOM",
    "MISCONF",
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The error redis-rs makes of the server's error reply `line`.
    fn answer(line: &str) -> Error {
        let reply = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
        Error::Redis {
            node: "127.0.0.1:6379".into(),
            source: reply.extract_error().unwrap_err(),
        }
    }

    /// What ends a wait is a list; everything else, the unforeseen too,
    /// passes. A condition a script of Redis 6 wrapped in `ERR` passes.
    #[test]
    fn only_the_listed_answers_are_permanent() {
        let permanent = [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair or user is disabled.",
            "NOPERM User app has no permissions to run the 'evalsha' command",
            "CROSSSLOT Keys in request don't hash to the same slot",
            "ERR This instance has cluster support disabled",
            "ERR unknown command 'EVALSHA'",
            // A key name quoting a condition's code changes nothing.
            "ERR fencing counter of lock 'orders -OOM 1' is not a counter",
        ];
        for line in permanent {
            assert!(answer(line).is_permanent(), "{line}");
        }
        let passing = [
            "BUSY Redis is busy running a script.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "MISCONF Redis is configured to save RDB snapshots",
            "LOADING Redis is loading the dataset in memory",
            "READONLY You can't write against a read only replica.",
            "MASTERDOWN Link with MASTER is down",
            "NOSCRIPT No matching script.",
            "ERR max number of clients reached",
            "ERR Error running script (call to f_1): @user_script:1: @user_script: 1: -OOM command not allowed when used memory > 'maxmemory'.",
            "SOMETHINGNEW a condition of a later Redis",
        ];
        for line in passing {
            assert!(!answer(line).is_permanent(), "{line}");
        }
        assert!(Error::invalid("x").is_permanent());
    }

    /// Only a server that ran nothing and keeps its data leaves a hold's
    /// proof standing.
    #[test]
    fn refusals_in_passing_are_busy_oom_and_misconf() {
        for line in [
            "BUSY Redis is busy running a script.",
            "OOM command not allowed",
            "MISCONF Redis is configured to save RDB snapshots",
            "ERR Error running script (call to f_1): @user_script:1: @user_script: 1: -OOM command not allowed",
        ] {
            assert!(answer(line).is_refused_in_passing(), "{line}");
        }
        for line in [
            "LOADING Redis is loading the dataset in memory",
            "READONLY You can't write against a read only replica.",
            "ERR unknown command",
        ] {
            assert!(!answer(line).is_refused_in_passing(), "{line}");
        }
    }
}
