//! The command connections of one node: a deadpool pool of RESP3 multiplexed
//! connections whose recycle does no I/O.
//!
//! Requests share connections: a checkout clones the multiplexed handle and
//! gives the pooled object back at once, so concurrent requests pipeline on
//! one socket instead of queueing for a connection each. The pool creates
//! another connection (up to its size) only when a request finds none idle,
//! for instance while a replica-sync `WAIT` holds one exclusively.
//!
//! deadpool-redis's stock manager sends `UNWATCH` + `PING` on every checkout,
//! tripling the wire cost of a lock+unlock. Here a connection is known broken
//! from what the connection itself reports (a `Disconnection` push, or an
//! unrecoverable error or timeout on a command), and recycling only reads
//! that flag.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use redis::aio::{AsyncPushSender, MultiplexedConnection, SendError};
use redis::{AsyncConnectionConfig, PushInfo, PushKind, RedisError};

/// Creates connections for one node.
pub(crate) struct ConnectionFactory {
    pub(crate) client: redis::Client,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

/// A pooled connection and the flag that says it must not be reused.
pub(crate) struct PooledConnection {
    pub(crate) conn: MultiplexedConnection,
    pub(crate) broken: Arc<AtomicBool>,
}

/// Marks a connection for disposal when `err` means it cannot be trusted any
/// more. A timed-out connection may be half-open (a network partition), so it
/// is replaced too.
pub(crate) fn note_error(broken: &AtomicBool, err: &RedisError) {
    if err.is_unrecoverable_error() || err.is_timeout() || err.is_io_error() {
        broken.store(true, Ordering::Relaxed);
    }
}

/// Sets the broken flag when the connection reports its own disconnection.
struct BrokenOnDisconnect(Arc<AtomicBool>);

impl AsyncPushSender for BrokenOnDisconnect {
    fn send(&self, info: PushInfo) -> Result<(), SendError> {
        if info.kind == PushKind::Disconnection {
            self.0.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl managed::Manager for ConnectionFactory {
    type Type = PooledConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<PooledConnection, RedisError> {
        let broken = Arc::new(AtomicBool::new(false));
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_push_sender(BrokenOnDisconnect(broken.clone()));
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(PooledConnection { conn, broken })
    }

    async fn recycle(&self, conn: &mut PooledConnection, _: &Metrics) -> RecycleResult<RedisError> {
        if conn.broken.load(Ordering::Relaxed) {
            Err(RecycleError::message("connection broken"))
        } else {
            Ok(())
        }
    }
}

pub(crate) type Pool = managed::Pool<ConnectionFactory>;
