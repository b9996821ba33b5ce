//! The kit's private bridge networks, the sides of a two-sided server, and
//! their cleanup.

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use testcontainers::bollard::Docker;
use testcontainers::bollard::models::{Ipam, IpamConfig, NetworkCreateRequest};

use super::docker::{
    DOCKER_CALL_LIMIT, LABEL, docker_error, keep_containers, remove_network, run_detached,
};

/// A bridge network of the kit's own, with a subnet it chose, so that
/// containers keep their address across a partition and a restart.
pub(super) struct Network {
    pub(super) name: String,
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
    pub(super) async fn create(docker: &Docker) -> io::Result<Network> {
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
    pub(super) fn next_ip(&self) -> io::Result<Ipv4Addr> {
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

    /// Removes the network (unless `MULTILOCK_KEEP_CONTAINERS` keeps it);
    /// `Drop` then does nothing.
    pub(super) async fn remove(mut self, docker: &Docker) -> io::Result<()> {
        if self.disarm() {
            remove_network(docker, &self.name).await
        } else {
            Ok(())
        }
    }

    /// Whether the network is still to be removed; from now on `Drop` does
    /// nothing.
    fn disarm(&mut self) -> bool {
        if !std::mem::replace(&mut self.armed, false) {
            return false;
        }
        if keep_containers() {
            tracing::info!(network = %self.name, "test kit keeps the network");
            return false;
        }
        true
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if self.disarm() {
            let name = self.name.clone();
            run_detached(move |docker| async move { remove_network(&docker, &name).await });
        }
    }
}

/// One of a container's networks and its fixed address there.
pub(super) struct Attachment {
    pub(super) network: Arc<Network>,
    pub(super) ip: Ipv4Addr,
    /// Disconnected by a partition.
    pub(super) cut: bool,
}

/// One of the two networks of a two-sided server
/// ([`RedisContainer::start_many_two_sided`](super::RedisContainer::start_many_two_sided)).
///
/// Side A is the one [`TestServer::url`](crate::TestServer::url)
/// uses. Clients that reach the servers through side B are not affected by
/// a partition of side A, which is how a test cuts one client off a
/// majority of the servers while another client still reaches them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The first network: [`TestServer::url`](crate::TestServer::url).
    A,
    /// The second network.
    B,
}

impl Side {
    pub(super) fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }
}
