//! A cluster whose bus runs through proxies, so that one node can be cut
//! off from the others while clients still reach it: a primary on the
//! minority side of a partition, which keeps claiming its slots.

use std::io;
use std::net::{IpAddr, Ipv4Addr};

use super::{RedisCluster, ask};
use crate::{RedisProcess, TcpProxy, TestServer};

impl RedisCluster {
    /// As [`RedisCluster::start`], with each node's cluster bus behind a
    /// [`TcpProxy`] of its own (the node announces the proxy's port) and
    /// each node's outgoing bus connections from an address of its own
    /// (`bind-source-addr 127.0.0.<11 + node>`), so that
    /// [`RedisCluster::isolate`] can cut one node off the bus.
    ///
    /// # Cancel safety
    /// Dropping the future kills the nodes already started.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use multilock_testkit::RedisCluster;
    ///
    /// # async fn demo() -> std::io::Result<()> {
    /// let mut cluster = RedisCluster::start_with_bus_proxies().await?;
    /// cluster.isolate(0); // node 0 is on the minority side
    /// cluster.wait_until_healthy().await?; // the others replaced it
    /// cluster.heal(0);
    /// # Ok(()) }
    /// ```
    pub async fn start_with_bus_proxies() -> io::Result<RedisCluster> {
        RedisCluster::start_with(true).await
    }

    /// Cuts node `node` off the cluster bus, both ways: its own bus proxy
    /// swallows the connections from every other node, and every other
    /// node's swallows those from it. Clients still reach it; it still
    /// claims what it served, and the others, after the node timeout
    /// (1 s), fail it over. The kit's checks
    /// ([`RedisCluster::wait_until_healthy`], ...) then leave it out, as a
    /// paused node, until [`RedisCluster::heal`].
    ///
    /// # Panics
    /// When the cluster was not started with
    /// [`RedisCluster::start_with_bus_proxies`].
    pub fn isolate(&mut self, node: usize) {
        assert!(!self.bus.is_empty(), "isolate needs start_with_bus_proxies");
        for other in (0..self.bus.len()).filter(|&other| other != node) {
            self.bus[node].black_hole_peer(source_ip(other));
            self.bus[other].black_hole_peer(source_ip(node));
        }
        self.nodes[node].isolated = true;
    }

    /// Joins node `node` to the bus again (to every node not isolated
    /// itself): it learns what changed while it was away (a replaced
    /// primary becomes a replica).
    ///
    /// # Panics
    /// As [`RedisCluster::isolate`].
    pub fn heal(&mut self, node: usize) {
        assert!(!self.bus.is_empty(), "heal needs start_with_bus_proxies");
        self.nodes[node].isolated = false;
        for other in (0..self.bus.len()).filter(|&other| other != node) {
            if !self.nodes[other].isolated {
                self.bus[node].restore_peer(source_ip(other));
                self.bus[other].restore_peer(source_ip(node));
            }
        }
    }
}

/// The address node `index`'s outgoing bus connections come from.
fn source_ip(index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 11 + index as u8))
}

/// Puts a proxy in front of `process`'s cluster bus port.
pub(super) async fn proxy_bus(process: &RedisProcess) -> io::Result<TcpProxy> {
    TcpProxy::start(bus_port(&process.url()).await?).await
}

/// The cluster bus port of the node at `url` (`cluster-port`; Redis 6.2
/// has none and listens on the default, port + 10000).
pub(super) async fn bus_port(url: &str) -> io::Result<u16> {
    let bus: Vec<String> = ask(url, &["CONFIG", "GET", "cluster-port"]).await?;
    let port = match bus.get(1) {
        Some(port) if port != "0" => port.parse().ok(),
        _ => url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok()?.checked_add(10000)),
    };
    port.ok_or_else(|| io::Error::other(format!("{url}: no cluster-port")))
}

/// Has node `index` announce its bus proxy and send from its own address;
/// set again after a restart (a `CONFIG SET` does not outlive the process).
pub(super) async fn announce_proxy(url: &str, index: usize, proxy: &TcpProxy) -> io::Result<()> {
    let settings = [
        ("bind-source-addr", source_ip(index).to_string()),
        ("cluster-announce-ip", "127.0.0.1".to_owned()),
        ("cluster-announce-bus-port", proxy.port().to_string()),
    ];
    for (name, value) in settings {
        ask::<()>(url, &["CONFIG", "SET", name, &value]).await?;
    }
    Ok(())
}
