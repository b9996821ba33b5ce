//! The command connections of one node: a deadpool pool of RESP3 multiplexed
//! connections whose recycle does no I/O.
//!
//! Requests share connections: the node keeps pooled objects out of the
//! pool as its shared connections (one unless the node was built with more,
//! at most the pool size), and a checkout clones one of those multiplexed
//! handles, the one its lock's name picks (no pool lock, no semaphore, no
//! await), so concurrent requests pipeline on a few sockets instead of
//! queueing for a connection each, and a lock's requests stay in order
//! (each connection with `TCP_NODELAY` coalesces its writes under
//! concurrency: [`super::coalesce`]). The pool is asked only for shared
//! connections (the first, and to replace one that broke), and for
//! connections a request needs to itself (a replica-sync `WAIT`).
//!
//! deadpool-redis's stock manager sends `UNWATCH` + `PING` on every checkout,
//! tripling the wire cost of a lock+unlock. Here a connection is known broken
//! from what the connection itself reports (a `Disconnection` push, or an
//! unrecoverable error or timeout on a command), or from its runtime being
//! gone (its driver task died with it), and recycling only reads that.
//!
//! A new connection loads every script of the protocol before it is handed
//! out, and reports the server's `run_id`: a server that restarted has an
//! empty script cache and a new id.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use redis::aio::{AsyncPushSender, SendError};
use redis::{AsyncConnectionConfig, PushInfo, PushKind, RedisError};

use super::coalesce::Pipe;
use super::identity::ServerIdentity;
use crate::protocol;

/// Creates connections for one node.
pub(crate) struct ConnectionFactory {
    /// Where connections go (asked afresh for each).
    pub(crate) target: super::target::Target,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// What the connections learn about the server.
    pub(crate) server: Arc<ServerIdentity>,
}

/// A pooled connection and what says it must not be reused.
pub(crate) struct PooledConnection {
    /// The connection, coalescing its writes under concurrency (with
    /// `TCP_NODELAY`; under Nagle's algorithm the kernel does).
    pub(crate) conn: Pipe,
    pub(crate) broken: Arc<AtomicBool>,
    /// Its target and the target's epoch when it was made: a Sentinel
    /// node's connections to a former primary are unusable.
    target: super::target::Target,
    epoch: u64,
    /// Alive while the runtime that drives the connection is: see
    /// [`RuntimeAlive`].
    runtime: RuntimeAlive,
}

impl PooledConnection {
    /// Why this connection must not be reused, if it must not: it broke, or
    /// the runtime that drives it is gone. No I/O.
    pub(crate) fn unusable(&self) -> Option<&'static str> {
        if self.broken.load(Ordering::Relaxed) {
            Some("connection broken")
        } else if !self.target.is_current(self.epoch) {
            Some("the primary moved")
        } else if !self.runtime.is_alive() {
            Some("the connection's runtime is gone")
        } else {
            None
        }
    }
}

/// Whether the runtime a connection was made on still runs. A multiplexed
/// connection's driver is a task of that runtime; when the runtime shuts
/// down the handle stays, but every request on it fails. A task parked
/// forever on the same runtime holds the strong half: the runtime dropping
/// its tasks drops it.
pub(crate) struct RuntimeAlive(std::sync::Weak<()>);

impl RuntimeAlive {
    /// Ties a sentinel to the current runtime.
    pub(crate) fn current() -> RuntimeAlive {
        let alive = Arc::new(());
        let weak = Arc::downgrade(&alive);
        tokio::spawn(async move {
            let _alive = alive;
            std::future::pending::<()>().await;
        });
        RuntimeAlive(weak)
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}

/// Marks a connection for disposal when `err` means it cannot be trusted any
/// more. A timed-out connection may be half-open (a network partition), so it
/// is replaced too.
pub(crate) fn note_error(broken: &AtomicBool, err: &RedisError) {
    if err.is_unrecoverable_error() || err.is_timeout() || err.is_io_error() {
        broken.store(true, Ordering::Relaxed);
    }
}

/// Sets the broken flag when the connection reports its own disconnection,
/// and tells whoever watches the server (a restart is found by the next
/// connection's `run_id`) and the target (a Sentinel node's primary may
/// have moved).
struct BrokenOnDisconnect(Arc<AtomicBool>, Arc<ServerIdentity>, super::target::Target);

impl AsyncPushSender for BrokenOnDisconnect {
    fn send(&self, info: PushInfo) -> Result<(), SendError> {
        if info.kind == PushKind::Disconnection {
            self.0.store(true, Ordering::Relaxed);
            self.1.notify_disconnected();
            self.2.maybe_moved();
        }
        Ok(())
    }
}

impl managed::Manager for ConnectionFactory {
    type Type = PooledConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<PooledConnection, RedisError> {
        let broken = Arc::new(AtomicBool::new(false));
        let (client, epoch) = self.target.resolve().await?;
        let push = BrokenOnDisconnect(broken.clone(), self.server.clone(), self.target.clone());
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_push_sender(push);
        // Boxed: redis-rs's connect future is deep, and every future that
        // may open a connection (each acquire) holds it; callers' `Send`
        // checks walked it to the compiler's recursion limit (the benches'
        // spawns). Once per connection, never per request.
        let connecting = client.get_multiplexed_async_connection_with_config(&config);
        let mut conn = futures::FutureExt::boxed(connecting).await?;
        let runtime = RuntimeAlive::current();
        let mut setup = protocol::load_scripts();
        setup.cmd("INFO").arg("server");
        if self.target.checks_role() {
            setup.cmd("ROLE");
        }
        let mut replies = setup
            .query_async::<Vec<redis::Value>>(&mut conn)
            .await?
            .into_iter();
        let info = replies.next().unwrap_or(redis::Value::Nil);
        let info: String = redis::FromRedisValue::from_redis_value(info)?;
        if replies.next().is_some_and(|role| !is_primary(&role)) {
            self.target.maybe_moved();
            return Err(self.target.not_a_primary());
        }
        if !self.target.is_current(epoch) {
            // The primary moved while this connection was made: it is
            // unusable, and its `run_id` must not count as the server's
            // (a switch back and forth would look like two restarts).
            return Err(RedisError::from((
                redis::ErrorKind::MasterNameNotFoundBySentinel,
                "the primary moved while connecting",
            )));
        }
        // Observed once the server is known to be the one to use: a
        // Sentinel node's new primary has its own `run_id`, and fencing
        // treats the switch as it treats a restart (the replica may miss the
        // last writes).
        if let Some(run_id) = info.lines().find_map(|line| line.strip_prefix("run_id:")) {
            self.server.observe(run_id.trim());
        }
        // Under Nagle's algorithm the kernel coalesces the writes already.
        let response_timeout = Some(self.response_timeout);
        let conn = if client.get_connection_info().tcp_settings().nodelay() {
            Pipe::start(conn, response_timeout)
        } else {
            Pipe::direct(conn, response_timeout)
        };
        Ok(PooledConnection {
            conn,
            broken,
            target: self.target.clone(),
            epoch,
            runtime,
        })
    }

    async fn recycle(&self, conn: &mut PooledConnection, _: &Metrics) -> RecycleResult<RedisError> {
        match conn.unusable() {
            Some(why) => Err(RecycleError::message(why)),
            None => Ok(()),
        }
    }
}

/// Whether a `ROLE` reply is a primary's (`master`, then its offset and
/// replicas).
fn is_primary(role: &redis::Value) -> bool {
    match role {
        redis::Value::Array(parts) => matches!(
            parts.first(),
            Some(redis::Value::BulkString(kind)) if kind == b"master"
        ),
        _ => false,
    }
}

pub(crate) type Pool = managed::Pool<ConnectionFactory>;
pub(crate) type Object = managed::Object<ConnectionFactory>;
