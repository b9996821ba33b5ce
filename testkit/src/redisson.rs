//! Redisson 3.24+'s reentrant lock as a Redisson client sends it, written
//! from the wire facts (the lock hash, its channel, the unlock latch) and
//! not from this crate's scripts: the foreign client of interop tests, and
//! the benchmark's limit (the protocol a Redisson-compatible lock competes
//! with).
//!
//! One lock+unlock is three commands: the acquire script, the unlock script
//! (which reads, then writes, the unlock latch), and a `DEL` of the latch
//! that the client sends after the unlock's reply without waiting for it.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use multilock_testkit::redisson;
//!
//! # async fn demo(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<()> {
//! let field = "6f1c0e9a-1111-2222-3333-444455556666:1";
//! let lease = Duration::from_secs(30);
//! let taken: Option<i64> = redisson::acquire("orders:42", field, lease)
//!     .invoke_async(conn)
//!     .await?;
//! assert_eq!(taken, None, "granted");
//! let request = redisson::new_request_id();
//! let released: Option<i64> = redisson::release("orders:42", field, &request, lease)
//!     .invoke_async(conn)
//!     .await?;
//! assert_eq!(released, Some(1), "deleted, and 0 published");
//! redisson::delete_latch("orders:42", &request)
//!     .exec_async(conn)
//!     .await?;
//! # Ok(()) }
//! ```

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, Script, ScriptInvocation};

/// How long Redisson's unlock latch lives: its command timeout plus retry
/// interval, times its retry attempts, with the defaults (3 s + 1.5 s) x 3.
pub const UNLOCK_LATCH_TTL: Duration = Duration::from_millis(13_500);

/// KEYS[1] lock. ARGV[1] lease (ms), ARGV[2] field. Reply: nil when granted
/// (or re-entered), else the lock's PTTL.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    redis.call('hincrby', KEYS[1], ARGV[2], 1);
    redis.call('pexpire', KEYS[1], ARGV[1]);
    return nil;
end;
return redis.call('pttl', KEYS[1]);
"#,
    )
});

/// KEYS[1] lock, KEYS[2] channel, KEYS[3] unlock latch. ARGV[1] message,
/// ARGV[2] lease (ms), ARGV[3] field, ARGV[4] publish command, ARGV[5]
/// latch TTL (ms). Reply: the latched result when this unlock already ran;
/// nil not held; 0 still held (the lease renewed); 1 deleted and published.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local val = redis.call('get', KEYS[3]);
if val ~= false then
    return tonumber(val);
end;
if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then
    return nil;
end;
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1);
if (counter > 0) then
    redis.call('pexpire', KEYS[1], ARGV[2]);
    redis.call('set', KEYS[3], 0, 'px', ARGV[5]);
    return 0;
else
    redis.call('del', KEYS[1]);
    redis.call(ARGV[4], KEYS[2], ARGV[1]);
    redis.call('set', KEYS[3], 1, 'px', ARGV[5]);
    return 1;
end;
"#,
    )
});

/// Redisson's key naming: `prefix:{name}`, or `prefix:name` when the name
/// already holds a `{`.
fn prefixed(prefix: &str, name: &str) -> String {
    if name.contains('{') {
        format!("{prefix}:{name}")
    } else {
        format!("{prefix}:{{{name}}}")
    }
}

/// The channel Redisson's waiters of lock `name` listen on.
pub fn channel(name: &str) -> String {
    prefixed("redisson_lock__channel", name)
}

/// The unlock latch of unlock request `request_id` of lock `name`.
pub fn unlock_latch(name: &str, request_id: &str) -> String {
    format!("{}:{request_id}", prefixed("redisson_unlock_latch", name))
}

/// A fresh unlock request id: 32 hex digits, as Redisson makes them.
pub fn new_request_id() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .simple()
        .to_string()
}

/// The acquire script call of `field` (`<client-uuid>:<thread-id>`) on lock
/// `name` with `lease`. Reply: nil when granted, else the lock's PTTL.
pub fn acquire(name: &str, field: &str, lease: Duration) -> ScriptInvocation<'static> {
    let mut invocation = ACQUIRE.key(name);
    invocation.arg(lease.as_millis() as u64).arg(field);
    invocation
}

/// The unlock script call of `field` on lock `name`, as unlock request
/// `request_id` (resent with the same id, it returns the first result).
/// Publishes `0` with `PUBLISH`. Reply: nil (not held), 0 (still held) or 1
/// (deleted and published).
pub fn release(
    name: &str,
    field: &str,
    request_id: &str,
    lease: Duration,
) -> ScriptInvocation<'static> {
    let mut invocation = RELEASE.key(name);
    invocation
        .key(channel(name))
        .key(unlock_latch(name, request_id))
        .arg(0)
        .arg(lease.as_millis() as u64)
        .arg(field)
        .arg("publish")
        .arg(UNLOCK_LATCH_TTL.as_millis() as u64);
    invocation
}

/// The `DEL` of the unlock latch a Redisson client sends once the unlock
/// replied, without waiting for its answer.
pub fn delete_latch(name: &str, request_id: &str) -> Cmd {
    let mut cmd = redis::cmd("DEL");
    cmd.arg(unlock_latch(name, request_id));
    cmd
}
