#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

mod api;
mod client;
mod detach;
mod error;
mod guard;
mod lease;
mod lock;
mod multi;
mod node;
mod owner;
mod protocol;
mod watchdog;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use api::DistributedLock;
pub use client::{Client, ClientBuilder, DEFAULT_WATCHDOG_TIMEOUT};
pub use error::{Error, FailureCause, NodeFailure, QuorumError, Result, Unavailable};
pub use guard::Guard;
pub use lease::MAX_LEASE;
pub use lock::Lock;
pub use multi::{
    All, DEFAULT_NODE_TIMEOUT, Majority, MultiLock, QuorumLock, QuorumPolicy, RedLock,
};
pub use node::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_POOL_SIZE, DEFAULT_RESPONSE_TIMEOUT, Node, NodeBuilder,
};
pub use owner::Owner;
