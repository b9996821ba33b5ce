//! The one error type, [`Error`]: its variants, when each comes, and what
//! a bounded wait returns instead of an error.
//!
//! Errors are one enum, [`Error`] (table below). Passwords in URLs
//! never appear in errors, `Debug` output or logs; an application that
//! writes a node's URL itself can redact it the same way with
//! [`redact_url`](crate::redact_url).
//!
//! # Errors
//!
//! | variant | when | fields |
//! |---|---|---|
//! | `InvalidArgument(msg)` | rejected before anything is sent: an empty name, a lease or watchdog timeout under [`MIN_LEASE`] (10 ms) or over [`MAX_LEASE`], the same node twice in a RedLock, one server under two addresses, a bad URL | the reason |
//! | `NotHeld { lock, nodes }` | unlock (or extend) by a non-holder, or after the lease ran out, for every lock type | `nodes`: the lock's node; for a quorum lock, every node where it was not held (a list to match on) |
//! | `NodeUnavailable { node, reason, source }` | a node refused, timed out (its own reply or connect timeout, never the caller's wait), dropped the connection, or is suspect (nothing sent) | `reason`: `Refused`, `Timeout`, `Disconnected`, `Suspect` |
//! | `Redis { node, source }` | the server answered with an error: a key of the wrong type (a failed script changes nothing), a fencing counter that is no integer, an ACL refusal; or a condition that passes (`BUSY`, `OOM`, `MISCONF`, `LOADING`: not [`Error::is_permanent`]) | the server's error |
//! | `NoQuorum(QuorumError)` | a quorum lock's operation fell short | every node: those that succeeded, those that answered otherwise and why, those that had not answered |
//! | `LockLost { lock }` | `run_locked`: the lock could no longer be proven held before the work ended | |
//! | `ReplicaSync { lock, node, required, acknowledged }` | fewer replicas than required acknowledged a grant; it was released | |
//!
//! A bounded wait that ends with an attempt still in flight returns `Ok(None)`
//! (not acquired within the wait): a caller's own deadline, or a caller that
//! drops its future, is never taken as a verdict on the node. Only the node's
//! own timeouts make it `Timeout` or suspect.
//!
//! Which errors `lock()` waits out and which end it:
//! [`semantics`](super::semantics#in-a-service-use-try_lock_for).
//!
//! [`Error`]: crate::Error
//! [`MIN_LEASE`]: crate::MIN_LEASE
//! [`MAX_LEASE`]: crate::MAX_LEASE
//! [`Error::is_permanent`]: crate::Error::is_permanent
