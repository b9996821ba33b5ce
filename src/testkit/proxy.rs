//! A TCP proxy in front of a server that can make connections vanish
//! without a trace, as a NAT that forgot them or a black-holed route does:
//! no FIN, no RST, bytes simply stop arriving.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A proxy on a loopback port forwarding to a server, with two faults:
/// [`TcpProxy::drop_connections`] silently drops every open connection (a
/// NAT's idle timeout), and [`TcpProxy::black_hole`] does that and swallows
/// every new one too (a dropped route), until [`TcpProxy::restore`].
///
/// # Examples
///
/// ```no_run
/// use multilock::testkit::{RedisProcess, TcpProxy};
///
/// # async fn demo() -> std::io::Result<()> {
/// let server = RedisProcess::start().await?;
/// let proxy = TcpProxy::start(server.port()).await?;
/// let node = multilock::Node::new(&proxy.url()).unwrap();
/// proxy.drop_connections(); // open connections hang; new ones work
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TcpProxy {
    port: u16,
    state: Arc<ProxyState>,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Default)]
struct ProxyState {
    /// Connections opened before this generation are dropped.
    generation: AtomicU64,
    /// New connections are swallowed too.
    black_hole: AtomicBool,
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
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Every connection open now stops forwarding, both ways, for good;
    /// both ends keep their sockets open. New connections work.
    pub fn drop_connections(&self) {
        self.state.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// As [`TcpProxy::drop_connections`], and new connections are accepted
    /// but swallowed as well, until [`TcpProxy::restore`].
    pub fn black_hole(&self) {
        self.state.black_hole.store(true, Ordering::SeqCst);
        self.drop_connections();
    }

    /// New connections forward again. Connections dropped before stay dead.
    pub fn restore(&self) {
        self.state.black_hole.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, state: Arc<ProxyState>) {
    while let Ok((client, _)) = listener.accept().await {
        let state = state.clone();
        tokio::spawn(async move {
            let generation = state.generation.load(Ordering::SeqCst);
            if state.black_hole.load(Ordering::SeqCst) {
                swallow(client).await;
                return;
            }
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            forward(client, server, generation, state).await;
        });
    }
}

/// Reads and discards until the peer closes: a connection into nowhere.
async fn swallow(mut stream: TcpStream) {
    let mut sink = [0u8; 4096];
    while let Ok(n) = stream.read(&mut sink).await {
        if n == 0 {
            return;
        }
    }
}

/// Copies both ways while the connection's generation is current; after
/// that, keeps both sockets open and swallows whatever arrives.
async fn forward(client: TcpStream, server: TcpStream, generation: u64, state: Arc<ProxyState>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let live = |state: &ProxyState| state.generation.load(Ordering::SeqCst) == generation;
    let upstream = {
        let state = state.clone();
        async move {
            let mut buf = [0u8; 16 * 1024];
            loop {
                let n = match client_read.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if live(&state) && server_write.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let downstream = async move {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if live(&state) && client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Either side closing ends the connection (the other half is dropped).
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}
