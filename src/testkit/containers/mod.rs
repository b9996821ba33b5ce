//! The container backend: Redis in Docker containers.
//!
//! Each [`RedisContainer`] runs one `redis-server` (no persistence) on a
//! user-defined Docker bridge network that the kit creates, at a fixed
//! address the kit chooses. Clients reach it directly at
//! `redis://<container ip>:6379`, so the faults are the real thing:
//!
//! | fault | what happens | a client sees |
//! |---|---|---|
//! | [`kill`](crate::testkit::TestServer::kill) | `docker kill` (SIGKILL) | open connections close; new ones time out (the address is gone, as with a dead host) |
//! | [`pause`](crate::testkit::TestServer::pause) | `docker pause` (cgroup freezer) | requests time out; answered after `unpause` |
//! | [`partition`](crate::testkit::TestServer::partition) | the container is disconnected from its network, still running | requests time out (packets are dropped, not refused); open connections resume after `heal` |
//! | [`restart`](crate::testkit::TestServer::restart) | the container is removed and created again at the same address | the server is back, empty |
//!
//! Why the container address and not a published host port: a published
//! port goes through `docker-proxy`, and disconnecting the container makes
//! the proxy close every connection and refuse new ones. That is a crash,
//! not a partition. Measured on Docker 20.10: through the container address
//! a partitioned server makes requests time out, and a healed one answers
//! the same connections again. This needs a Linux host, where the host
//! routes to bridge networks (not Docker Desktop's VM).
//!
//! Asymmetric partitions: servers from
//! [`RedisContainer::start_many_two_sided`] sit on two networks, side A
//! ([`TestServer::url`](crate::testkit::TestServer::url)) and side B
//! ([`RedisContainer::url_from`]); [`RedisContainer::partition_side`]
//! cuts one side only, so a client on
//! side A loses a server that a client on side B still reaches. A
//! [`ReplicatedPair`] replicates over side B, so cutting its link leaves
//! both servers reachable for clients.
//!
//! The Docker API is spoken through the `bollard` client that
//! `testcontainers` re-exports, with the API version negotiated with the
//! daemon: `testcontainers`' own runner pins API 1.53, which daemons older
//! than Docker 25 (API 1.44) refuse outright.
//!
//! # Environment
//!
//! - `MULTILOCK_REDIS_IMAGE`: the image ([`IMAGE_ENV`]); default `redis:7`
//!   ([`DEFAULT_IMAGE`]). A missing image is pulled; when that fails,
//!   starting fails with a message that says how to build the local one.
//! - `MULTILOCK_KEEP_CONTAINERS=1` ([`KEEP_ENV`]): containers and networks
//!   are left behind for debugging (their names are logged through `tracing`).
//! - `DOCKER_HOST`: the Docker daemon, as for the `docker` CLI.
//!
//! Everything the kit creates carries the label `org.multilock.testkit`.
//! After a test process was killed (no `Drop` ran):
//! `docker rm -f $(docker ps -aq --filter label=org.multilock.testkit)` and
//! `docker network prune -f --filter label=org.multilock.testkit`.
//!
//! # Examples
//!
//! ```no_run
//! use multilock::testkit::{RedisContainer, TestServer};
//!
//! # async fn demo() -> std::io::Result<()> {
//! let mut nodes = RedisContainer::start_many(3).await?;
//! let node = multilock::Node::new(&nodes[0].url()).unwrap();
//! nodes[0].partition().await?; // requests time out
//! nodes[0].heal().await?;      // the same connections work again
//! nodes[1].restart().await?;   // same address, empty
//! for node in nodes {
//!     node.rm().await?;
//! }
//! # Ok(()) }
//! ```

// docker.rs: the client, the image, bounded calls, the one removal;
// network.rs: the kit's networks and the two sides; container.rs:
// RedisContainer and its faults; replicated.rs: the container half of
// ReplicatedPair.
mod container;
mod docker;
mod network;
mod replicated;

pub use crate::testkit::ReplicatedPair;
pub use container::{REDIS_PORT, RedisContainer};
pub use docker::{DEFAULT_IMAGE, IMAGE_ENV, KEEP_ENV, image};
pub use network::Side;
