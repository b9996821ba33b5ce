//! A kit for tests against real Redis servers, for `multilock` and for the
//! failover tests of the services that use it (its README, with a failover
//! test to copy, is below the API: [`readme`]).
//!
//! Two backends with one API, [`TestServer`]: [`RedisProcess`] runs
//! `redis-server` processes on free loopback ports, and [`containers`] runs
//! Docker containers, driven through the bollard client that testcontainers
//! re-exports. Each can be killed, paused, restarted on the same port,
//! partitioned and healed, so a failover test runs on either.
//!
//! - Generic code takes any `S: TestServer`.
//! - A program that picks the backend at run time holds [`AnyServer`]s,
//!   started by a [`Backend`] (`Backend::Containers.start_many(5)`);
//!   [`AnyServer`]'s own [`TestServer::start`] reads `MULTILOCK_BACKEND`
//!   ([`BACKEND_ENV`]: `processes`, the default, or `containers`).
//! - `MULTILOCK_REDIS_SERVER` ([`SERVER_ENV`]): the server binary of every
//!   process the kit starts (servers, replicas, sentinels as `<binary>
//!   <conf> --sentinel`, cluster nodes) instead of `redis-server` from
//!   `PATH`: Redis 6.2 or later, or Valkey 8 (`.ci/servers.sh` fetches
//!   both). On 6.2 cluster nodes listen for the bus on port + 10000, and
//!   [`RedisCluster::start_with_bus_proxies`] fails (no `bind-source-addr`).
//!   The container backend runs `redis:7` when it can be pulled, else the
//!   local image, built from `REDIS_SERVER_BIN`, else this binary, else the
//!   host's `redis-server` ([`containers`]); CI checks it on the last only.
//! - [`ReplicatedPair`] is a primary with one replica, on any backend, whose
//!   replication link a test can cut, restore, and fail over.
//! - [`PollLimit`] and [`poll_until`] wait for a condition with a deadline,
//!   [`FencedStore`] is a resource that checks fencing tokens,
//!   [`TcpProxy`] adds latency per direction (fixed or jittered, to a
//!   fraction of a millisecond), black-holes a direction, cuts chosen
//!   connections or drops them silently (a NAT, a black-holed route),
//!   [`protocol`] builds the crate's own script calls, and [`redisson`]
//!   sends Redisson 3.24+'s lock protocol, as a foreign client would.
//!
//! ```no_run
//! use multilock_testkit::{RedisProcess, TestServer};
//!
//! # async fn demo() -> std::io::Result<()> {
//! let mut server = RedisProcess::start().await?;
//! let node = multilock::Node::new(&server.url()).unwrap();
//! server.pause().await?;   // SIGSTOP: requests time out
//! server.unpause().await?;
//! server.kill().await?;    // SIGKILL: connections refused
//! server.restart().await?; // same port, empty
//! # Ok(()) }
//! ```

/// The crate's README: what is in the kit, its settings, and a failover test
/// to copy (compiled and run as a doctest).
#[doc = include_str!("../README.md")]
pub mod readme {}

mod any;
mod bare;
mod cluster;
mod command;
pub mod containers;
mod cpu;
mod fencing;
mod history;
mod poll;
mod process;
mod proxy;
pub mod redisson;
pub mod redisson_fair;
pub mod redisson_rwlock;
mod replicated;
mod sentinel;

use std::io;

/// The library's own script calls (`multilock::wire`), built by the same
/// code the library sends them with: key names, the acquire, release,
/// renewal and fencing scripts, and their replies.
#[doc(inline)]
pub use multilock::wire as protocol;

pub use any::{AnyServer, BACKEND_ENV, Backend};
pub use bare::bare_lock_unlock;
pub use cluster::{ClusterNode, RedisCluster, SlotMigration, key_slot};
pub use command::Role;
pub use containers::{RedisContainer, Side};
pub use cpu::process_cpu_seconds;
pub use fencing::FencedStore;
pub use history::{
    Access, Departure, FencedWrite, History, Hold, HoldId, Leftover, Outlived, Overtaking,
    QUEUE_GRACE, QueueEntry, QueueMonitor, Violation, Wait, check, connect_all, leftover_keys,
    scan_keys, shared_overlaps,
};
pub use poll::{PollLimit, poll_until};
pub use process::{RedisProcess, SERVER_ENV};
pub use proxy::{ConnectionId, Delay, Direction, ProxyConnection, TcpProxy};
pub use replicated::{ReplicaBackend, ReplicatedPair, wait_replica_acks, wait_replicated};
pub use sentinel::{GroupMember, SentinelGroup, SentinelNode};

/// A Redis server under test, with the faults a test can inject.
///
/// Every method is async so container backends can implement it; the
/// process backend finishes each at once.
///
/// # Cancel safety
///
/// Each fault is one request to the OS or to Docker (a restart: a removal,
/// then a start): if its future is dropped it may or may not have been
/// applied, and the server is in whatever state that left.
pub trait TestServer: Send + Sized {
    /// Starts one server, empty, and returns once it answers PING.
    fn start() -> impl Future<Output = io::Result<Self>> + Send;

    /// Starts `n` independent servers at once.
    fn start_many(n: usize) -> impl Future<Output = io::Result<Vec<Self>>> + Send;

    /// Stops the server for good and frees what it used (the process, or
    /// the container and the networks no other server shares). Dropping the
    /// handle does the same, best effort.
    fn rm(self) -> impl Future<Output = io::Result<()>> + Send;

    /// `redis://host:port` reaching the server from this process.
    fn url(&self) -> String;

    /// Whether the server runs (it may be paused or partitioned).
    fn is_running(&self) -> bool;

    /// Stops the server at once (SIGKILL / container kill): its data is lost
    /// and connections are refused until [`TestServer::restart`].
    fn kill(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// Freezes the server (SIGSTOP / docker pause): connections stay open,
    /// requests get no reply.
    fn pause(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// Resumes a paused server; it then answers what was queued.
    fn unpause(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// Starts the server again on the same port, empty (no persistence);
    /// kills it first if it runs. Returns once it answers PING.
    fn restart(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// Cuts the server off the network while it keeps running. For
    /// processes this is a SIGSTOP (to a client, a partition and a freeze
    /// look alike: requests time out); containers are disconnected from
    /// their network.
    fn partition(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// Undoes [`TestServer::partition`].
    fn heal(&mut self) -> impl Future<Output = io::Result<()>> + Send;
}
