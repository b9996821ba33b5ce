//! The container backend: Redis in Docker containers.
//!
//! Each [`RedisContainer`] runs one `redis-server` (no persistence) on a
//! user-defined Docker bridge network that the kit creates, at a fixed
//! address the kit chooses. Clients reach it directly at
//! `redis://<container ip>:6379`, so the faults are the real thing:
//!
//! | fault | what happens | a client sees |
//! |---|---|---|
//! | [`kill`](TestServer::kill) | `docker kill` (SIGKILL) | open connections close; new ones time out (the address is gone, as with a dead host) |
//! | [`pause`](TestServer::pause) | `docker pause` (cgroup freezer) | requests time out; answered after `unpause` |
//! | [`partition`](TestServer::partition) | the container is disconnected from its network, still running | requests time out (packets are dropped, not refused); open connections resume after `heal` |
//! | [`restart`](TestServer::restart) | the container is removed and created again at the same address | the server is back, empty |
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
//! ([`TestServer::url`]) and side B ([`RedisContainer::url_from`]);
//! [`RedisContainer::partition_side`] cuts one side only, so a client on
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

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use futures::StreamExt;
use testcontainers::bollard::Docker;
use testcontainers::bollard::errors::Error as DockerError;
use testcontainers::bollard::models::{
    ContainerCreateBody, EndpointIpamConfig, EndpointSettings, HostConfig, Ipam, IpamConfig,
    NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest, NetworkingConfig,
};
use testcontainers::bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, KillContainerOptionsBuilder,
    RemoveContainerOptionsBuilder, StartContainerOptions,
};

use super::process::{wait_replica_acks, wait_until_ready};
use super::{PollLimit, TestServer};

/// Environment variable naming the Redis image to run.
pub const IMAGE_ENV: &str = "MULTILOCK_REDIS_IMAGE";
/// The image used when [`IMAGE_ENV`] is unset.
pub const DEFAULT_IMAGE: &str = "redis:7";
/// Environment variable that, set to `1`, keeps containers and networks
/// after the test for debugging.
pub const KEEP_ENV: &str = "MULTILOCK_KEEP_CONTAINERS";
/// The port Redis listens on inside each container.
pub const REDIS_PORT: u16 = 6379;

/// Label put on every container and network the kit creates, so leftovers
/// can be found: `docker ps -a --filter label=org.multilock.testkit`.
const LABEL: &str = "org.multilock.testkit";
/// How long a server may take to answer its first PING.
const READY_LIMIT: Duration = Duration::from_secs(30);
/// How long a healed server may take to be reachable again (the host's
/// neighbour cache has to forget the failed lookups).
const HEAL_LIMIT: Duration = Duration::from_secs(15);
/// Bound on any single Docker API call.
const DOCKER_CALL_LIMIT: Duration = Duration::from_secs(60);
/// Bound on pulling a missing image.
const PULL_LIMIT: Duration = Duration::from_secs(300);

/// The image to run: `$MULTILOCK_REDIS_IMAGE`, else [`DEFAULT_IMAGE`].
pub fn image() -> String {
    std::env::var(IMAGE_ENV)
        .ok()
        .filter(|image| !image.is_empty())
        .unwrap_or_else(|| DEFAULT_IMAGE.to_owned())
}

/// True when [`KEEP_ENV`] asks to keep containers.
fn keep_containers() -> bool {
    matches!(std::env::var(KEEP_ENV).as_deref(), Ok("1" | "true" | "yes"))
}

fn docker_error(what: impl fmt::Display) -> impl FnOnce(DockerError) -> io::Error {
    move |err| io::Error::other(format!("docker: {what}: {err}"))
}

/// Bounds a Docker API call, so a hung daemon fails the test instead of
/// hanging it.
async fn bounded<T>(
    what: impl fmt::Display,
    call: impl Future<Output = Result<T, DockerError>>,
) -> io::Result<T> {
    match tokio::time::timeout(DOCKER_CALL_LIMIT, call).await {
        Ok(result) => result.map_err(docker_error(what)),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("docker: {what}: no answer within {DOCKER_CALL_LIMIT:?}"),
        )),
    }
}

/// A Docker client speaking the daemon's API version.
async fn connect() -> io::Result<Docker> {
    let docker = Docker::connect_with_local_defaults().map_err(|err| {
        io::Error::other(format!(
            "cannot reach the Docker daemon ({err}); the container test kit needs Docker"
        ))
    })?;
    bounded(
        "negotiating the API version (is the Docker daemon running?)",
        docker.negotiate_version(),
    )
    .await
}

fn is_not_found(err: &DockerError) -> bool {
    matches!(
        err,
        DockerError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// Makes sure `image` is present locally, pulling it when it is not.
async fn ensure_image(docker: &Docker, image: &str) -> io::Result<()> {
    match docker.inspect_image(image).await {
        Ok(_) => return Ok(()),
        Err(err) if is_not_found(&err) => {}
        Err(err) => return Err(docker_error(format!("inspecting image {image}"))(err)),
    }
    let options = CreateImageOptionsBuilder::new().from_image(image).build();
    let pull = async {
        let mut progress = docker.create_image(Some(options), None, None);
        while let Some(step) = progress.next().await {
            step?;
        }
        Ok::<_, DockerError>(())
    };
    let failure = match tokio::time::timeout(PULL_LIMIT, pull).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(err)) => err.to_string(),
        Err(_) => format!("no progress within {PULL_LIMIT:?}"),
    };
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "the Redis image {image:?} is not available locally and could not be pulled \
             ({failure}). Without registry access, build one from the host's redis-server \
             with `bash docker/build-local-image.sh` and run the tests with \
             {IMAGE_ENV}=multilock-redis:local"
        ),
    ))
}

/// Runs a Docker job to completion on a thread and runtime of its own, with
/// a client of its own: for `Drop`, which cannot await, and may run on a
/// runtime that is shutting down or on a single-threaded one it must not
/// block on.
fn run_detached<F, Fut>(job: F)
where
    F: FnOnce(Docker) -> Fut + Send + 'static,
    Fut: Future<Output = io::Result<()>>,
{
    let worker = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move { job(connect().await?).await })
    });
    match worker.join() {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!(error = %err, "test kit cleanup failed"),
        Err(_) => tracing::warn!("test kit cleanup panicked"),
    }
}

/// A bridge network of the kit's own, with a subnet it chose, so that
/// containers keep their address across a partition and a restart.
struct Network {
    name: String,
    /// First address of the /27 subnet (`.0`); `.1` is the gateway.
    base: Ipv4Addr,
    next_host: AtomicU8,
    /// Cleared once removed by `rm`, so `Drop` does nothing.
    armed: bool,
}

/// Hosts of a /27 after the gateway: `.2` to `.30`.
const HOSTS_PER_NETWORK: u8 = 29;

impl Network {
    /// Creates a network on a free /27 in 172.24.0.0/13, trying random
    /// subnets until one does not overlap an existing network.
    async fn create(docker: &Docker) -> io::Result<Network> {
        let name = format!(
            "multilock-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        let mut last_error = String::new();
        for _ in 0..64 {
            let base = Ipv4Addr::new(
                172,
                rand::random_range(24..=31),
                rand::random::<u8>(),
                rand::random_range(0..8u8) * 32,
            );
            let [a, b, c, d] = base.octets();
            let request = NetworkCreateRequest {
                name: name.clone(),
                driver: Some("bridge".to_owned()),
                // No route out: the servers only talk to each other and to
                // the host.
                internal: Some(true),
                ipam: Some(Ipam {
                    config: Some(vec![IpamConfig {
                        subnet: Some(format!("{base}/27")),
                        gateway: Some(format!("{a}.{b}.{c}.{}", d + 1)),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                labels: Some(HashMap::from([(LABEL.to_owned(), "1".to_owned())])),
                ..Default::default()
            };
            match tokio::time::timeout(DOCKER_CALL_LIMIT, docker.create_network(request)).await {
                Ok(Ok(_)) => {
                    return Ok(Network {
                        name,
                        base,
                        next_host: AtomicU8::new(0),
                        armed: true,
                    });
                }
                // "Pool overlaps with other one on this address space":
                // someone has that subnet; pick another.
                Ok(Err(err)) if err.to_string().contains("overlap") => {
                    last_error = err.to_string();
                }
                Ok(Err(err)) => return Err(docker_error(format!("creating network {name}"))(err)),
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("docker: creating network {name}: no answer"),
                    ));
                }
            }
        }
        Err(io::Error::other(format!(
            "docker: no free subnet for network {name}: {last_error}"
        )))
    }

    /// The next free address of the network.
    fn next_ip(&self) -> io::Result<Ipv4Addr> {
        let host = self.next_host.fetch_add(1, Ordering::Relaxed);
        if host >= HOSTS_PER_NETWORK {
            return Err(io::Error::other(format!(
                "network {} is full ({HOSTS_PER_NETWORK} servers)",
                self.name
            )));
        }
        let [a, b, c, d] = self.base.octets();
        Ok(Ipv4Addr::new(a, b, c, d + 2 + host))
    }

    async fn remove(mut self, docker: &Docker) -> io::Result<()> {
        self.armed = false;
        if keep_containers() {
            tracing::info!(network = %self.name, "test kit keeps the network");
            return Ok(());
        }
        bounded(
            format!("removing network {}", self.name),
            docker.remove_network(&self.name),
        )
        .await
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if keep_containers() {
            tracing::info!(network = %self.name, "test kit keeps the network");
            return;
        }
        let name = self.name.clone();
        run_detached(move |docker| async move {
            bounded(
                format!("removing network {name}"),
                docker.remove_network(&name),
            )
            .await
        });
    }
}

/// A `redis-server` in a Docker container, removed when dropped (or kept,
/// with `MULTILOCK_KEEP_CONTAINERS=1`).
///
/// Started without persistence (`--save "" --appendonly no`), so a restart
/// comes back empty, as a master that lost its data. See the
/// [module docs](self) for what each fault does.
///
/// [`RedisContainer::rm`] removes it and reports errors; `Drop` is the
/// fallback and blocks the current thread for the few milliseconds the
/// removal takes (on a helper thread, so any runtime is fine).
pub struct RedisContainer {
    docker: Docker,
    /// Side A first; side B for two-sided servers.
    sides: Vec<Attachment>,
    name: String,
    /// `None` once removed.
    id: Option<String>,
    /// `redis-server` flags after the kit's own.
    flags: Vec<String>,
    killed: bool,
    paused: bool,
}

/// One of a container's networks and its fixed address there.
struct Attachment {
    network: Arc<Network>,
    ip: Ipv4Addr,
    /// Disconnected by a partition.
    cut: bool,
}

/// One of the two networks of a two-sided server
/// ([`RedisContainer::start_many_two_sided`]).
///
/// Side A is the one [`TestServer::url`] uses. Clients that reach the
/// servers through side B are not affected by a partition of side A, which
/// is how a test cuts one client off a majority of the servers while
/// another client still reaches them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The first network: [`TestServer::url`].
    A,
    /// The second network.
    B,
}

impl Side {
    fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }
}

impl RedisContainer {
    /// Starts a server in a container on a network of its own and waits
    /// until it answers PING.
    ///
    /// # Errors
    ///
    /// When Docker cannot be reached, the image is missing and cannot be
    /// pulled (the message says how to build a local one), or the server
    /// does not answer within 30 s.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future removes what it created so far (containers and
    /// networks); a container whose creation request was under way may be
    /// left behind, carrying the kit's label (see the module docs).
    pub async fn start() -> io::Result<RedisContainer> {
        Self::start_with_flags(&[]).await
    }

    /// As [`RedisContainer::start`], with extra `redis-server` flags (for
    /// example `["--maxmemory", "10mb"]`).
    ///
    /// # Errors
    ///
    /// As [`RedisContainer::start`].
    ///
    /// # Cancel safety
    ///
    /// As [`RedisContainer::start`].
    pub async fn start_with_flags(flags: &[&str]) -> io::Result<RedisContainer> {
        let docker = connect().await?;
        ensure_image(&docker, &image()).await?;
        let network = Arc::new(Network::create(&docker).await?);
        let flags = flags.iter().map(|f| (*f).to_owned()).collect();
        Self::launch(docker, vec![network], flags).await
    }

    /// Starts `n` servers concurrently, on one network (so they can reach
    /// each other, as the masters of one deployment).
    ///
    /// # Errors
    ///
    /// As [`RedisContainer::start`]; the servers already started are
    /// removed.
    ///
    /// # Cancel safety
    ///
    /// As [`RedisContainer::start`].
    pub async fn start_many(n: usize) -> io::Result<Vec<RedisContainer>> {
        let docker = connect().await?;
        ensure_image(&docker, &image()).await?;
        let network = Arc::new(Network::create(&docker).await?);
        futures::future::try_join_all(
            (0..n).map(|_| Self::launch(docker.clone(), vec![network.clone()], Vec::new())),
        )
        .await
    }

    /// Starts `n` servers concurrently, each on two networks shared by all
    /// of them: side A ([`TestServer::url`]) and side B
    /// ([`RedisContainer::url_from`]). [`RedisContainer::partition_side`]
    /// cuts one side only: clients on the other side still reach the
    /// server, as in a partition that isolates one client.
    ///
    /// # Errors
    ///
    /// As [`RedisContainer::start_many`].
    ///
    /// # Cancel safety
    ///
    /// As [`RedisContainer::start`].
    pub async fn start_many_two_sided(n: usize) -> io::Result<Vec<RedisContainer>> {
        let docker = connect().await?;
        ensure_image(&docker, &image()).await?;
        let side_a = Arc::new(Network::create(&docker).await?);
        let side_b = Arc::new(Network::create(&docker).await?);
        futures::future::try_join_all((0..n).map(|_| {
            Self::launch(
                docker.clone(),
                vec![side_a.clone(), side_b.clone()],
                Vec::new(),
            )
        }))
        .await
    }

    async fn launch(
        docker: Docker,
        networks: Vec<Arc<Network>>,
        flags: Vec<String>,
    ) -> io::Result<RedisContainer> {
        let sides = networks
            .into_iter()
            .map(|network| {
                Ok(Attachment {
                    ip: network.next_ip()?,
                    network,
                    cut: false,
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        let name = format!("{}-{}", sides[0].network.name, sides[0].ip.octets()[3]);
        let mut server = RedisContainer {
            docker,
            sides,
            name,
            id: None,
            flags,
            killed: false,
            paused: false,
        };
        server.create_and_run().await?;
        Ok(server)
    }

    fn endpoint(ip: Ipv4Addr) -> EndpointSettings {
        EndpointSettings {
            ipam_config: Some(EndpointIpamConfig {
                ipv4_address: Some(ip.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Creates the container at this server's address, starts it and waits
    /// for PING.
    async fn create_and_run(&mut self) -> io::Result<()> {
        let network = self.sides[0].network.name.clone();
        let mut cmd: Vec<String> = [
            "redis-server",
            "--port",
            &REDIS_PORT.to_string(),
            "--bind",
            "0.0.0.0",
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        cmd.extend(self.flags.iter().cloned());
        let endpoint = Self::endpoint(self.sides[0].ip);
        let body = ContainerCreateBody {
            image: Some(image()),
            cmd: Some(cmd),
            labels: Some(HashMap::from([(LABEL.to_owned(), "1".to_owned())])),
            host_config: Some(HostConfig {
                network_mode: Some(network.clone()),
                ..Default::default()
            }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(network, endpoint)])),
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::new()
            .name(&self.name)
            .build();
        let created = bounded(
            format!("creating container {}", self.name),
            self.docker.create_container(Some(options), body),
        )
        .await?;
        self.id = Some(created.id);
        // Docker before API 1.44 attaches one network at creation: the
        // others are connected before the start.
        for side in &self.sides[1..] {
            let request = NetworkConnectRequest {
                container: self.name.clone(),
                endpoint_config: Some(Self::endpoint(side.ip)),
            };
            bounded(
                format!("connecting {} to {}", self.name, side.network.name),
                self.docker.connect_network(&side.network.name, request),
            )
            .await?;
        }
        bounded(
            format!("starting container {}", self.name),
            self.docker
                .start_container(&self.name, None::<StartContainerOptions>),
        )
        .await?;
        self.killed = false;
        self.paused = false;
        for side in &mut self.sides {
            side.cut = false;
        }
        wait_until_ready(&self.url(), READY_LIMIT)
            .await
            .map_err(|err| io::Error::new(err.kind(), format!("container {}: {err}", self.name)))
    }

    /// The container's address on side A, the network [`TestServer::url`]
    /// uses.
    pub fn ip(&self) -> Ipv4Addr {
        self.sides[0].ip
    }

    /// `redis://ip:6379` through the given side.
    ///
    /// # Panics
    ///
    /// For [`Side::B`] of a server not started with
    /// [`RedisContainer::start_many_two_sided`] (or
    /// [`ReplicatedPair::start`]).
    pub fn url_from(&self, side: Side) -> String {
        let attachment = self.sides.get(side.index()).unwrap_or_else(|| {
            panic!(
                "container {} has no side B: start it with start_many_two_sided",
                self.name
            )
        });
        format!("redis://{}:{REDIS_PORT}", attachment.ip)
    }

    /// The port Redis listens on ([`REDIS_PORT`]).
    pub fn port(&self) -> u16 {
        REDIS_PORT
    }

    /// The container's name (also its network's name plus the host part
    /// of its address).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the server runs (it may be paused or partitioned).
    pub fn is_running(&self) -> bool {
        !self.killed
    }

    /// Whether the container is cut off any of its networks.
    pub fn is_partitioned(&self) -> bool {
        self.sides.iter().any(|side| side.cut)
    }

    /// Removes the container (and its network, when no other container of
    /// the kit uses it), reporting errors. Kept instead with
    /// `MULTILOCK_KEEP_CONTAINERS=1`.
    ///
    /// # Errors
    ///
    /// When Docker refuses the removal.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future still removes the container: its `Drop` does.
    pub async fn rm(mut self) -> io::Result<()> {
        let mut outcome = self.remove_container().await;
        for side in std::mem::take(&mut self.sides) {
            if let Some(network) = Arc::into_inner(side.network) {
                outcome = outcome.and(network.remove(&self.docker).await);
            }
        }
        outcome
    }

    async fn remove_container(&mut self) -> io::Result<()> {
        let Some(id) = self.id.take() else {
            return Ok(());
        };
        if keep_containers() {
            tracing::info!(container = %self.name, url = %self.url(), "test kit keeps the container");
            return Ok(());
        }
        let options = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(true)
            .build();
        bounded(
            format!("removing container {}", self.name),
            self.docker.remove_container(&id, Some(options)),
        )
        .await
    }

    fn container(&self) -> io::Result<&str> {
        self.id
            .as_deref()
            .ok_or_else(|| io::Error::other(format!("container {} was removed", self.name)))
    }

    fn running_container(&self) -> io::Result<&str> {
        if self.killed {
            return Err(io::Error::other(format!(
                "container {} is not running (killed)",
                self.name
            )));
        }
        self.container()
    }

    /// Waits until Docker reports the container stopped.
    async fn wait_stopped(&self) -> io::Result<()> {
        let poll = PollLimit::new(Duration::from_secs(10));
        loop {
            let state = bounded(
                format!("inspecting container {}", self.name),
                self.docker.inspect_container(&self.name, None),
            )
            .await?
            .state;
            if !state.and_then(|s| s.running).unwrap_or(false) {
                return Ok(());
            }
            poll.tick(|| format!("container {} still runs after SIGKILL", self.name))
                .await?;
        }
    }

    /// Runs one command against the server, for the kit's own checks.
    async fn command<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> io::Result<T> {
        let client = redis::Client::open(self.url()).map_err(io::Error::other)?;
        let run = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            cmd.query_async::<T>(&mut conn).await
        };
        match tokio::time::timeout(Duration::from_secs(5), run).await {
            Ok(result) => result.map_err(|err| io::Error::other(format!("{}: {err}", self.name))),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{}: no reply within 5 s", self.name),
            )),
        }
    }
}

impl TestServer for RedisContainer {
    async fn start() -> io::Result<Self> {
        RedisContainer::start().await
    }

    async fn start_many(n: usize) -> io::Result<Vec<Self>> {
        RedisContainer::start_many(n).await
    }

    async fn rm(self) -> io::Result<()> {
        RedisContainer::rm(self).await
    }

    fn url(&self) -> String {
        self.url_from(Side::A)
    }

    fn is_running(&self) -> bool {
        RedisContainer::is_running(self)
    }

    /// `docker kill` (unpausing first, as Docker requires): the data is
    /// lost; open connections close and new ones time out (the address no
    /// longer answers) until [`TestServer::restart`].
    async fn kill(&mut self) -> io::Result<()> {
        if self.killed {
            return Ok(());
        }
        let id = self.container()?.to_owned();
        if self.paused {
            self.unpause().await?;
        }
        let options = KillContainerOptionsBuilder::new().signal("SIGKILL").build();
        bounded(
            format!("killing container {}", self.name),
            self.docker.kill_container(&id, Some(options)),
        )
        .await?;
        self.killed = true;
        self.wait_stopped().await
    }

    async fn pause(&mut self) -> io::Result<()> {
        let id = self.running_container()?.to_owned();
        bounded(
            format!("pausing container {}", self.name),
            self.docker.pause_container(&id),
        )
        .await?;
        self.paused = true;
        Ok(())
    }

    async fn unpause(&mut self) -> io::Result<()> {
        let id = self.running_container()?.to_owned();
        bounded(
            format!("unpausing container {}", self.name),
            self.docker.unpause_container(&id),
        )
        .await?;
        self.paused = false;
        Ok(())
    }

    /// Removes the container and creates it again at the same address,
    /// connected and running, with no data. Returns once it answers PING.
    async fn restart(&mut self) -> io::Result<()> {
        self.remove_container_for_restart().await?;
        self.create_and_run().await
    }

    /// Disconnects the container from its network (both, for a two-sided
    /// server): packets to and from it are dropped, so requests time out;
    /// open connections survive and resume after [`TestServer::heal`].
    async fn partition(&mut self) -> io::Result<()> {
        for side in [Side::A, Side::B].into_iter().take(self.sides.len()) {
            self.partition_side(side).await?;
        }
        Ok(())
    }

    /// Connects the container to its networks again at the same addresses;
    /// when it runs and is not paused, returns once it answers PING.
    async fn heal(&mut self) -> io::Result<()> {
        for side in [Side::A, Side::B].into_iter().take(self.sides.len()) {
            self.heal_side(side).await?;
        }
        Ok(())
    }
}

impl RedisContainer {
    fn side(&self, side: Side) -> io::Result<&Attachment> {
        self.sides.get(side.index()).ok_or_else(|| {
            io::Error::other(format!(
                "container {} has no side B: start it with start_many_two_sided",
                self.name
            ))
        })
    }

    /// Disconnects the container from one side's network: clients on that
    /// side time out, clients on the other side still reach it.
    ///
    /// # Errors
    ///
    /// When the container was removed, has no such side, or Docker refuses.
    ///
    /// # Cancel safety
    ///
    /// One Docker request: if dropped, it may or may not have been applied.
    pub async fn partition_side(&mut self, side: Side) -> io::Result<()> {
        let attachment = self.side(side)?;
        if attachment.cut {
            return Ok(());
        }
        let network = attachment.network.name.clone();
        let request = NetworkDisconnectRequest {
            container: self.container()?.to_owned(),
            force: Some(true),
        };
        bounded(
            format!("disconnecting {} from {network}", self.name),
            self.docker.disconnect_network(&network, request),
        )
        .await?;
        self.sides[side.index()].cut = true;
        Ok(())
    }

    /// Undoes [`RedisContainer::partition_side`]: same address; when the
    /// server runs and is not paused, returns once it answers PING there.
    ///
    /// # Errors
    ///
    /// When the container was removed, has no such side, Docker refuses, or
    /// the server does not answer within 15 s.
    ///
    /// # Cancel safety
    ///
    /// One Docker request: if dropped, it may or may not have been applied.
    pub async fn heal_side(&mut self, side: Side) -> io::Result<()> {
        let attachment = self.side(side)?;
        if !attachment.cut {
            return Ok(());
        }
        let network = attachment.network.name.clone();
        let request = NetworkConnectRequest {
            container: self.container()?.to_owned(),
            endpoint_config: Some(Self::endpoint(attachment.ip)),
        };
        bounded(
            format!("connecting {} to {network}", self.name),
            self.docker.connect_network(&network, request),
        )
        .await?;
        self.sides[side.index()].cut = false;
        if self.killed || self.paused {
            return Ok(());
        }
        wait_until_ready(&self.url_from(side), HEAL_LIMIT).await
    }
    /// Removes the container but keeps its name, address and network for
    /// [`TestServer::restart`]. Unlike [`RedisContainer::rm`], this ignores
    /// `MULTILOCK_KEEP_CONTAINERS`: a restart needs the name free.
    async fn remove_container_for_restart(&mut self) -> io::Result<()> {
        let Some(id) = self.id.take() else {
            return Ok(());
        };
        let options = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(true)
            .build();
        bounded(
            format!("removing container {} for a restart", self.name),
            self.docker.remove_container(&id, Some(options)),
        )
        .await
    }
}

impl fmt::Debug for RedisContainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisContainer")
            .field("name", &self.name)
            .field("url", &self.url())
            .field("killed", &self.killed)
            .field("paused", &self.paused)
            .field("partitioned", &self.is_partitioned())
            .finish()
    }
}

impl Drop for RedisContainer {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        if keep_containers() {
            tracing::info!(container = %self.name, url = %self.url(), "test kit keeps the container");
            return;
        }
        let name = self.name.clone();
        run_detached(move |docker| async move {
            let options = RemoveContainerOptionsBuilder::new()
                .force(true)
                .v(true)
                .build();
            bounded(
                format!("removing container {name}"),
                docker.remove_container(&id, Some(options)),
            )
            .await
        });
        // The networks (a field) are dropped after this, each removed with
        // the last container that uses it.
    }
}

/// A primary with one asynchronous replica, without Sentinel: the test
/// plays the failover itself ([`ReplicatedPair::promote`]).
///
/// Both servers are two-sided: clients use side A ([`TestServer::url`]),
/// replication runs over side B (`--replicaof <primary's side B address>
/// 6379`). So [`ReplicatedPair::cut_link`] stops replication while clients
/// still reach both servers. The fields are public so tests can inject
/// other faults into either server.
#[derive(Debug)]
pub struct ReplicatedPair {
    /// The server clients write to.
    pub primary: RedisContainer,
    /// Replicates the primary until [`ReplicatedPair::cut_link`] or
    /// [`ReplicatedPair::promote`].
    pub replica: RedisContainer,
}

impl ReplicatedPair {
    /// Starts the primary, then the replica, and waits until replication
    /// is up (`master_link_status:up` on the replica) and the replica
    /// acknowledges writes ([`wait_replica_acks`](super::wait_replica_acks)).
    ///
    /// # Errors
    ///
    /// As [`RedisContainer::start`], or when the link does not come up, or
    /// the replica does not acknowledge a write, within 30 s each.
    ///
    /// # Cancel safety
    ///
    /// As [`RedisContainer::start`].
    pub async fn start() -> io::Result<ReplicatedPair> {
        let docker = connect().await?;
        ensure_image(&docker, &image()).await?;
        let clients = Arc::new(Network::create(&docker).await?);
        let replication = Arc::new(Network::create(&docker).await?);
        let networks = vec![clients, replication];
        // Sync a (re)connecting replica at once, not after the default
        // 5 s wait for more replicas.
        let primary_flags = vec!["--repl-diskless-sync-delay".to_owned(), "0".to_owned()];
        let primary =
            RedisContainer::launch(docker.clone(), networks.clone(), primary_flags).await?;
        let flags = vec![
            "--replicaof".to_owned(),
            primary.sides[Side::B.index()].ip.to_string(),
            REDIS_PORT.to_string(),
        ];
        let replica = RedisContainer::launch(docker, networks, flags).await?;
        let pair = ReplicatedPair { primary, replica };
        pair.wait_link_up(READY_LIMIT).await?;
        wait_replica_acks(&pair.primary.url(), READY_LIMIT).await?;
        Ok(pair)
    }

    /// Waits until the replica reports its link to the primary up.
    ///
    /// # Errors
    ///
    /// When it is not up within `limit`, or the replica does not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only polls.
    pub async fn wait_link_up(&self, limit: Duration) -> io::Result<()> {
        let poll = PollLimit::new(limit);
        while !self.link_is_up().await? {
            poll.tick(|| format!("replica {} not in sync", self.replica.name))
                .await?;
        }
        Ok(())
    }

    /// Whether the replica reports `master_link_status:up`.
    ///
    /// # Errors
    ///
    /// When the replica does not answer within 5 s.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn link_is_up(&self) -> io::Result<bool> {
        let info: String = self
            .replica
            .command(redis::cmd("INFO").arg("replication"))
            .await?;
        Ok(info.lines().any(|l| l.trim() == "master_link_status:up"))
    }

    /// Cuts the replication link (the replica leaves the replication
    /// network): writes to the primary no longer reach the replica, and
    /// clients still reach both.
    ///
    /// # Errors
    ///
    /// When Docker refuses.
    ///
    /// # Cancel safety
    ///
    /// One request: if dropped, it may or may not have been applied.
    pub async fn cut_link(&mut self) -> io::Result<()> {
        self.replica.partition_side(Side::B).await
    }

    /// Reconnects the replication link. If the primary still runs, the
    /// replica resynchronises from it.
    ///
    /// # Errors
    ///
    /// When Docker refuses.
    ///
    /// # Cancel safety
    ///
    /// One request: if dropped, it may or may not have been applied.
    pub async fn restore_link(&mut self) -> io::Result<()> {
        self.replica.heal_side(Side::B).await
    }

    /// The failover: `REPLICAOF NO ONE` on the replica, which becomes a
    /// writable master with the data it had received.
    ///
    /// # Errors
    ///
    /// When the replica does not answer.
    ///
    /// # Cancel safety
    ///
    /// One request: if dropped, it may or may not have been applied.
    pub async fn promote(&mut self) -> io::Result<()> {
        let _: String = self
            .replica
            .command(redis::cmd("REPLICAOF").arg("NO").arg("ONE"))
            .await?;
        Ok(())
    }

    /// Removes both containers and their networks.
    ///
    /// # Errors
    ///
    /// When Docker refuses a removal.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future still removes the containers: their `Drop` does.
    pub async fn rm(self) -> io::Result<()> {
        let replica = self.replica.rm().await;
        let primary = self.primary.rm().await;
        replica.and(primary)
    }
}
