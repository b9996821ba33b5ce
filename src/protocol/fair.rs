//! The fair lock's scripts (Redisson's `getFairLock`): the lock hash as the
//! reentrant lock's, a FIFO list of waiting fields, a sorted set of their
//! deadlines (epoch ms of the waiters' clocks), and one wake-up channel per
//! waiter, `redisson_lock__channel:{name}:<field>`, which only the head of
//! the queue is sent.
//!
//! Every script first drops queue heads whose deadline has passed (heads
//! only, as Redisson does). A grant needs the key absent and the caller at
//! the head (or the queue empty); the caller then leaves the queue and the
//! waiters behind it move up by its wait. A caller that is refused joins
//! the tail (or stays where it is), so a waiter that stops waiting must
//! [`give_up`]: it leaves, and the waiters behind it move up by its wait.
//! A grant, a release and a rollback otherwise keep the reentrant lock's
//! rules: the request's latch (refusal after a rollback, a re-entry's
//! `granted`), the idempotent release and its latch, fencing.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::holds::{cancel_latch_lua, fencing_args, grant_lua, latched_release_lua};
use super::{Acquired, Call, Fencing, LockKeys, Released, parse_acquired, prefixed};
use crate::timing::millis;

/// Message sent to the head of the queue when the lock is released.
const UNLOCK_MESSAGE: &str = "0";

/// How long a release's result stays in its latch (as the reentrant lock's).
const UNLOCK_LATCH_TTL_MS: u64 = 10_000;

/// The names a fair lock uses besides the reentrant lock's.
#[derive(Debug, Clone)]
pub(crate) struct QueueKeys {
    /// The list of waiting fields, head first.
    pub(crate) queue: String,
    /// The sorted set of the waiters' deadlines.
    pub(crate) deadlines: String,
}

impl QueueKeys {
    pub(crate) fn new(name: &str) -> QueueKeys {
        QueueKeys {
            queue: prefixed("redisson_lock_queue", name),
            deadlines: prefixed("redisson_lock_timeout", name),
        }
    }
}

/// The private wake-up channel of the waiter `field` of the lock whose
/// shared channel is `channel`.
pub(crate) fn waiter_channel(channel: &str, field: &str) -> String {
    let mut waiter = String::with_capacity(channel.len() + 1 + field.len());
    waiter.push_str(channel);
    waiter.push(':');
    waiter.push_str(field);
    waiter
}

/// Drops queue heads whose deadline is past `now` (a head without a
/// deadline too: it can never be granted). Expects the locals `queue`,
/// `deadlines` and `now`.
macro_rules! drop_stale_heads_lua {
    () => {
        r#"
while true do
    local head = redis.call('lindex', queue, 0)
    if not head then
        break
    end
    local deadline = tonumber(redis.call('zscore', deadlines, head))
    if deadline and deadline > now then
        break
    end
    redis.call('lpop', queue)
    redis.call('zrem', deadlines, head)
end
"#
    };
}

/// Takes `field` out of the queue, if it is there, and moves every waiter
/// behind it up by `wait`. Expects the locals `queue`, `deadlines`, `field`
/// and `wait`; sets `left` (its position, 1 = head; nil when absent).
macro_rules! leave_queue_lua {
    () => {
        r#"
local left = nil
local waiters = redis.call('lrange', queue, 0, -1)
for i = 1, #waiters do
    if left then
        redis.call('zincrby', deadlines, -wait, waiters[i])
    elseif waiters[i] == field then
        left = i
    end
end
if left then
    redis.call('lrem', queue, 1, field)
end
redis.call('zrem', deadlines, field)
"#
    };
}

/// Publishes the unlock message to the head of the queue, if there is one.
/// Expects the locals `queue` and `prefix` (the lock's shared channel),
/// ARGV[3] the unlock message and the publish command (`publish` or
/// `spublish`, see [`Publish`](super::Publish)) as the last ARGV: every
/// script that includes this takes it last.
macro_rules! wake_head_lua {
    () => {
        r#"
local head = redis.call('lindex', queue, 0)
if head then
    redis.call(ARGV[#ARGV], prefix .. ':' .. head, ARGV[3])
end
"#
    };
}

/// KEYS[1] lock, KEYS[2] this request's hold latch, KEYS[3] queue, KEYS[4]
/// deadlines, KEYS[5] token counter (fenced only). ARGV[1] lease (ms),
/// ARGV[2] field, ARGV[3] the caller's wait (ms), ARGV[4] now (epoch ms),
/// ARGV[5] fencing (as the reentrant acquire's ARGV[3]), ARGV[6] floor.
///
/// Reply as the reentrant acquire's. A caller refused joins the queue (its
/// deadline: its predecessor's, or now + the key's PTTL, plus its wait) and
/// gets the time until its turn as the queue estimates it; one already
/// queued gets what is left of that (the key's PTTL when the estimate has
/// passed: the holder stayed longer). A caller with no wait (0) that is
/// not queued stays out of the queue and gets the key's PTTL. Never -2 or
/// -3 for a refusal.
pub(super) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
pub(super) const ACQUIRE_LUA: &str = concat!(
    r#"
local queue, deadlines, now = KEYS[3], KEYS[4], tonumber(ARGV[4])
"#,
    drop_stale_heads_lua!(),
    r#"
local field, wait = ARGV[2], tonumber(ARGV[3])
local exists = redis.call('exists', KEYS[1]) == 1
local reentry = exists and redis.call('hexists', KEYS[1], field) == 1
local head = redis.call('lindex', queue, 0)
if redis.call('get', KEYS[2]) then
    return -3
end
if not reentry and (exists or (head and head ~= field)) then
    local deadline = redis.call('zscore', deadlines, field)
    local ttl
    if deadline then
        ttl = tonumber(deadline) - wait - now
        if ttl <= 0 then
            ttl = redis.call('pttl', KEYS[1])
        end
    elseif wait == 0 then
        -- One attempt and no wait (Redisson's tryLock()): not queued, so
        -- a caller that dies right after leaves nothing in the queue.
        ttl = redis.call('pttl', KEYS[1])
    else
        local last = redis.call('lindex', queue, -1)
        local before = last and tonumber(redis.call('zscore', deadlines, last))
        if before then
            ttl = before - now
        else
            ttl = redis.call('pttl', KEYS[1])
        end
        redis.call('zadd', deadlines, math.max(ttl, 0) + wait + now, field)
        redis.call('rpush', queue, field)
    end
    if ttl < 0 then
        return -1
    end
    return ttl
end
if not reentry and head then
"#,
    leave_queue_lua!(),
    r#"
end
local fencing, floor, token_key, mode_on_grant = ARGV[5], ARGV[6], KEYS[5], nil
"#,
    grant_lua!()
);

/// Acquire the fair lock `keys`/`queue` for `field` with `lease`, as hold
/// `hold_id`, queueing with `wait` when refused (`now_ms`: the caller's
/// wall clock, epoch ms, as Redisson's deadlines are).
#[allow(clippy::too_many_arguments)]
pub(crate) fn acquire(
    keys: &LockKeys,
    queue: &QueueKeys,
    field: &str,
    lease: Duration,
    hold_id: &str,
    fencing: Fencing,
    wait: Duration,
    now_ms: u64,
) -> Call<Acquired> {
    let mut invocation = ACQUIRE.key(&*keys.name);
    invocation
        .key(keys.unlock_latch(hold_id))
        .key(&queue.queue)
        .key(&queue.deadlines)
        .arg(millis(lease))
        .arg(field)
        .arg(millis(wait))
        .arg(now_ms);
    fencing_args(&mut invocation, keys, fencing);
    Call::script(invocation, |reply| Ok(parse_acquired(reply)?))
}

/// KEYS[1] lock, KEYS[2] the lock's shared channel, KEYS[3] queue, KEYS[4]
/// deadlines. ARGV[1] field, ARGV[2] the caller's wait (ms), ARGV[3]
/// unlock message, ARGV[4] now (epoch ms), ARGV[5] (the last) the publish
/// command.
///
/// Redisson's acquire-failed step: the waiter leaves the queue and the
/// waiters behind it move up by its wait. When it was the head and the lock
/// is free, the new head is woken (it would otherwise wait for its re-poll).
///
/// Reply: 1 when the field was queued, else 0.
pub(super) static GIVE_UP: LazyLock<Script> = LazyLock::new(|| Script::new(GIVE_UP_LUA));
pub(super) const GIVE_UP_LUA: &str = concat!(
    r#"
local queue, deadlines, now = KEYS[3], KEYS[4], tonumber(ARGV[4])
local prefix, field, wait = KEYS[2], ARGV[1], tonumber(ARGV[2])
"#,
    drop_stale_heads_lua!(),
    leave_queue_lua!(),
    r#"
if left == 1 and redis.call('exists', KEYS[1]) == 0 then
"#,
    wake_head_lua!(),
    r#"
end
if left then
    return 1
end
return 0
"#
);

/// `field` stops waiting for the fair lock: it leaves the queue (see
/// [`GIVE_UP`]). Reply: whether it was queued.
pub(crate) fn give_up(
    keys: &LockKeys,
    queue: &QueueKeys,
    field: &str,
    wait: Duration,
    now_ms: u64,
) -> Call<bool> {
    let mut invocation = GIVE_UP.key(&*keys.name);
    invocation
        .key(&keys.channel)
        .key(&queue.queue)
        .key(&queue.deadlines)
        .arg(field)
        .arg(millis(wait))
        .arg(UNLOCK_MESSAGE)
        .arg(now_ms)
        .arg(keys.publish.command());
    Call::script(invocation, |reply| {
        Ok(<i64 as redis::FromRedisValue>::from_redis_value(reply)? == 1)
    })
}

/// KEYS[1] lock, KEYS[2] the lock's shared channel, KEYS[3] the hold's
/// latch, KEYS[4] queue, KEYS[5] deadlines, KEYS[6..] latches of earlier
/// releases to delete. ARGV[1] field, ARGV[2] latch TTL (ms), ARGV[3]
/// unlock message, ARGV[4] now (epoch ms), ARGV[5] (the last) the publish
/// command.
///
/// The reentrant release (see its script), except that the message goes to
/// the head of the queue only, and that a release that finds the key gone
/// still wakes the head (a holder that expired told nobody).
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
pub(super) const RELEASE_LUA: &str = concat!(
    r#"
local queue, deadlines, now = KEYS[4], KEYS[5], tonumber(ARGV[4])
local prefix = KEYS[2]
"#,
    drop_stale_heads_lua!(),
    r#"
"#,
    latched_release_lua!(),
    r#"
if latched or not count or tonumber(count) > 1 then
    if #KEYS > 5 then
        redis.call('del', unpack(KEYS, 6))
    end
    if latched then
        return latched
    end
    if not count then
        if redis.call('exists', KEYS[1]) == 0 then
"#,
    wake_head_lua!(),
    r#"
        end
        return nil
    end
    redis.call('hincrby', KEYS[1], ARGV[1], -1)
    redis.call('set', KEYS[3], 0, 'px', ARGV[2])
    return 0
end
if #KEYS > 5 then
    redis.call('del', KEYS[1], unpack(KEYS, 6))
else
    redis.call('del', KEYS[1])
end
"#,
    wake_head_lua!(),
    r#"
redis.call('set', KEYS[3], 1, 'px', ARGV[2])
return 1
"#
);

/// Release the fair lock's hold whose latch is `latch` (see the reentrant
/// `release`).
pub(crate) fn release(
    keys: &LockKeys,
    queue: &QueueKeys,
    field: &str,
    latch: &str,
    spent: impl IntoIterator<Item = String>,
    now_ms: u64,
) -> Call<Released> {
    let mut invocation = RELEASE.key(&*keys.name);
    invocation
        .key(&keys.channel)
        .key(latch)
        .key(&queue.queue)
        .key(&queue.deadlines);
    for spent in spent {
        invocation.key(spent);
    }
    invocation
        .arg(field)
        .arg(UNLOCK_LATCH_TTL_MS)
        .arg(UNLOCK_MESSAGE)
        .arg(now_ms)
        .arg(keys.publish.command());
    Call::script(invocation, super::holds::decode_released)
}

/// KEYS[1] lock, KEYS[2] the lock's shared channel, KEYS[3] the request's
/// hold latch, KEYS[4] queue, KEYS[5] deadlines. ARGV[1] field, ARGV[2]
/// tombstone TTL (ms), ARGV[3] unlock message, ARGV[4] known holds,
/// ARGV[5] the request's wait (ms), ARGV[6] now (epoch ms), ARGV[7] (the
/// last) the publish command.
///
/// The reentrant rollback (see its script), and the request's queue entry,
/// if it made one, goes as a waiter that gives up; a deleted key wakes the
/// head of the queue.
pub(super) static ROLLBACK: LazyLock<Script> = LazyLock::new(|| Script::new(ROLLBACK_LUA));
pub(super) const ROLLBACK_LUA: &str = concat!(
    r#"
local queue, deadlines, now = KEYS[4], KEYS[5], tonumber(ARGV[6])
local prefix, field, wait = KEYS[2], ARGV[1], tonumber(ARGV[5])
local latch = redis.call('get', KEYS[3])
local count = redis.call('hget', KEYS[1], field)
if count and not tonumber(count) then
    return redis.error_reply('ERR the hold count of ' .. KEYS[1] .. ' is not a number')
end
"#,
    cancel_latch_lua!(),
    drop_stale_heads_lua!(),
    leave_queue_lua!(),
    r#"
local undo = count and (latch == 'granted' or (not latch and tonumber(count) > tonumber(ARGV[4])))
if not undo then
    if left == 1 and not count and redis.call('exists', KEYS[1]) == 0 then
"#,
    wake_head_lua!(),
    r#"
    end
    return nil
end
if redis.call('hincrby', KEYS[1], field, -1) > 0 then
    return 0
end
redis.call('del', KEYS[1])
"#,
    wake_head_lua!(),
    r#"
return 1
"#
);

/// Roll back fair acquire request `hold_id` of `field` (see the reentrant
/// `rollback`), taking its queue entry out too.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rollback(
    keys: &LockKeys,
    queue: &QueueKeys,
    field: &str,
    hold_id: &str,
    known_holds: u64,
    tombstone_ttl: Duration,
    wait: Duration,
    now_ms: u64,
) -> Call<Released> {
    let mut invocation = ROLLBACK.key(&*keys.name);
    invocation
        .key(&keys.channel)
        .key(keys.unlock_latch(hold_id))
        .key(&queue.queue)
        .key(&queue.deadlines)
        .arg(field)
        .arg(millis(tombstone_ttl).max(1))
        .arg(UNLOCK_MESSAGE)
        .arg(known_holds)
        .arg(millis(wait))
        .arg(now_ms)
        .arg(keys.publish.command());
    Call::script(invocation, super::holds::decode_released)
}

/// KEYS[1] lock, KEYS[2] the lock's shared channel, KEYS[3] queue, KEYS[4]
/// deadlines. ARGV[1] now (epoch ms), ARGV[2] unused, ARGV[3] unlock
/// message, ARGV[4] (the last) the publish command.
///
/// Deletes the lock whoever holds it and wakes the head of the queue. A key
/// that is not a hash is refused (WRONGTYPE). Reply: 1 when it existed.
pub(super) static FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(FORCE_UNLOCK_LUA));
pub(super) const FORCE_UNLOCK_LUA: &str = concat!(
    r#"
local queue, deadlines, now = KEYS[3], KEYS[4], tonumber(ARGV[1])
local prefix = KEYS[2]
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is a ' .. kind .. ', not a lock')
end
"#,
    drop_stale_heads_lua!(),
    r#"
if redis.call('del', KEYS[1]) == 0 then
    return 0
end
"#,
    wake_head_lua!(),
    r#"
return 1
"#
);

/// Delete the fair lock whoever holds it, and wake the head of its queue.
pub(crate) fn force_unlock(keys: &LockKeys, queue: &QueueKeys, now_ms: u64) -> Call<bool> {
    let mut invocation = FORCE_UNLOCK.key(&*keys.name);
    invocation
        .key(&keys.channel)
        .key(&queue.queue)
        .key(&queue.deadlines)
        .arg(now_ms)
        .arg("")
        .arg(UNLOCK_MESSAGE)
        .arg(keys.publish.command());
    Call::script(invocation, |reply: Value| {
        Ok(<i64 as redis::FromRedisValue>::from_redis_value(reply)? == 1)
    })
}
