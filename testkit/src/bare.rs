//! This crate's own lock+unlock on a bare redis-rs connection: what the
//! benchmark's Cluster section and the `cluster_loop` example hold the
//! crate's client to (the same scripts, no client around them).

use std::io;
use std::time::Duration;

use multilock::wire;
use redis::aio::ConnectionLike;

/// Takes `name` for `field` with the crate's acquire script and releases
/// it with its release that publishes with `SPUBLISH` (what a Cluster node
/// on Redis 7+ sends), both on `conn`, waiting for each reply.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(mut conn: redis::aio::MultiplexedConnection) -> std::io::Result<()> {
/// use std::time::Duration;
/// let field = multilock_testkit::protocol::field("client-id", "bare");
/// multilock_testkit::bare_lock_unlock(&mut conn, "orders:42", &field, Duration::from_secs(30))
///     .await?;
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// The connection's error; `InvalidData` when the name was taken or the
/// release found no hold.
pub async fn bare_lock_unlock<C: ConnectionLike>(
    conn: &mut C,
    name: &str,
    field: &str,
    lease: Duration,
) -> io::Result<()> {
    let hold_id = wire::new_hold_id();
    let reply: wire::AcquireReply = wire::acquire(name, field, lease, &hold_id)
        .invoke_async(conn)
        .await
        .map_err(io::Error::other)?;
    if !matches!(reply, wire::AcquireReply::Granted { .. }) {
        let taken = format!("{name} was taken: {reply:?}");
        return Err(io::Error::new(io::ErrorKind::InvalidData, taken));
    }
    let released: Option<i64> = wire::release_sharded(name, field, &hold_id)
        .invoke_async(conn)
        .await
        .map_err(io::Error::other)?;
    if released != Some(1) {
        let not_held = format!("{name} was not released: {released:?}");
        return Err(io::Error::new(io::ErrorKind::InvalidData, not_held));
    }
    Ok(())
}
