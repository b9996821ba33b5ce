//! The crate's wire protocol, for test kits and benchmarks that talk to Redis
//! directly (feature `wire`; the `multilock-testkit` crate re-exports it as
//! `multilock_testkit::protocol`): the same key names and script calls the
//! crate sends, built by the same code (the crate's `protocol` module,
//! `src/protocol/`), so nothing here can drift from it.
//!
//! Hidden from the documentation and outside the crate's semver promise:
//! the scripts change when the crate's protocol does.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use multilock::wire;
//!
//! # async fn demo(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<()> {
//! let field = wire::field("6f1c0e9a-client", "worker-1");
//! let reply: wire::AcquireReply =
//!     wire::acquire("orders:42", &field, Duration::from_secs(30), "hold-1")
//!         .invoke_async(conn)
//!         .await?;
//! assert!(matches!(reply, wire::AcquireReply::Granted { count: 1, .. }));
//! # Ok(()) }
//! ```

use std::time::Duration;

use redis::ScriptInvocation;

use crate::protocol::{self, Call, Fencing, LockKeys, Request};
pub use crate::protocol::{SLOTS, key_slot};
use crate::timing;

/// Holds renewed per script call by the watchdog: a node with `n` holds
/// gets `n.div_ceil(RENEW_BATCH_SIZE)` renewal calls per tick.
pub const RENEW_BATCH_SIZE: usize = crate::watchdog::RENEW_BATCH_SIZE;

fn script<R>(call: Call<R>) -> ScriptInvocation<'static> {
    match call.request {
        Request::Script(invocation) => invocation,
        Request::Command(_) => unreachable!("every lock operation below is a script"),
    }
}

/// The hash field of a hold: `<client-uuid>:<owner>`.
pub fn field(client_id: &str, owner: &str) -> String {
    protocol::field(client_id, owner).to_string()
}

/// A fresh id for a hold (a request id), made as the crate makes them.
pub fn new_hold_id() -> String {
    protocol::new_request_id().to_string()
}

/// The channel unlock messages of lock `name` are published on.
pub fn channel(name: &str) -> String {
    LockKeys::new(name).channel
}

/// The fencing token counter of lock `name`.
pub fn token_key(name: &str) -> String {
    LockKeys::new(name).token
}

/// The vouch of lock `name`'s fencing counter on a node: the `run_id`,
/// replication ID and value a seal or a repair last left the counter at.
pub fn token_vouch_key(name: &str) -> String {
    LockKeys::new(name).token_vouch()
}

/// The unlock latch of one release of lock `name`.
pub fn unlock_latch(name: &str, request_id: &str) -> String {
    LockKeys::new(name).unlock_latch(request_id)
}

/// What the acquire script answered, read as the crate reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// Granted (or re-entered).
    Granted {
        /// The key's TTL after the grant; `None`: exactly the lease asked
        /// for (a fresh hold: the reply is Redisson's bare nil).
        ttl: Option<Duration>,
        /// The owner's hold count after the grant.
        count: u64,
        /// The fencing token, when fenced.
        token: Option<u64>,
    },
    /// Held by someone else, with the key's remaining TTL when it has one.
    Taken(Option<Duration>),
    /// Refused: a rollback of this very request ran first.
    Cancelled,
    /// Refused: the caller holds reads of the read-write lock whose write
    /// lock it asked for (no upgrade).
    UpgradeRefused,
}

impl redis::FromRedisValue for AcquireReply {
    fn from_redis_value(reply: redis::Value) -> Result<Self, redis::ParsingError> {
        Ok(match protocol::parse_acquired(reply)? {
            protocol::Acquired::Granted(grant) => AcquireReply::Granted {
                ttl: grant.ttl,
                count: grant.count,
                token: grant.token,
            },
            protocol::Acquired::Taken(ttl) => AcquireReply::Taken(ttl),
            protocol::Acquired::Cancelled => AcquireReply::Cancelled,
            protocol::Acquired::UpgradeRefused => AcquireReply::UpgradeRefused,
        })
    }
}

/// The acquire script call of lock `name` with `fencing`: one builder for
/// the three public forms below.
fn acquire_with(
    name: &str,
    field: &str,
    lease: Duration,
    hold_id: &str,
    fencing: Fencing,
) -> ScriptInvocation<'static> {
    let keys = LockKeys::new(name);
    script(protocol::acquire(&keys, field, lease, hold_id, fencing))
}

/// The acquire script call, as hold `hold_id` (any unique string; its
/// release and rollback name it again). Read its reply as an
/// [`AcquireReply`].
pub fn acquire(
    name: &str,
    field: &str,
    lease: Duration,
    hold_id: &str,
) -> ScriptInvocation<'static> {
    acquire_with(name, field, lease, hold_id, Fencing::Off)
}

/// The fenced acquire of a single-node lock (Redisson's fenced lock: the
/// counter is INCRed on every grant). Reply as [`acquire`], with the token.
pub fn acquire_fenced(
    name: &str,
    field: &str,
    lease: Duration,
    hold_id: &str,
) -> ScriptInvocation<'static> {
    acquire_with(name, field, lease, hold_id, Fencing::Single)
}

/// The acquire of one part of a fenced multi-node lock: the counter is
/// read only where it exists (the quorum lock settles the token). Reply
/// as [`acquire_fenced`].
pub fn acquire_quorum_fenced(
    name: &str,
    field: &str,
    lease: Duration,
    hold_id: &str,
) -> ScriptInvocation<'static> {
    acquire_with(name, field, lease, hold_id, Fencing::Quorum)
}

/// The extend script call: `field`'s hold of `name` (not a read lock's)
/// lives at least `lease` from now. Reply: the TTL after, or -1 when
/// `field` does not hold it.
pub fn extend(name: &str, field: &str, lease: Duration) -> ScriptInvocation<'static> {
    script(protocol::extend(&LockKeys::new(name), field, lease, false))
}

/// The release script call of hold `hold_id`. Reply: nil (not held), 0
/// (still held) or 1 (deleted and published); a retry returns the first
/// result.
pub fn release(name: &str, field: &str, hold_id: &str) -> ScriptInvocation<'static> {
    release_deleting(name, field, hold_id, [])
}

/// The release script call of hold `hold_id` on a Redis Cluster with
/// sharded pub/sub, as a `Node::cluster` sends it on Redis 7+: the same
/// script as [`release`], publishing with `spublish` (its last argument).
/// No spent latches ride along: those of other locks lie in other slots.
/// Reply as [`release`].
///
/// ```no_run
/// use multilock::wire;
///
/// # async fn demo(conn: &mut impl redis::aio::ConnectionLike) -> redis::RedisResult<()> {
/// // conn: a redis-rs cluster connection, say
/// let field = wire::field("6f1c0e9a-client", "worker-1");
/// let released: Option<i64> = wire::release_sharded("orders:42", &field, "hold-1")
///     .invoke_async(conn)
///     .await?;
/// # Ok(()) }
/// ```
pub fn release_sharded(name: &str, field: &str, hold_id: &str) -> ScriptInvocation<'static> {
    let sharded = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let keys = LockKeys::new(name).with_publish(protocol::Publish::shared(sharded));
    script(protocol::release(
        &keys,
        field,
        &keys.unlock_latch(hold_id),
        std::iter::empty(),
    ))
}

/// The release script call of hold `hold_id`, deleting on the way the
/// latches of earlier releases (`spent`: their [`unlock_latch`]es), as the
/// crate's releases do. Reply as [`release`].
pub fn release_deleting(
    name: &str,
    field: &str,
    hold_id: &str,
    spent: impl IntoIterator<Item = String>,
) -> ScriptInvocation<'static> {
    let keys = LockKeys::new(name);
    script(protocol::release(
        &keys,
        field,
        &keys.unlock_latch(hold_id),
        spent,
    ))
}

/// The read acquire of a read-write lock `name` (one read hold of `field`,
/// as hold `hold_id`), as the crate's read lock sends it. Reply as
/// [`acquire`]; a reader's grant carries no token.
pub fn read_acquire(
    name: &str,
    field: &str,
    lease: Duration,
    hold_id: &str,
) -> ScriptInvocation<'static> {
    script(protocol::rw::read_acquire(
        &LockKeys::new(name),
        field,
        lease,
        hold_id,
    ))
}

/// The read release of hold `hold_id` of `field`, deleting on the way the
/// latches of earlier releases (`spent`), as the crate's read lock sends
/// it. Reply: nil (no read hold), 0 (the lock is still held, by this
/// reader's other holds or by others) or 1 (freed and published); a retry
/// returns the first result.
pub fn read_release_deleting(
    name: &str,
    field: &str,
    hold_id: &str,
    spent: impl IntoIterator<Item = String>,
) -> ScriptInvocation<'static> {
    let keys = LockKeys::new(name);
    script(protocol::rw::read_release(
        &keys,
        field,
        &keys.unlock_latch(hold_id),
        spent,
    ))
}

/// The rollback of acquire request `hold_id`: undoes it only if it was
/// applied, and refuses it if it arrives later. `known_holds`: the holds of
/// `field` on this server its client has on record (a fresh hold, which
/// writes no latch, is known to be this request's when the server counts
/// more). Reply: nil when nothing was undone, else as [`release`].
pub fn rollback(
    name: &str,
    field: &str,
    hold_id: &str,
    known_holds: u64,
) -> ScriptInvocation<'static> {
    script(protocol::rollback(
        &LockKeys::new(name),
        field,
        hold_id,
        known_holds,
        timing::ROLLBACK_WINDOW,
    ))
}

/// The burial of hold (request) `hold_id` given up by its release or
/// rollback: its latch lives `ttl` (the crate uses 30 minutes), and any
/// copy of the request landing meanwhile changes nothing (a release answers
/// the latched result, a rollback undoes nothing, the acquire is refused).
/// Reply: 1.
pub fn bury(name: &str, hold_id: &str, ttl: Duration) -> ScriptInvocation<'static> {
    script(protocol::bury(
        &LockKeys::new(name).unlock_latch(hold_id),
        ttl,
    ))
}

/// The batched renewal script call, for `(lock key, field, read hold?)`
/// triples. Reply: one 1 (renewed) or 0 (gone) per hold.
pub fn renew_batch<'a>(
    holds: impl IntoIterator<Item = (&'a str, &'a str, bool)>,
    lease: Duration,
) -> ScriptInvocation<'static> {
    script(protocol::renew_batch(holds, lease))
}

/// The force-unlock script call. Reply: 1 when the key existed.
pub fn force_unlock(name: &str) -> ScriptInvocation<'static> {
    script(protocol::force_unlock(&LockKeys::new(name)))
}

/// The fencing counter raise of a settled token (a missing counter is
/// created at `minimum`, and vouched for under the server's mark),
/// with no expiry. Reply: `[before (-1: missing), after, vouched before
/// (1/0)]`.
pub fn raise_token(name: &str, minimum: u64) -> ScriptInvocation<'static> {
    script(protocol::raise_token(
        &LockKeys::new(name),
        minimum,
        protocol::Missing::Seed,
        None,
    ))
}

/// A repair's write of `value`: as [`raise_token`], applied only while
/// the server's mark (`<run_id>:<master_replid>`, as `INFO` reports them)
/// is `mark`. Reply: as [`raise_token`]'s, or `[-2, 0, 0]` (nothing
/// written) under another mark.
pub fn repair_token(name: &str, value: u64, mark: &str) -> ScriptInvocation<'static> {
    script(protocol::repair_token(
        &LockKeys::new(name),
        value,
        None,
        mark,
    ))
}

/// The mark of the data on the server that holds lock `name`'s fencing
/// counter: `<run_id>:<master_replid>`, as a repair reads it before its
/// witnesses.
pub fn server_mark(name: &str) -> ScriptInvocation<'static> {
    script(protocol::server_mark(&LockKeys::new(name)))
}

/// The scripts the crate sends, as `(name, Lua source, SHA1 it sends by
/// EVALSHA)`, so tests can check them against `SCRIPT LOAD`.
pub fn scripts() -> Vec<(&'static str, &'static str, String)> {
    protocol::all_scripts()
        .iter()
        .map(|(name, source, script)| (*name, *source, script.get_hash().to_owned()))
        .collect()
}
