//! The container backend: Redis in Docker containers.
//!
//! Each [`RedisContainer`] runs one `redis-server` (no persistence) on a
//! user-defined Docker bridge network that the kit creates, at a fixed
//! address the kit chooses. Clients reach it directly at
//! `redis://<container ip>:6379`, so the faults are the real thing:
//!
//! | fault | what happens | a client sees |
//! |---|---|---|
//! | [`kill`](crate::TestServer::kill) | `docker kill` (SIGKILL) | open connections close; new ones time out (the address is gone, as with a dead host) |
//! | [`pause`](crate::TestServer::pause) | `docker pause` (cgroup freezer) | requests time out; answered after `unpause` |
//! | [`partition`](crate::TestServer::partition) | the container is disconnected from its network, still running | requests time out (packets are dropped, not refused); open connections resume after `heal` |
//! | [`restart`](crate::TestServer::restart) | the container is removed and created again at the same address | the server is back, empty |
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
//! ([`TestServer::url`](crate::TestServer::url)) and side B
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
//! # The image
//!
//! Containers run `redis:7` ([`DEFAULT_IMAGE`]), pulled when missing. When
//! it cannot be pulled (no registry access), the kit builds
//! `multilock-redis:local` ([`DEFAULT_LOCAL_IMAGE`]) from the host's
//! `redis-server` through the Docker API, with the recipe of
//! `docker/build-local-image.sh` (a `FROM scratch` image of the binary and
//! the libraries it links), and runs that instead; a warning says so once
//! per process. [`redis_image`] says which image runs and why. The build
//! takes a few seconds and happens once: later runs find the image up to
//! date (the fingerprint label the script uses), until the host's
//! `redis-server` or a library changes.
//!
//! # Environment
//!
//! - `MULTILOCK_REDIS_IMAGE`: the image to run ([`IMAGE_ENV`]), instead of
//!   `redis:7`. An image named this way is pulled when missing and never
//!   replaced by another: when it cannot be had, starting fails with a
//!   message saying so. (Naming the local image's tag builds it when
//!   missing, as the fallback does.)
//! - `MULTILOCK_LOCAL_IMAGE`: the tag of the local image
//!   ([`LOCAL_IMAGE_ENV`]; the build script reads it too). A tag that holds
//!   an image the kit or the script did not build is never overwritten.
//! - `REDIS_SERVER_BIN`, else `MULTILOCK_REDIS_SERVER`: the `redis-server`
//!   the local image is built from; default `redis-server` from `PATH`.
//! - `MULTILOCK_KEEP_CONTAINERS=1` ([`KEEP_ENV`]): containers and networks
//!   are left behind for debugging (their names are logged through `tracing`).
//! - `DOCKER_HOST`: the Docker daemon, as for the `docker` CLI.
//!
//! Everything the kit creates carries the label `org.multilock.testkit`.
//! After a test process was killed (no `Drop` ran):
//! `docker rm -f $(docker ps -aq --filter label=org.multilock.testkit)` and
//! `docker network prune -f --filter label=org.multilock.testkit`; a build
//! cut short may leave a `multilock-redis:build-<pid>-<n>` tag
//! (`docker rmi` it).
//!
//! # Examples
//!
//! ```no_run
//! use multilock_testkit::{RedisContainer, TestServer};
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

// docker.rs: the client, bounded calls, the one removal; image.rs: which
// image runs, pulled or built once per process; recipe.rs: the local
// image's build context, as docker/build-local-image.sh makes it;
// network.rs: the kit's networks and the two sides; container.rs:
// RedisContainer and its faults; replicated.rs: the container half of
// ReplicatedPair.
mod container;
mod docker;
mod image;
mod network;
mod recipe;
mod replicated;

pub use crate::ReplicatedPair;
pub use container::{REDIS_PORT, RedisContainer};
pub use docker::KEEP_ENV;
pub use image::{
    DEFAULT_IMAGE, DEFAULT_LOCAL_IMAGE, IMAGE_ENV, ImageOrigin, LOCAL_IMAGE_ENV, RedisImage, image,
    local_image, redis_image,
};
pub use network::Side;
