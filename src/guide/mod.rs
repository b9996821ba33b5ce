//! The manual: the long form of what the crate front page sums up.
//!
//! Each guide is a page of documentation only (no items); read them in
//! this order, or go straight to the one you need:
//!
//! | guide | what it covers |
//! |---|---|
//! | [`semantics`] | owners and reentrancy, leases and the watchdog, `lost()`, scoped locking, cancellation, waiting, what `lock()` waits out |
//! | [`lock_kinds`] | the reentrant, fair and read-write locks, in Redisson's format, alone or in a MultiLock or RedLock |
//! | [`quorum`] | how a MultiLock or RedLock runs a round; degraded mode with a node slow, frozen or dead |
//! | [`fencing`] | fencing tokens: how they are settled, vouched for and repaired, and what they guarantee across restarts |
//! | [`limits`] | known limits: read before relying on RedLock |
//! | [`deployments`] | standalone servers, Sentinel groups, Redis Clusters, TLS; what replication can still lose |
//! | [`errors`] | the one error type, variant by variant |
//! | [`operating`] | during an incident: `inspect` (holders, waiters, TTLs, counters, a verdict per quorum), `find_locks`, forcing a release, the CLI |
//! | [`observability`] | tracing spans, the `metrics` feature's metrics, node health |
//! | [`performance`] | what the benchmark measures and what it shows |
//! | [`testing`] | running the examples, the tests and the chaos checks: prerequisites and variables |

pub mod deployments;
pub mod errors;
pub mod fencing;
pub mod limits;
pub mod lock_kinds;
pub mod observability;
pub mod operating;
pub mod performance;
pub mod quorum;
pub mod semantics;
pub mod testing;
