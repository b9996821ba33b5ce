//! A TCP proxy in front of a server that injects network faults: it makes
//! connections vanish without a trace, as a NAT that forgot them or a
//! black-holed route does (no FIN, no RST, bytes simply stop arriving),
//! delays bytes per direction, swallows one direction, and cuts chosen
//! connections.

mod connection;
mod delay_line;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;

use connection::{ProxyState, TO_CLIENT, TO_SERVER, accept_loop};
pub use delay_line::Delay;

/// A proxy on a loopback port forwarding to a server, with faults:
///
/// - [`TcpProxy::drop_connections`] silently drops every open connection (a
///   NAT's idle timeout), and [`TcpProxy::black_hole`] does that and
///   swallows every new one too (a dropped route), until
///   [`TcpProxy::restore`];
/// - [`TcpProxy::set_delay`] adds latency, fixed or jittered, per
///   [`Direction`]: each chunk leaves within tens of microseconds of its
///   due time where Linux lets the delay line set a 1 ns timer slack, and
///   within about 0.1 ms otherwise;
/// - [`TcpProxy::black_hole_direction`] swallows one direction only (a
///   request applied whose reply never comes, say);
/// - [`TcpProxy::cut`] and [`TcpProxy::cut_all`] close connections
///   abruptly, listed by [`TcpProxy::connections`];
/// - [`TcpProxy::black_hole_peer`] cuts one peer off, by its address, until
///   [`TcpProxy::restore_peer`].
///
/// Every fault applies to the connections open at the time and to new ones.
///
/// To partition one client from one node, give each client its own proxy
/// in front of that node and fault only that client's proxy: the other
/// clients, through their own proxies, still reach the node.
///
/// # Examples
///
/// ```no_run
/// use multilock_testkit::{RedisProcess, TcpProxy};
///
/// # async fn demo() -> std::io::Result<()> {
/// let server = RedisProcess::start().await?;
/// let proxy = TcpProxy::start(server.port()).await?;
/// let node = multilock::Node::new(&proxy.url()).unwrap();
/// proxy.drop_connections(); // open connections hang; new ones work
/// # Ok(()) }
/// ```
///
/// One client partitioned from a node that another client still reaches:
///
/// ```no_run
/// use multilock_testkit::{Direction, RedisProcess, TcpProxy};
///
/// # async fn demo() -> std::io::Result<()> {
/// let server = RedisProcess::start().await?;
/// let to_a = TcpProxy::start(server.port()).await?;
/// let to_b = TcpProxy::start(server.port()).await?;
/// let node_for_a = multilock::Node::new(&to_a.url()).unwrap();
/// let node_for_b = multilock::Node::new(&to_b.url()).unwrap();
/// to_a.black_hole_direction(Direction::Both); // a is cut off, b is not
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TcpProxy {
    port: u16,
    state: Arc<ProxyState>,
    accept: tokio::task::JoinHandle<()>,
}

/// Which way bytes travel through a [`TcpProxy`].
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use multilock_testkit::{Delay, Direction, TcpProxy};
///
/// # fn demo(proxy: &TcpProxy) {
/// proxy.set_delay(Direction::ToServer, Delay::fixed(Duration::from_micros(500)));
/// proxy.black_hole_direction(Direction::ToClient);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the client to the server: requests.
    ToServer,
    /// From the server to the client: replies and pushed messages.
    ToClient,
    /// Both ways.
    Both,
}

impl Direction {
    /// The indexes into the proxy's per-direction faults.
    fn ways(self) -> &'static [usize] {
        match self {
            Direction::ToServer => &[TO_SERVER],
            Direction::ToClient => &[TO_CLIENT],
            Direction::Both => &[TO_SERVER, TO_CLIENT],
        }
    }
}

/// Names one connection through a [`TcpProxy`], for [`TcpProxy::cut`].
/// Ids grow in the order the proxy accepted the connections and are never
/// reused.
///
/// # Examples
///
/// ```no_run
/// use multilock_testkit::TcpProxy;
///
/// # fn demo(proxy: &TcpProxy) {
/// if let Some(newest) = proxy.connections().iter().map(|c| c.id()).max() {
///     proxy.cut(newest);
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnectionId(u64);

impl fmt::Display for ConnectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// A connection open through a [`TcpProxy`], as [`TcpProxy::connections`]
/// lists it.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use multilock_testkit::TcpProxy;
///
/// # fn demo(proxy: &TcpProxy) {
/// for conn in proxy.connections() {
///     if conn.opened().elapsed() > Duration::from_secs(1) {
///         proxy.cut(conn.id()); // only the old ones
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyConnection {
    id: ConnectionId,
    peer: SocketAddr,
    opened: Instant,
}

impl ProxyConnection {
    /// The id to [`TcpProxy::cut`] it by.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// let ids: Vec<_> = proxy.connections().iter().map(|c| c.id()).collect();
    /// # }
    /// ```
    pub fn id(&self) -> ConnectionId {
        self.id
    }

    /// The client's address, as the proxy accepted it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// let ports: Vec<u16> = proxy.connections().iter().map(|c| c.peer().port()).collect();
    /// # }
    /// ```
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// When the proxy accepted it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// let oldest = proxy.connections().iter().map(|c| c.opened()).min();
    /// # }
    /// ```
    pub fn opened(&self) -> Instant {
        self.opened
    }
}

impl TcpProxy {
    /// Starts a proxy on a free loopback port to the server on loopback
    /// `target_port`.
    ///
    /// # Errors
    ///
    /// When no port can be bound.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is started before the port is bound.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use multilock_testkit::{RedisProcess, TcpProxy};
    ///
    /// # async fn demo() -> std::io::Result<()> {
    /// let server = RedisProcess::start().await?;
    /// let proxy = TcpProxy::start(server.port()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn start(target_port: u16) -> io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let target = SocketAddr::from(([127, 0, 0, 1], target_port));
        let state = Arc::new(ProxyState::default());
        let accept = tokio::spawn(accept_loop(listener, target, state.clone()));
        Ok(TcpProxy {
            port,
            state,
            accept,
        })
    }

    /// `redis://127.0.0.1:<port>`: the server through the proxy.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// let node = multilock::Node::new(&proxy.url()).unwrap();
    /// # }
    /// ```
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The proxy's port.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// let addr = std::net::SocketAddr::from(([127, 0, 0, 1], proxy.port()));
    /// # }
    /// ```
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Every connection open now stops forwarding, both ways, for good;
    /// both ends keep their sockets open. New connections work.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// proxy.drop_connections(); // a NAT forgot them
    /// # }
    /// ```
    pub fn drop_connections(&self) {
        self.state.drop_connections();
    }

    /// As [`TcpProxy::drop_connections`], and new connections are accepted
    /// but swallowed as well, until [`TcpProxy::restore`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// proxy.black_hole(); // the route is gone
    /// # }
    /// ```
    pub fn black_hole(&self) {
        self.state.black_hole();
    }

    /// Cuts the open connections from `ip` ([`TcpProxy::cut`]) and swallows
    /// new ones from it, until [`TcpProxy::restore`]; other peers are
    /// served as before. Returns how many were cut. Peers are told apart by
    /// their source address: on loopback, any of `127.0.0.0/8` (Redis's
    /// `bind-source-addr` sets a server's).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::net::{IpAddr, Ipv4Addr};
    ///
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// proxy.black_hole_peer(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 12)));
    /// proxy.restore();
    /// # }
    /// ```
    pub fn black_hole_peer(&self, ip: std::net::IpAddr) -> usize {
        self.state.black_hole_peer(ip)
    }

    /// New connections from `ip` forward again, undoing
    /// [`TcpProxy::black_hole_peer`] for that peer alone (connections cut
    /// stay cut).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::net::{IpAddr, Ipv4Addr};
    ///
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// let peer = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 12));
    /// proxy.black_hole_peer(peer);
    /// proxy.restore_peer(peer);
    /// # }
    /// ```
    pub fn restore_peer(&self, ip: std::net::IpAddr) {
        self.state.restore_peer(ip);
    }

    /// New connections forward again (from every peer), and directions black-holed by
    /// [`TcpProxy::black_hole_direction`] forward again on every
    /// connection. Connections dropped before stay dead, bytes swallowed
    /// are lost, and delays stay as set.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// proxy.black_hole();
    /// proxy.restore(); // new connections work again
    /// # }
    /// ```
    pub fn restore(&self) {
        self.state.restore();
    }

    /// Delays the bytes going `direction` by `delay`, on the connections
    /// open now (bytes already delayed keep their due time) and on new
    /// ones, until set again; [`Delay::NONE`] forwards at once again.
    /// Delays are timed by one OS thread shared by every proxy, not by
    /// tokio's millisecond timer: a chunk arrives some 20 µs after it is
    /// due, so 0.2 ms means 0.2 ms.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use multilock_testkit::{Delay, Direction, TcpProxy};
    ///
    /// # fn demo(proxy: &TcpProxy) {
    /// // A 1 ms round trip.
    /// proxy.set_delay(Direction::Both, Delay::fixed(Duration::from_micros(500)));
    /// # }
    /// ```
    pub fn set_delay(&self, direction: Direction, delay: Delay) {
        for &way in direction.ways() {
            self.state.set_delay(way, delay);
        }
    }

    /// Swallows the bytes going `direction` on every open and new
    /// connection, until [`TcpProxy::restore`]: the sockets stay open and
    /// nothing arrives. Bytes swallowed, and bytes still delayed when the
    /// hole opens, are lost. Black-holing [`Direction::ToClient`] lets
    /// requests be applied whose replies never come.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use multilock_testkit::{Direction, TcpProxy};
    ///
    /// # fn demo(proxy: &TcpProxy) {
    /// proxy.black_hole_direction(Direction::ToClient); // applied, unanswered
    /// proxy.restore();
    /// # }
    /// ```
    pub fn black_hole_direction(&self, direction: Direction) {
        for &way in direction.ways() {
            self.state.black_hole_way(way);
        }
    }

    /// The connections open through the proxy, oldest first: also those
    /// dropped or swallowed silently, whose sockets are still open.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// assert_eq!(proxy.connections().len(), 1);
    /// # }
    /// ```
    pub fn connections(&self) -> Vec<ProxyConnection> {
        self.state.list()
    }

    /// Closes both sockets of connection `id` abruptly (a TCP reset): the
    /// client's reads and writes fail, and bytes still delayed are lost.
    /// Unlike [`TcpProxy::drop_connections`], the client notices. Returns
    /// whether the connection was open.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// let first = proxy.connections()[0].id();
    /// assert!(proxy.cut(first));
    /// # }
    /// ```
    pub fn cut(&self, id: ConnectionId) -> bool {
        self.state.cut(id)
    }

    /// [`TcpProxy::cut`]s every open connection; returns how many.
    /// New connections work.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(proxy: &multilock_testkit::TcpProxy) {
    /// let cut = proxy.cut_all(); // a server restart, as clients see it
    /// # }
    /// ```
    pub fn cut_all(&self) -> usize {
        self.state.cut_all()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
