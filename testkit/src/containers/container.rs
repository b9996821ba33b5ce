//! [`RedisContainer`]: one `redis-server` in a container, and its faults.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use testcontainers::bollard::Docker;
use testcontainers::bollard::models::{
    ContainerCreateBody, EndpointIpamConfig, EndpointSettings, HostConfig, NetworkConnectRequest,
    NetworkDisconnectRequest, NetworkingConfig,
};
use testcontainers::bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, StartContainerOptions,
};

use super::docker::{LABEL, bounded, connect, keep_containers, remove_container, run_detached};
use super::image::resolved;
use super::network::{Attachment, Network, Side};
use crate::command::wait_until_ready;
use crate::{PollLimit, TestServer};

/// The port Redis listens on inside each container.
pub const REDIS_PORT: u16 = 6379;
/// How long a server may take to answer its first PING.
const READY_LIMIT: Duration = Duration::from_secs(30);
/// How long a healed server may take to be reachable again (the host's
/// neighbour cache has to forget the failed lookups).
const HEAL_LIMIT: Duration = Duration::from_secs(15);

/// Why a container is removed: a test done with it
/// (`MULTILOCK_KEEP_CONTAINERS` may keep it), or a restart (which needs
/// the name free, whatever that variable says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Removal {
    Done,
    Restart,
}

/// A `redis-server` in a Docker container, removed when dropped (or kept,
/// with `MULTILOCK_KEEP_CONTAINERS=1`).
///
/// Started without persistence (`--save "" --appendonly no`), so a restart
/// comes back empty, as a master that lost its data. See the
/// [module docs](super) for what each fault does.
///
/// [`RedisContainer::rm`] removes it and reports errors; `Drop` is the
/// fallback and blocks the current thread for the few milliseconds the
/// removal takes (on a helper thread, so any runtime is fine).
pub struct RedisContainer {
    docker: Docker,
    /// The image it runs (a restart runs it again).
    image: String,
    /// Side A first; side B for two-sided servers.
    pub(super) sides: Vec<Attachment>,
    pub(super) name: String,
    /// `None` once removed.
    id: Option<String>,
    /// `redis-server` flags after the kit's own.
    flags: Vec<String>,
    killed: bool,
    paused: bool,
}

impl RedisContainer {
    /// Starts a server in a container on a network of its own and waits
    /// until it answers PING.
    ///
    /// # Errors
    ///
    /// When Docker cannot be reached, no image can be had (see
    /// [`redis_image`](super::redis_image); the message says why), or the
    /// server does not answer within 30 s.
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
        let image = resolved(&docker).await?;
        let network = Arc::new(Network::create(&docker).await?);
        let flags = flags.iter().map(|f| (*f).to_owned()).collect();
        Self::launch(docker, image.name(), vec![network], flags).await
    }

    /// Starts a server from the given image, whatever
    /// [`redis_image`](super::redis_image) says: for the kit's tests of
    /// the image itself.
    #[cfg(test)]
    pub(super) async fn start_image(image: &str) -> io::Result<RedisContainer> {
        let docker = connect().await?;
        let network = Arc::new(Network::create(&docker).await?);
        Self::launch(docker, image, vec![network], Vec::new()).await
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
        let image = resolved(&docker).await?;
        let network = Arc::new(Network::create(&docker).await?);
        futures::future::try_join_all((0..n).map(|_| {
            Self::launch(
                docker.clone(),
                image.name(),
                vec![network.clone()],
                Vec::new(),
            )
        }))
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
        let image = resolved(&docker).await?;
        let side_a = Arc::new(Network::create(&docker).await?);
        let side_b = Arc::new(Network::create(&docker).await?);
        futures::future::try_join_all((0..n).map(|_| {
            Self::launch(
                docker.clone(),
                image.name(),
                vec![side_a.clone(), side_b.clone()],
                Vec::new(),
            )
        }))
        .await
    }

    pub(super) async fn launch(
        docker: Docker,
        image: &str,
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
            image: image.to_owned(),
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
            image: Some(self.image.clone()),
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
    /// [`ReplicatedPair::start`](super::ReplicatedPair::start)).
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
        let mut outcome = self.remove(Removal::Done).await;
        for side in std::mem::take(&mut self.sides) {
            if let Some(network) = Arc::into_inner(side.network) {
                outcome = outcome.and(network.remove(&self.docker).await);
            }
        }
        outcome
    }

    /// Removes the container, for good ([`Removal::Done`], unless
    /// `MULTILOCK_KEEP_CONTAINERS` keeps it) or to replace it
    /// ([`Removal::Restart`]); nothing once removed.
    async fn remove(&mut self, why: Removal) -> io::Result<()> {
        match self.take_for_removal(why) {
            Some(id) => remove_container(&self.docker, &id, &self.name).await,
            None => Ok(()),
        }
    }

    /// Forgets the container's id and returns it when the container is to
    /// be removed: `None` when it was removed already, or is kept.
    fn take_for_removal(&mut self, why: Removal) -> Option<String> {
        let id = self.id.take()?;
        if why == Removal::Done && keep_containers() {
            tracing::info!(container = %self.name, url = %self.url(), "test kit keeps the container");
            return None;
        }
        Some(id)
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
        self.remove(Removal::Restart).await?;
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
}

impl fmt::Debug for RedisContainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisContainer")
            .field("name", &self.name)
            .field("image", &self.image)
            .field("url", &self.url())
            .field("killed", &self.killed)
            .field("paused", &self.paused)
            .field("partitioned", &self.is_partitioned())
            .finish()
    }
}

impl Drop for RedisContainer {
    fn drop(&mut self) {
        if let Some(id) = self.take_for_removal(Removal::Done) {
            let name = self.name.clone();
            run_detached(move |docker| async move { remove_container(&docker, &id, &name).await });
        }
        // The networks (a field) are dropped after this, each removed with
        // the last container that uses it.
    }
}
