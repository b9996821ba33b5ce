//! The proxy's shared state, and the tasks that accept and serve its
//! connections.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use super::delay_line::{self, Delay};
use super::{ConnectionId, ProxyConnection};

/// Indexes of the two directions' faults in [`ProxyState`].
pub(super) const TO_SERVER: usize = 0;
pub(super) const TO_CLIENT: usize = 1;

/// What a proxy shares with its connections' tasks: the faults to apply,
/// read again for every chunk, and the open connections.
#[derive(Debug, Default)]
pub(super) struct ProxyState {
    /// Connections opened before this generation are dropped.
    generation: AtomicU64,
    /// New connections are swallowed too.
    black_hole: AtomicBool,
    /// New connections from these peers are swallowed.
    refused_peers: Mutex<HashSet<IpAddr>>,
    /// Indexed by [`TO_SERVER`] and [`TO_CLIENT`].
    ways: [WayState; 2],
    next_id: AtomicU64,
    /// The open connections, each with the trigger that cuts it.
    connections: Mutex<BTreeMap<u64, Registered>>,
}

/// The faults of one direction.
#[derive(Debug, Default)]
struct WayState {
    delay: Mutex<Delay>,
    holed: AtomicBool,
    /// Counts the black holes opened: a chunk delayed across one is lost,
    /// as packets in flight on a cut route are.
    holes: AtomicU64,
}

#[derive(Debug)]
struct Registered {
    peer: SocketAddr,
    opened: Instant,
    cut: oneshot::Sender<()>,
}

impl ProxyState {
    pub(super) fn drop_connections(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn black_hole(&self) {
        self.black_hole.store(true, Ordering::SeqCst);
        self.drop_connections();
    }

    /// Swallows new connections from `ip` and cuts those open; returns
    /// how many were cut.
    pub(super) fn black_hole_peer(&self, ip: IpAddr) -> usize {
        self.refused_peers().insert(ip);
        let mut connections = self.connections();
        let from_peer: Vec<u64> = connections
            .iter()
            .filter(|(_, registered)| registered.peer.ip() == ip)
            .map(|(&id, _)| id)
            .collect();
        from_peer
            .into_iter()
            .filter_map(|id| connections.remove(&id)?.cut.send(()).ok())
            .count()
    }

    /// Serves new connections from `ip` again.
    pub(super) fn restore_peer(&self, ip: IpAddr) {
        self.refused_peers().remove(&ip);
    }

    pub(super) fn restore(&self) {
        self.black_hole.store(false, Ordering::SeqCst);
        self.refused_peers().clear();
        for way in &self.ways {
            way.holed.store(false, Ordering::SeqCst);
        }
    }

    pub(super) fn set_delay(&self, way: usize, delay: Delay) {
        *self.ways[way]
            .delay
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = delay;
    }

    pub(super) fn black_hole_way(&self, way: usize) {
        let way = &self.ways[way];
        // Counted before the flag is set: see `pump`.
        way.holes.fetch_add(1, Ordering::SeqCst);
        way.holed.store(true, Ordering::SeqCst);
    }

    pub(super) fn list(&self) -> Vec<ProxyConnection> {
        self.connections()
            .iter()
            .map(|(&id, registered)| ProxyConnection {
                id: ConnectionId(id),
                peer: registered.peer,
                opened: registered.opened,
            })
            .collect()
    }

    pub(super) fn cut(&self, id: ConnectionId) -> bool {
        let registered = self.connections().remove(&id.0);
        registered.is_some_and(|registered| registered.cut.send(()).is_ok())
    }

    pub(super) fn cut_all(&self) -> usize {
        // Taken out first: each connection cut locks the map to deregister.
        let all = std::mem::take(&mut *self.connections());
        all.into_values()
            .filter_map(|registered| registered.cut.send(()).ok())
            .count()
    }

    fn live(&self, generation: u64) -> bool {
        self.generation.load(Ordering::SeqCst) == generation
    }

    fn refuses(&self, peer: SocketAddr) -> bool {
        self.black_hole.load(Ordering::SeqCst) || self.refused_peers().contains(&peer.ip())
    }

    fn refused_peers(&self) -> MutexGuard<'_, HashSet<IpAddr>> {
        // Nothing panics while holding it.
        self.refused_peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn connections(&self) -> MutexGuard<'_, BTreeMap<u64, Registered>> {
        // Nothing panics while holding it.
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl WayState {
    fn delay(&self) -> Delay {
        *self.delay.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(super) async fn accept_loop(listener: TcpListener, target: SocketAddr, state: Arc<ProxyState>) {
    while let Ok((client, peer)) = listener.accept().await {
        // Registered before any byte is forwarded: a client that got a reply
        // finds its connection listed.
        let id = state.next_id.fetch_add(1, Ordering::SeqCst);
        let (cut, cut_rx) = oneshot::channel();
        let opened = Instant::now();
        state
            .connections()
            .insert(id, Registered { peer, opened, cut });
        let registration = Registration {
            state: state.clone(),
            id,
        };
        tokio::spawn(connection(client, peer, target, registration, cut_rx));
    }
}

/// Deregisters its connection when the connection's task ends.
struct Registration {
    state: Arc<ProxyState>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.state.connections().remove(&self.id);
    }
}

/// Serves one accepted connection until either side closes it or it is cut.
async fn connection(
    mut client: TcpStream,
    peer: SocketAddr,
    target: SocketAddr,
    registration: Registration,
    mut cut: oneshot::Receiver<()>,
) {
    let state = &*registration.state;
    let generation = state.generation.load(Ordering::SeqCst);
    let mut server = None;
    let was_cut = if state.refuses(peer) {
        tokio::select! {
            biased;
            Ok(()) = &mut cut => true,
            () = swallow(&mut client) => false,
        }
    } else {
        tokio::select! {
            biased;
            Ok(()) = &mut cut => true,
            connected = TcpStream::connect(target) => match connected {
                Ok(stream) => {
                    // A network path, not a sender: bytes leave when they
                    // are due, never held back by Nagle's algorithm.
                    let _ = client.set_nodelay(true);
                    let _ = stream.set_nodelay(true);
                    let server = server.insert(stream);
                    tokio::select! {
                        biased;
                        Ok(()) = &mut cut => true,
                        () = forward(&mut client, server, generation, state) => false,
                    }
                }
                Err(_) => false,
            },
        }
    };
    if was_cut {
        reset(&client);
        if let Some(server) = &server {
            reset(server);
        }
    }
}

/// Makes closing `stream` send a reset rather than a FIN.
fn reset(stream: &TcpStream) {
    // `set_zero_linger` needs tokio 1.50, the crate allows 1.47; a zero
    // linger never blocks on drop, which is what the deprecation is about.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// Reads and discards until the peer closes: a connection into nowhere.
async fn swallow(stream: &mut TcpStream) {
    let mut sink = [0u8; 4096];
    while let Ok(n) = stream.read(&mut sink).await {
        if n == 0 {
            return;
        }
    }
}

/// Copies both ways while the connection's generation is current; after
/// that, keeps both sockets open and swallows whatever arrives.
async fn forward(
    client: &mut TcpStream,
    server: &mut TcpStream,
    generation: u64,
    state: &ProxyState,
) {
    let (client_read, client_write) = client.split();
    let (server_read, server_write) = server.split();
    // Either side closing ends the connection (the other half is dropped).
    tokio::select! {
        () = pump(client_read, server_write, TO_SERVER, generation, state) => {}
        () = pump(server_read, client_write, TO_CLIENT, generation, state) => {}
    }
}

/// A chunk back from the delay line.
struct Delayed {
    bytes: Vec<u8>,
    /// [`WayState::holes`] when it was read.
    holes: u64,
}

/// Copies one direction, applying its faults to each chunk read: dropped
/// (stale generation), swallowed (black hole), delayed, or written at once.
/// Returns when the source closes, once the chunks it sent before are
/// delivered, or when the sink fails.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    way: usize,
    generation: u64,
    state: &ProxyState,
) {
    let faults = &state.ways[way];
    let (delayed_tx, mut delayed) = mpsc::unbounded_channel::<Delayed>();
    let mut buf = [0u8; 16 * 1024];
    // Chunks in the delay line, and the due time of the last one sent.
    let mut in_line = 0usize;
    let mut last_due = Instant::now();
    let mut closed = false;
    loop {
        tokio::select! {
            biased;
            Some(chunk) = delayed.recv() => {
                in_line -= 1;
                let passes = state.live(generation)
                    && faults.holes.load(Ordering::SeqCst) == chunk.holes;
                if passes && to.write_all(&chunk.bytes).await.is_err() {
                    return;
                }
                if closed && in_line == 0 {
                    return;
                }
            }
            read = from.read(&mut buf), if !closed => {
                let n = match read {
                    Ok(0) | Err(_) if in_line == 0 => return,
                    Ok(0) | Err(_) => {
                        closed = true;
                        continue;
                    }
                    Ok(n) => n,
                };
                // Read before the flag, which a hole sets after counting.
                let holes = faults.holes.load(Ordering::SeqCst);
                if !state.live(generation) || faults.holed.load(Ordering::SeqCst) {
                    continue;
                }
                let delay = faults.delay();
                // Nothing delayed ahead of it: the fast path of old.
                if delay.is_none() && in_line == 0 {
                    if to.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    continue;
                }
                // Never before the previous chunk: jitter keeps byte order.
                let due = (Instant::now() + delay.sample()).max(last_due);
                last_due = due;
                in_line += 1;
                let chunk = Delayed {
                    bytes: buf[..n].to_vec(),
                    holes,
                };
                let tx = delayed_tx.clone();
                delay_line::schedule(due, move || {
                    // The connection may be gone: the chunk with it.
                    let _ = tx.send(chunk);
                });
            }
        }
    }
}
