//! Redisson 3.24+'s fair lock (`getFairLock`) as a Redisson client sends
//! it, written from the wire facts (the lock hash, the waiters' queue and
//! deadlines, one private channel per waiter, the unlock latch) and not
//! from this crate's scripts: the foreign client of interop tests, and a
//! limit for the benchmark.
//!
//! The lock hash is the reentrant lock's. Waiters queue in the list
//! [`queue`], FIFO, each with a deadline in the sorted set [`timeouts`]
//! (epoch ms of the *client's* clock, passed as `now_ms`: see [`now_ms`]).
//! Every script first drops the queue's heads whose deadline has passed.
//! A release wakes only the head, with `0` on its own channel
//! [`waiter_channel`]. A waiter that stops waiting sends [`give_up`].
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use multilock_testkit::{redisson, redisson_fair};
//!
//! # async fn demo(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<()> {
//! let field = "6f1c0e9a-1111-2222-3333-444455556666:1";
//! let lease = Duration::from_secs(30);
//! let wait = redisson_fair::DEFAULT_WAIT;
//! let now = redisson_fair::now_ms();
//! let taken: Option<i64> = redisson_fair::acquire("orders:42", field, lease, wait, now)
//!     .invoke_async(conn)
//!     .await?;
//! assert_eq!(taken, None, "granted");
//! let request = redisson::new_request_id();
//! let released: Option<i64> =
//!     redisson_fair::release("orders:42", field, &request, lease, redisson_fair::now_ms())
//!         .invoke_async(conn)
//!         .await?;
//! assert_eq!(released, Some(1), "deleted, and the head notified");
//! redisson::delete_latch("orders:42", &request)
//!     .exec_async(conn)
//!     .await?;
//! # Ok(()) }
//! ```

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::{Script, ScriptInvocation};

use super::redisson;

/// How long a queued `lock()` of Redisson waits by default before its queue
/// entry counts as stale: `fairLockWaitTimeout`, 5 minutes.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);

/// Lua that drops the queue's heads whose deadline has passed (the head
/// only, repeatedly; no other deadline changes). Needs the locals `queue`,
/// `timeouts` (key names) and `now` (a number).
macro_rules! drop_stale_heads {
    () => {
        r#"
while true do
    local head = redis.call('lindex', queue, 0);
    if head == false then
        break;
    end;
    local deadline = redis.call('zscore', timeouts, head);
    if deadline ~= false and tonumber(deadline) <= now then
        redis.call('zrem', timeouts, head);
        redis.call('lpop', queue);
    else
        break;
    end;
end;
"#
    };
}

/// KEYS[1] lock, KEYS[2] queue, KEYS[3] timeouts. ARGV[1] lease (ms),
/// ARGV[2] field, ARGV[3] wait (ms), ARGV[4] now (epoch ms). Reply: nil when
/// granted (or re-entered); else, for a new waiter, the time until its
/// predecessor's deadline (or the lock's PTTL), and for a queued one
/// `max(0, PTTL)`.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        r#"
local queue, timeouts = KEYS[2], KEYS[3];
local now = tonumber(ARGV[4]);
local wait = tonumber(ARGV[3]);
"#,
        drop_stale_heads!(),
        r#"
if redis.call('exists', KEYS[1]) == 0 then
    local head = redis.call('lindex', queue, 0);
    if head == false or head == ARGV[2] then
        redis.call('lpop', queue);
        redis.call('zrem', timeouts, ARGV[2]);
        local waiters = redis.call('zrange', timeouts, 0, -1);
        for i = 1, #waiters do
            redis.call('zincrby', timeouts, -wait, waiters[i]);
        end;
        redis.call('hset', KEYS[1], ARGV[2], 1);
        redis.call('pexpire', KEYS[1], ARGV[1]);
        return nil;
    end;
end;
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1);
    redis.call('pexpire', KEYS[1], ARGV[1]);
    return nil;
end;
if redis.call('zscore', timeouts, ARGV[2]) ~= false then
    return math.max(0, redis.call('pttl', KEYS[1]));
end;
local last = redis.call('lindex', queue, -1);
local last_deadline = false;
if last ~= false and last ~= ARGV[2] then
    last_deadline = redis.call('zscore', timeouts, last);
end;
local ttl;
if last_deadline ~= false then
    ttl = tonumber(last_deadline) - now;
else
    ttl = redis.call('pttl', KEYS[1]);
end;
if redis.call('zadd', timeouts, ttl + wait + now, ARGV[2]) == 1 then
    redis.call('rpush', queue, ARGV[2]);
end;
return ttl;
"#
    ))
});

/// KEYS[1] queue, KEYS[2] timeouts. ARGV[1] field, ARGV[2] wait (ms),
/// ARGV[3] now (epoch ms). Reply: nil.
static GIVE_UP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        r#"
local queue, timeouts = KEYS[1], KEYS[2];
local now = tonumber(ARGV[3]);
"#,
        drop_stale_heads!(),
        r#"
local waiters = redis.call('lrange', queue, 0, -1);
local i = 1;
while i <= #waiters and waiters[i] ~= ARGV[1] do
    i = i + 1;
end;
for j = i + 1, #waiters do
    redis.call('zincrby', timeouts, -tonumber(ARGV[2]), waiters[j]);
end;
redis.call('zrem', timeouts, ARGV[1]);
redis.call('lrem', queue, 0, ARGV[1]);
return nil;
"#
    ))
});

/// KEYS[1] lock, KEYS[2] queue, KEYS[3] timeouts, KEYS[4] the lock's
/// channel (waiters' channels are it plus `:<field>`), KEYS[5] unlock latch.
/// ARGV[1] message, ARGV[2] lease (ms), ARGV[3] field, ARGV[4] now (epoch
/// ms), ARGV[5] publish command, ARGV[6] latch TTL (ms). Reply: the latched
/// result when this unlock already ran; nil not held; 0 still held (the
/// lease renewed); 1 deleted (or already gone) and the head notified.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        r#"
local val = redis.call('get', KEYS[5]);
if val ~= false then
    return tonumber(val);
end;
local queue, timeouts = KEYS[2], KEYS[3];
local now = tonumber(ARGV[4]);
"#,
        drop_stale_heads!(),
        r#"
local function notify_head()
    local head = redis.call('lindex', queue, 0);
    if head ~= false then
        redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[1]);
    end;
end;
if redis.call('exists', KEYS[1]) == 0 then
    notify_head();
    redis.call('set', KEYS[5], 1, 'px', ARGV[6]);
    return 1;
end;
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil;
end;
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1);
if counter > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2]);
    redis.call('set', KEYS[5], 0, 'px', ARGV[6]);
    return 0;
end;
redis.call('del', KEYS[1]);
redis.call('set', KEYS[5], 1, 'px', ARGV[6]);
notify_head();
return 1;
"#
    ))
});

/// Redisson's `{name}`: the name in braces, or as it is when it already
/// holds a `{` (the user's hash tag). Taken from [`redisson::channel`], so
/// the rule lives in one place.
fn tagged(name: &str) -> String {
    redisson::channel(name)
        .strip_prefix("redisson_lock__channel:")
        .expect("Redisson's channel prefix")
        .to_owned()
}

/// The waiters' queue of fair lock `name`: `redisson_lock_queue:{name}`, a
/// list of fields, FIFO.
pub fn queue(name: &str) -> String {
    format!("redisson_lock_queue:{}", tagged(name))
}

/// The waiters' deadlines of fair lock `name`:
/// `redisson_lock_timeout:{name}`, a sorted set of fields scored by their
/// deadline in epoch ms.
pub fn timeouts(name: &str) -> String {
    format!("redisson_lock_timeout:{}", tagged(name))
}

/// The private channel of waiter `field` of fair lock `name`:
/// `redisson_lock__channel:{name}:<field>`; a release publishes `0` on the
/// head's.
pub fn waiter_channel(name: &str, field: &str) -> String {
    format!("{}:{field}", redisson::channel(name))
}

/// This machine's clock in epoch ms, as a Redisson client reads it
/// (`System.currentTimeMillis()`) for the `now_ms` of every script.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis() as u64
}

/// The try-acquire script call of `field` (`<client-uuid>:<thread-id>`) on
/// fair lock `name` with `lease`, for a waiter that waits `wait` (Redisson:
/// the `tryLock` wait, else [`DEFAULT_WAIT`]), at `now_ms` on the client's
/// clock.
///
/// KEYS: the lock, [`queue`], [`timeouts`]. ARGV: lease (ms), field, wait
/// (ms), now (ms). First drops the stale heads (deadline ≤ `now_ms`). Grants
/// when the hash is absent and the caller heads the queue (or it is empty),
/// then removes the caller and lowers every remaining deadline by `wait`;
/// re-enters a hold without looking at the queue; else queues the caller
/// with deadline = (its predecessor's deadline, or now + the lock's PTTL) +
/// `wait`.
///
/// Reply: nil when granted; else a TTL in ms: for a newly queued waiter the
/// time to its predecessor's deadline (or the lock's PTTL), for one already
/// queued `max(0, PTTL)`.
pub fn acquire(
    name: &str,
    field: &str,
    lease: Duration,
    wait: Duration,
    now_ms: u64,
) -> ScriptInvocation<'static> {
    let mut invocation = ACQUIRE.key(name);
    invocation
        .key(queue(name))
        .key(timeouts(name))
        .arg(lease.as_millis() as u64)
        .arg(field)
        .arg(wait.as_millis() as u64)
        .arg(now_ms);
    invocation
}

/// The acquire-failed call a waiter `field` sends when it stops waiting on
/// fair lock `name` (timed out or cancelled), with the `wait` it queued
/// with, at `now_ms`.
///
/// KEYS: [`queue`], [`timeouts`] (as Redisson, not the lock). ARGV: field,
/// wait (ms), now (ms). Drops the stale heads, lowers the deadline of every
/// waiter *behind* the caller by `wait`, and removes the caller from both.
/// Reply: nil.
pub fn give_up(name: &str, field: &str, wait: Duration, now_ms: u64) -> ScriptInvocation<'static> {
    let mut invocation = GIVE_UP.key(queue(name));
    invocation
        .key(timeouts(name))
        .arg(field)
        .arg(wait.as_millis() as u64)
        .arg(now_ms);
    invocation
}

/// The unlock script call of `field` on fair lock `name`, as unlock request
/// `request_id` (resent with the same id, it returns the first result), at
/// `now_ms`; a hold that remains is renewed to `lease`.
///
/// KEYS: the lock, [`queue`], [`timeouts`], the lock's channel
/// ([`redisson::channel`]), the unlock latch ([`redisson::unlock_latch`]).
/// ARGV: message `0`, lease (ms), field, now (ms), `publish`, latch TTL (ms).
/// Reads the latch first; then drops the stale heads. The last hold deletes
/// the hash and publishes `0` on the head's [`waiter_channel`]; a hash
/// already gone notifies the head the same way (and replies 1, as Redisson
/// does). Send [`redisson::delete_latch`] after the reply.
///
/// Reply: nil (not held), 0 (still held) or 1 (deleted, or already gone).
pub fn release(
    name: &str,
    field: &str,
    request_id: &str,
    lease: Duration,
    now_ms: u64,
) -> ScriptInvocation<'static> {
    let mut invocation = RELEASE.key(name);
    invocation
        .key(queue(name))
        .key(timeouts(name))
        .key(redisson::channel(name))
        .key(redisson::unlock_latch(name, request_id))
        .arg(0)
        .arg(lease.as_millis() as u64)
        .arg(field)
        .arg(now_ms)
        .arg("publish")
        .arg(redisson::UNLOCK_LATCH_TTL.as_millis() as u64);
    invocation
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_redisson_naming() {
        assert_eq!(queue("orders:42"), "redisson_lock_queue:{orders:42}");
        assert_eq!(timeouts("orders:42"), "redisson_lock_timeout:{orders:42}");
        assert_eq!(
            waiter_channel("orders:42", "u:1"),
            "redisson_lock__channel:{orders:42}:u:1"
        );
        assert_eq!(queue("a{b}c"), "redisson_lock_queue:a{b}c");
        assert_eq!(
            waiter_channel("a{b}c", "u:1"),
            "redisson_lock__channel:a{b}c:u:1"
        );
    }
}
