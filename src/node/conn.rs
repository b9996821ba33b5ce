//! How a request gets a connection of its node, and runs on it.
//!
//! Requests share multiplexed connections, pipelined: one by default (the
//! server reads and answers the most requests per read and write), more if
//! the node was built with more (`NodeBuilder::shared_connections`), at
//! most the pool size, each a pooled object kept out of the pool while it
//! is usable. A checkout clones one, with no I/O,
//! lock wait or await; the pool is asked only to make or replace one, and
//! for the requests that need a connection to themselves (a replica-sync
//! `WAIT`). A lock's requests keep to one shared connection ([`Lane`]), so
//! they reach the server in the order they left.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool::managed::{PoolError, TimeoutType};
use redis::Value;

use super::coalesce::Pipe;
use super::{Node, pool};
#[cfg(feature = "cluster")]
#[path = "redirect.rs"]
mod redirect;
use crate::error::{Error, Result, Unavailable};
use crate::protocol::{Call, Request};

impl Node {
    /// Runs one protocol call about the lock of `lane` on a shared
    /// connection: one round trip (a script goes by EVALSHA and is loaded on
    /// the first NOSCRIPT). Fails at once, with nothing sent, while the node
    /// (a Cluster node: the lock's shard) is suspect.
    pub(crate) async fn run<R>(&self, lane: Lane, call: &Call<R>) -> Result<R> {
        self.checkout(lane).await?.run(call).await
    }

    /// As [`Node::run`], even while the node is suspect: for the watchdog's
    /// renewals, one request per node (a Cluster node: per slot) and tick,
    /// whose outcome says whether the holds there can still be proven.
    pub(crate) async fn run_despite_suspicion<R>(&self, lane: Lane, call: &Call<R>) -> Result<R> {
        let mut conn = match self.cluster_map() {
            None => self.checkout_shared(None).await?,
            Some(_) => Box::pin(self.checkout_in_cluster(lane, Kind::DespiteSuspicion)).await?,
        };
        conn.run(call).await
    }

    /// A connection for one request about the lock of `lane`, shared with
    /// concurrent requests (pipelined): a clone of the node's shared
    /// connection for that lane, taken without I/O, lock wait or await. The
    /// pool is asked only when that one is missing or unusable (the first
    /// requests, or it broke). A Cluster node gives its lock's shard's.
    pub(crate) async fn checkout(&self, lane: Lane) -> Result<Conn> {
        if self.cluster_map().is_some() {
            return Box::pin(self.checkout_in_cluster(lane, Kind::Shared)).await;
        }
        self.refuse_if_suspect().await?;
        self.checkout_shared(Some(lane)).await
    }

    /// A shared connection about no lock in particular (each in turn),
    /// refused while the node is suspect. A broken one is replaced on the
    /// way, and the new connection reports the server's `run_id`. A Cluster
    /// node asks for its slot map, and checks out one of each shard's.
    pub(crate) async fn checkout_any(&self) -> Result<()> {
        #[cfg(feature = "cluster")]
        if let Some(map) = self.cluster_map() {
            map.refresh().await?;
            for shard in map.shard_nodes() {
                Box::pin(shard.checkout_any()).await?;
            }
            return Ok(());
        }
        self.refuse_if_suspect().await?;
        self.checkout_shared(None).await.map(drop)
    }

    /// A shared connection of this very server about no lock in particular
    /// (each in turn): for a scan of its keys.
    pub(crate) async fn checkout_any_conn(&self) -> Result<Conn> {
        self.checkout_shared(None).await
    }

    /// A connection nobody else is given until this one is dropped: for a
    /// request that blocks its connection (`WAIT`), about the lock of
    /// `lane` (a Cluster node's is to that lock's shard, so the `WAIT`
    /// follows the grant on the connection that sent it).
    pub(crate) async fn checkout_exclusive(&self, lane: Lane) -> Result<Conn> {
        if self.cluster_map().is_some() {
            return Box::pin(self.checkout_in_cluster(lane, Kind::Exclusive)).await;
        }
        self.refuse_if_suspect().await?;
        // Boxed, as in `checkout_shared`.
        Box::pin(self.exclusive_from_pool()).await
    }

    /// A connection of the shard serving `lane`'s slot, which follows that
    /// lock's redirects.
    async fn checkout_in_cluster(&self, lane: Lane, kind: Kind) -> Result<Conn> {
        let shard = self.shard_of(lane).await?;
        let mut conn = match kind {
            Kind::Shared => shard.checkout(lane).await?,
            Kind::Exclusive => shard.checkout_exclusive(lane).await?,
            Kind::DespiteSuspicion => shard.checkout_shared(Some(lane)).await?,
        };
        conn.route = Some((lane, kind));
        Ok(conn)
    }

    /// The node serving `lane`'s lock: a Cluster node's shard.
    #[cfg(feature = "cluster")]
    async fn shard_of(&self, lane: Lane) -> Result<Node> {
        match self.cluster_map() {
            Some(map) => map.shard(lane.slot).await,
            None => Ok(self.clone()),
        }
    }

    #[cfg(not(feature = "cluster"))]
    async fn shard_of(&self, _: Lane) -> Result<Node> {
        Ok(self.clone())
    }

    /// A connection nobody else uses until it is dropped, of this very
    /// server (no routing): a Cluster shard's, for an `ASK`.
    #[cfg(feature = "cluster")]
    async fn checkout_exclusive_now(&self) -> Result<Conn> {
        self.refuse_if_suspect().await?;
        Box::pin(self.exclusive_from_pool()).await
    }

    /// A shared connection: `lane`'s, or without one, each in turn.
    async fn checkout_shared(&self, lane: Option<Lane>) -> Result<Conn> {
        let inner = &self.inner;
        let spread = inner.spread;
        let slot = match (spread, lane) {
            (1, _) => 0,
            (_, Some(lane)) => (lane.spread % spread as u64) as usize,
            (_, None) => inner.turn.fetch_add(1, Ordering::Relaxed) % spread,
        };
        if let Some(conn) = self.shared_conn(slot) {
            return Ok(conn);
        }
        // Boxed: the pool's future, which can create a connection, is
        // several KB. Kept out of every request's future, it is not copied
        // each time a request is moved or boxed.
        Box::pin(self.fill_shared(slot)).await
    }

    /// A clone of shared connection `slot`, if it is there and usable.
    fn shared_conn(&self, slot: usize) -> Option<Conn> {
        let shared = self.inner.shared[slot].read().unwrap();
        let object = shared.as_ref()?;
        if object.unusable().is_some() {
            return None;
        }
        Some(Conn::shared(object, self))
    }

    /// Makes shared connection `slot` from the pool, one request at a time:
    /// the requests that wait meanwhile take the connection it made (had
    /// each asked the pool, the ones it could not serve would have waited
    /// for a place that shared connections never give back). When the pool
    /// has nothing to give at once (the other shared connections and
    /// requests that need one to themselves hold it all), another shared
    /// connection serves.
    async fn fill_shared(&self, slot: usize) -> Result<Conn> {
        let _filling = self.inner.filling.lock().await;
        if let Some(conn) = self.shared_conn(slot) {
            return Ok(conn);
        }
        // Only this request fills: the slot is empty or unusable. An
        // unusable connection leaves the pool for good (it holds one of its
        // places) and closes once the requests still on it are done.
        let unusable = self.inner.shared[slot].write().unwrap().take();
        drop(unusable.map(pool::Object::take));
        let object = match self.pool_get_at_once().await {
            Err(PoolError::Timeout(TimeoutType::Wait)) => {
                let other = (0..self.inner.shared.len()).find_map(|other| self.shared_conn(other));
                if let Some(conn) = other {
                    return Ok(conn);
                }
                self.inner.pool.get().await
            }
            other => other,
        };
        let object = self.pooled(object)?;
        let conn = Conn::shared(&object, self);
        let previous = self.inner.shared[slot].write().unwrap().replace(object);
        drop(previous);
        Ok(conn)
    }

    async fn exclusive_from_pool(&self) -> Result<Conn> {
        // One the pool has idle, or can make. When every connection is out
        // (shared ones count), a shared one goes back to the pool: a pool of
        // one still serves a request that needs its connection to itself,
        // and shared requests then wait for the pool, as they would for any
        // connection. (Requests already sent on it are answered first:
        // commands on a connection run in order.)
        let object = match self.pool_get_at_once().await {
            Err(PoolError::Timeout(TimeoutType::Wait)) => {
                let evicted = self
                    .inner
                    .shared
                    .iter()
                    .rev()
                    .find_map(|slot| slot.write().unwrap().take());
                drop(evicted);
                self.inner.pool.get().await
            }
            other => other,
        };
        let object = self.pooled(object)?;
        let conn = Conn::shared(&object, self);
        Ok(Conn {
            _exclusive: Some(Box::new(object)),
            ..conn
        })
    }

    /// A connection the pool has idle or can make, without waiting for one
    /// to come back.
    async fn pool_get_at_once(
        &self,
    ) -> std::result::Result<pool::Object, PoolError<redis::RedisError>> {
        let pool = &self.inner.pool;
        let mut at_once = pool.timeouts();
        at_once.wait = Some(Duration::ZERO);
        pool.timeout_get(&at_once).await
    }

    /// Failing at once while the node is suspect, with nothing sent.
    pub(crate) async fn refuse_if_suspect(&self) -> Result<()> {
        if !self.inner.health.is_suspect() {
            return Ok(());
        }
        self.inner.health.keep_probed();
        // Failing at once must still yield now and then: a caller that
        // retries in a loop would otherwise starve its runtime (and the
        // probe that would end the suspicion).
        tokio::task::coop::consume_budget().await;
        Err(Error::NodeUnavailable {
            node: self.inner.addr.clone(),
            reason: Unavailable::Suspect,
            source: None,
        })
    }

    /// What the pool gave, as this crate's error (observed: a timeout or
    /// refusal makes the node suspect).
    fn pooled(
        &self,
        object: std::result::Result<pool::Object, PoolError<redis::RedisError>>,
    ) -> Result<pool::Object> {
        object.map_err(|e| {
            let err = match e {
                PoolError::Backend(err) => Error::from_redis(&self.inner.addr, err),
                PoolError::Timeout(_) => Error::NodeUnavailable {
                    node: self.inner.addr.clone(),
                    reason: Unavailable::Timeout,
                    source: None,
                },
                _ => Error::NodeUnavailable {
                    node: self.inner.addr.clone(),
                    reason: Unavailable::Refused,
                    source: None,
                },
            };
            self.observe(&err);
            err
        })
    }
}

/// Which of a node's shared connections a request about one lock takes:
/// its name's. A lock's requests keep to one connection, so they reach the
/// server in the order they were sent, as they would on a single one (a
/// contended lock's release, its holder's next acquire and the waiters'
/// attempts, in the order they left); different locks spread over all of
/// them. It carries the name's hash slot too, which picks a Cluster node's
/// shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lane {
    spread: u64,
    slot: u16,
}

impl Lane {
    /// The lane of lock `name` (FNV-1a, then mixed: the low bits of FNV
    /// alone follow the last bytes too closely).
    pub(crate) fn of(name: &str) -> Lane {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in name.bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        Lane {
            spread: hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32,
            slot: slot_of(name),
        }
    }

    /// The hash slot of the lock's keys (0 without the `cluster` feature).
    pub(crate) fn slot(self) -> u16 {
        self.slot
    }
}

#[cfg(feature = "cluster")]
fn slot_of(name: &str) -> u16 {
    super::cluster::key_slot(name.as_bytes())
}

#[cfg(not(feature = "cluster"))]
fn slot_of(_: &str) -> u16 {
    0
}

/// How a Cluster node's request took its shard's connection, to take the
/// same kind from another shard after a redirect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Shared,
    Exclusive,
    DespiteSuspicion,
}

/// A connection of one node, for one request (or, for a rollback, also for
/// the request that follows it on the same connection: commands on one
/// connection are applied in order).
pub(crate) struct Conn {
    conn: Pipe,
    broken: Arc<AtomicBool>,
    /// Held back from the pool while this request needs the connection to
    /// itself. Boxed: a pooled object is larger than the rest of a `Conn`,
    /// which lives in every request's future.
    _exclusive: Option<Box<pool::Object>>,
    node: Node,
    /// For a Cluster node's request: its lane and kind, to follow redirects.
    route: Option<(Lane, Kind)>,
}

impl Conn {
    /// Another handle on this connection, for a request sent beside this
    /// one's (pipelined); never a share of a connection held exclusively.
    pub(crate) fn share(&self) -> Conn {
        debug_assert!(self._exclusive.is_none());
        Conn {
            conn: self.conn.clone(),
            broken: self.broken.clone(),
            _exclusive: None,
            node: self.node.clone(),
            route: self.route,
        }
    }

    /// A handle on the connection of `object`, shared with other requests.
    fn shared(object: &pool::Object, node: &Node) -> Conn {
        Conn {
            conn: object.conn.clone(),
            broken: object.broken.clone(),
            _exclusive: None,
            node: node.clone(),
            route: None,
        }
    }

    pub(crate) async fn run<R>(&mut self, call: &Call<R>) -> Result<R> {
        // Static events for timelines (examples/handoff_timeline.rs): no
        // fields, so nothing is formatted, and with no subscriber listening
        // at TRACE each costs one load of the global level filter.
        tracing::trace!(name: "multilock::request_sent", "request handed to the connection");
        let reply = send(&call.request, &mut self.conn).await;
        tracing::trace!(name: "multilock::reply_received", "reply received");
        #[cfg(feature = "cluster")]
        if let Some(route) = self.route
            && redirect::applies(&reply)
        {
            let reply = Box::pin(self.follow(&call.request, route, reply, None)).await;
            return self.finish(reply.and_then(|reply| call.decode(reply)));
        }
        self.finish(reply.and_then(|reply| call.decode(reply)))
    }

    /// Like [`Conn::run`], waiting up to `patience` for the reply instead
    /// of the node's response timeout: for a rollback queued behind a request
    /// whose reply did not come (a paused node), or a `WAIT`.
    pub(crate) async fn run_patiently<R>(
        &mut self,
        call: &Call<R>,
        patience: Duration,
    ) -> Result<R> {
        let mut conn = self.conn.with_response_timeout(patience);
        let reply = send(&call.request, &mut conn).await;
        #[cfg(feature = "cluster")]
        if let Some(route) = self.route
            && redirect::applies(&reply)
        {
            let reply = Box::pin(self.follow(&call.request, route, reply, Some(patience))).await;
            return self.finish(reply.and_then(|reply| call.decode(reply)));
        }
        self.finish(reply.and_then(|reply| call.decode(reply)))
    }

    fn finish<T>(&self, result: redis::RedisResult<T>) -> Result<T> {
        match result {
            Ok(value) => {
                self.node.inner.health.recovered();
                self.node.inner.health.accepting();
                Ok(value)
            }
            Err(err) => {
                pool::note_error(&self.broken, &err);
                if is_readonly(&err) {
                    // A replica now: a Sentinel node's primary moved. This
                    // connection goes, and the sentinels are asked at once.
                    self.broken.store(true, Ordering::Relaxed);
                    self.node.inner.target.maybe_moved();
                }
                let err = Error::from_redis(&self.node.inner.addr, err);
                self.node.observe(&err);
                Err(err)
            }
        }
    }
}

/// A write refused by a replica (`READONLY`, also inside a script's error).
fn is_readonly(err: &redis::RedisError) -> bool {
    crate::error::condition_of(err) == Some("READONLY")
}

pub(super) async fn send(request: &Request, conn: &mut Pipe) -> redis::RedisResult<Value> {
    match request {
        Request::Script(invocation) => invocation.invoke_async(conn).await,
        Request::Command(cmd) => cmd.query_async(conn).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names that differ in their last characters (a lock per order) spread
    /// evenly over the shared connections, however many there are.
    #[test]
    fn lanes_spread_names_that_differ_at_the_end() {
        for spread in [2u64, 3, 4, 8] {
            let mut per_slot = vec![0; spread as usize];
            for i in 0..256 {
                let lane = Lane::of(&format!("orders:{i}"));
                per_slot[(lane.spread % spread) as usize] += 1;
            }
            let fair = 256 / spread as usize;
            assert!(
                per_slot.iter().all(|n| *n > fair / 2 && *n < fair * 3 / 2),
                "{spread} connections: {per_slot:?}"
            );
        }
        assert_eq!(Lane::of("orders:42"), Lane::of("orders:42"));
    }

    /// A connection with `TCP_NODELAY` coalesces its writes under
    /// concurrency; one under Nagle's algorithm leaves that to the kernel.
    #[tokio::test]
    async fn only_tcp_nodelay_connections_coalesce_writes() {
        use multilock_testkit::{RedisProcess, TestServer};
        let server = RedisProcess::start().await.unwrap();
        let url = server.url();
        let coalesces =
            |node: Node| async move { node.checkout_any_conn().await.unwrap().conn.coalesces() };
        assert!(coalesces(Node::new(&url).unwrap()).await);
        let nagle = Node::builder(url).tcp_nodelay(false).build().unwrap();
        assert!(!coalesces(nagle).await);
    }
}
