//! The integration tests, as one binary: real Redis servers (processes from
//! the test kit, and containers for the failover suite), one file per
//! concern, and one toolbox (`common`) that the whole suite shares, so a
//! helper nobody uses is a warning.

mod common;
mod degraded;

mod auth;
#[cfg(feature = "cluster")]
mod cluster;
#[cfg(feature = "cluster")]
mod cluster_failover;
#[cfg(feature = "cluster")]
mod cluster_groups;
#[cfg(feature = "cluster")]
mod cluster_migration;
#[cfg(feature = "cluster")]
mod cluster_partition;
#[cfg(all(feature = "cluster", feature = "tls"))]
mod cluster_tls;
mod connections;
mod errors;
mod failover;
mod fair;
mod fencing;
mod hold_warning;
mod hostile;
mod inspect;
mod inspect_edges;
mod late_release;
mod let_go;
#[cfg(feature = "metrics")]
mod metrics;
mod node_failure;
mod proxy;
mod redisson_family;
mod redlock;
mod reentrancy;
mod ride_through;
mod rwlock;
mod scenarios;
mod scoped;
#[cfg(feature = "sentinel")]
mod sentinel;
#[cfg(feature = "sentinel")]
mod sentinel_groups;
#[cfg(all(feature = "sentinel", feature = "tls"))]
mod sentinel_tls;
mod transient;
mod waiting;
mod watchdog;
mod wire;
