#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

mod any_lock;
mod client;
mod client_core;
mod distributed_lock;
mod error;
mod fencing;
mod finish_on_drop;
mod guard;
pub mod guide;
mod hold_warning;
pub mod inspect;
mod late_parts;
mod metrics;
mod node;
mod owner;
mod protocol;
mod quorum;
mod running;
mod scoped;
mod single;
mod timing;
mod watchdog;

// The test kit's door to the wire contract (`multilock-testkit` turns it
// on): kept out of the documented API, which it would crowd.
#[cfg(feature = "wire")]
#[doc(hidden)]
pub mod wire;

/// The redis-rs crate this one is built on, so an application names its
/// types (the source of [`Error::Redis`], say) at the version this crate
/// uses, without a dependency line of its own to keep in step.
pub use redis;

/// The uuid crate, for [`ClientBuilder::id`]'s argument, at the version
/// this crate uses.
pub use uuid;

pub use any_lock::AnyLock;
pub use client::{Client, ClientBuilder, DEFAULT_FENCING_COUNTER_EXPIRY, DEFAULT_WATCHDOG_TIMEOUT};
pub use distributed_lock::DistributedLock;
pub use error::{Error, FailureCause, NodeFailure, QuorumError, Result, Unavailable};
pub use guard::Guard;
#[cfg(feature = "cluster")]
pub use node::ShardedPubSub;
pub use node::redact_url;
pub use node::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVE, DEFAULT_POOL_SIZE, DEFAULT_RESPONSE_TIMEOUT,
    Health, Node, NodeBuilder,
};
pub use owner::Owner;
pub use quorum::{
    All, DEFAULT_NODE_TIMEOUT, Majority, MultiLock, QuorumLock, QuorumPolicy, RedLock,
};
pub use single::{DEFAULT_QUEUE_WAIT, Lock, MAX_REPLICA_SYNC_TIMEOUT, ReadWriteLock};
pub use timing::{MAX_LEASE, MIN_LEASE};
