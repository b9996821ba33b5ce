//! The read-write lock's scripts (Redisson's `getReadWriteLock`): one hash
//! named after the lock, with `mode` (`read` or `write`), a count per
//! reader field `<client-uuid>:<owner>`, and the writer's count under
//! `<client-uuid>:<owner>:write`; one expiring key per read hold,
//! `{name}:<field>:rwlock_timeout:<n>`; one channel for both,
//! `redisson_rwlock:{name}`, where a read release that frees the lock
//! publishes `0` and a write release `1`.
//!
//! Reads share; a write excludes everything, even the writer's own reads
//! taken before it (no upgrade: refused with a reply of its own); the writer
//! may take reads, and releasing its write then downgrades the lock to
//! `read` without a publish. Every script keeps the reentrant lock's rules
//! for the request's latch (a rollback's tombstone refuses, a re-entry
//! writes `granted`) and the idempotent release.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{FromRedisValue, Script, Value};

use super::holds::{
    cancel_latch_lua, decode_released, fencing_args, grant_lua, latched_release_lua,
    tagged_name_lua,
};
use super::read_keys::{
    downgrade_or_free_lua, drop_read_hold_lua, longest_read_timeout_lua, reads_alive_lua,
    settle_read_hash_lua,
};
use super::{Acquired, Call, Fencing, LockKeys, Released, parse_acquired};
use crate::timing::millis;

/// Published when a read release frees the lock.
pub(crate) const READ_UNLOCK_MESSAGE: &str = "0";
/// Published when a write release frees the lock: wakes every waiter.
pub(crate) const WRITE_UNLOCK_MESSAGE: &str = "1";

/// How long a release's result stays in its latch (as the reentrant lock's).
const UNLOCK_LATCH_TTL_MS: u64 = 10_000;

/// The writer's field of the reader field `field`.
pub(crate) fn write_field(field: &str) -> String {
    let mut write = String::with_capacity(field.len() + 6);
    write.push_str(field);
    write.push_str(":write");
    write
}

/// The reader field of the writer field `field` (`<reader field>:write`).
pub(crate) fn reader_field(field: &str) -> &str {
    field.strip_suffix(":write").unwrap_or(field)
}

/// Whether the lock is held in write mode (`write`) or in read mode, as
/// Redisson's write and read locks each report `isLocked`.
pub(crate) fn is_locked_in(keys: &LockKeys, write: bool) -> Call<bool> {
    fn mode(reply: Value) -> redis::RedisResult<Option<String>> {
        Ok(Option::<String>::from_redis_value(reply)?)
    }
    let mut cmd = redis::cmd("HGET");
    cmd.arg(&*keys.name).arg("mode");
    if write {
        Call::command(cmd, |reply| Ok(mode(reply)?.as_deref() == Some("write")))
    } else {
        Call::command(cmd, |reply| Ok(mode(reply)?.as_deref() == Some("read")))
    }
}

/// The prefix of `field`'s read timeout keys: `{name}:<field>:rwlock_timeout`
/// (`:<n>` is added per hold).
pub(crate) fn read_timeouts(keys: &LockKeys, field: &str) -> String {
    let name = &*keys.name;
    let mut prefix = String::with_capacity(name.len() + field.len() + 20);
    if name.contains('{') {
        prefix.push_str(name);
    } else {
        prefix.push('{');
        prefix.push_str(name);
        prefix.push('}');
    }
    prefix.push(':');
    prefix.push_str(field);
    prefix.push_str(":rwlock_timeout");
    prefix
}

/// KEYS[1] lock, KEYS[2] this request's hold latch, KEYS[3] the field's
/// read timeout prefix. ARGV[1] lease (ms), ARGV[2] reader field, ARGV[3]
/// its writer field.
///
/// Granted when the hash is absent (mode becomes `read`), in `read` mode,
/// or in `write` mode to the writer itself (the mode stays). Each hold
/// writes its own timeout key (`:<count>`, PX lease); the hash lives at
/// least the lease. Reply as the reentrant acquire's (no fencing: reads
/// are shared), with the hold's own TTL (the lease) as the TTL after.
pub(super) static READ_ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(READ_ACQUIRE_LUA));
pub(super) const READ_ACQUIRE_LUA: &str = r#"
local mode = redis.call('hget', KEYS[1], 'mode')
-- A hash without `mode` is not a read-write lock's, but it is there.
local exists = mode ~= false or redis.call('exists', KEYS[1]) == 1
if exists and not (mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1)) then
    return redis.call('pttl', KEYS[1])
end
local latch = redis.call('get', KEYS[2])
if latch then
    return -3
end
local held = redis.call('hget', KEYS[1], ARGV[2])
if held and not tonumber(held) then
    return redis.error_reply('ERR the hold count of ' .. KEYS[1] .. ' is not a number')
end
local count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
if not exists then
    redis.call('hset', KEYS[1], 'mode', 'read')
end
local lease = tonumber(ARGV[1])
redis.call('set', KEYS[3] .. ':' .. count, KEYS[2], 'px', lease)
local ttl = lease
if exists then
    -- Only a re-entry needs its latch: a first read hold of this field is
    -- known to its rollback by the count, whoever else reads.
    if count > 1 then
        redis.call('set', KEYS[2], 'granted', 'px', math.min(lease, 60000))
    end
    if redis.call('pttl', KEYS[1]) < lease then
        redis.call('pexpire', KEYS[1], lease)
    end
    -- The hold's own TTL, not the hash's: another reader's release sets the
    -- hash's TTL to the longest read timeout key left, never below this
    -- hold's, but maybe below what the hash has now.
    return {lease, count, -1}
end
redis.call('pexpire', KEYS[1], lease)
return nil
"#;

/// Acquire a read hold of `keys` for `field`, as hold `hold_id`.
pub(crate) fn read_acquire(
    keys: &LockKeys,
    field: &str,
    lease: Duration,
    hold_id: &str,
) -> Call<Acquired> {
    let mut invocation = READ_ACQUIRE.key(&*keys.name);
    invocation
        .key(keys.unlock_latch(hold_id))
        .key(read_timeouts(keys, field))
        .arg(millis(lease))
        .arg(field)
        .arg(write_field(field));
    Call::script(invocation, |reply| Ok(parse_acquired(reply)?))
}

/// KEYS[1] lock, KEYS[2] the field's read timeout prefix. ARGV[1] reader
/// field. Reply: how many of the field's read holds are alive (their
/// timeout key exists); a read hold whose key expired is not counted,
/// whatever the field's count says.
pub(super) static READ_HOLD_COUNT: LazyLock<Script> =
    LazyLock::new(|| Script::new(READ_HOLD_COUNT_LUA));
pub(super) const READ_HOLD_COUNT_LUA: &str = r#"
local count = tonumber(redis.call('hget', KEYS[1], ARGV[1])) or 0
local alive = 0
for n = 1, count do
    alive = alive + redis.call('exists', KEYS[2] .. ':' .. n)
end
return alive
"#;

/// How many live read holds `field` has of `keys`.
pub(crate) fn read_hold_count(keys: &LockKeys, field: &str) -> Call<u32> {
    let mut invocation = READ_HOLD_COUNT.key(&*keys.name);
    invocation.key(read_timeouts(keys, field)).arg(field);
    Call::script(invocation, |reply| Ok(u32::from_redis_value(reply)?))
}

/// KEYS[1] lock, KEYS[2] this request's hold latch, KEYS[3] token counter
/// (fenced only). ARGV[1] lease (ms), ARGV[2] writer field, ARGV[3] its
/// reader field, ARGV[4] fencing (as the reentrant acquire's ARGV[3]),
/// ARGV[5] floor.
///
/// Granted when the hash is absent (mode becomes `write`) or to the writer
/// itself in `write` mode; never while any read field exists. A caller that
/// holds live reads of the lock gets -4 (no upgrade: it would wait for
/// itself).
/// Reply otherwise as the reentrant acquire's.
pub(super) static WRITE_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(WRITE_ACQUIRE_LUA));
pub(super) const WRITE_ACQUIRE_LUA: &str = concat!(
    r#"
local mode = redis.call('hget', KEYS[1], 'mode')
local exists = redis.call('exists', KEYS[1]) == 1
if exists and not (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    local count = mode == 'read' and tonumber(redis.call('hget', KEYS[1], ARGV[3]))
    if count then
        local key = KEYS[1]
"#,
    tagged_name_lua!(),
    r#"
        local prefix = tagged .. ':' .. ARGV[3] .. ':rwlock_timeout'
"#,
    reads_alive_lua!(),
    r#"
        -- Only live reads: a read hold whose keys expired is no hold.
        if reads_alive then
            return -4
        end
    end
    return redis.call('pttl', KEYS[1])
end
if redis.call('get', KEYS[2]) then
    return -3
end
local held = redis.call('hget', KEYS[1], ARGV[2])
if held and not tonumber(held) then
    return redis.error_reply('ERR the hold count of ' .. KEYS[1] .. ' is not a number')
end
local fencing, floor, token_key, mode_on_grant = ARGV[4], ARGV[5], KEYS[3], 'write'
"#,
    grant_lua!()
);

/// Acquire the write hold of `keys` for the writer field `field`
/// (`<reader field>:write`), as hold `hold_id`.
pub(crate) fn write_acquire(
    keys: &LockKeys,
    field: &str,
    lease: Duration,
    hold_id: &str,
    fencing: Fencing,
) -> Call<Acquired> {
    let mut invocation = WRITE_ACQUIRE.key(&*keys.name);
    invocation
        .key(keys.unlock_latch(hold_id))
        .arg(millis(lease))
        .arg(field)
        .arg(reader_field(field));
    fencing_args(&mut invocation, keys, fencing);
    Call::script(invocation, |reply| Ok(parse_acquired(reply)?))
}

/// KEYS[1] lock, KEYS[2] channel, KEYS[3] the hold's latch, KEYS[4] the
/// field's read timeout prefix, KEYS[5..] latches of earlier releases to
/// delete. ARGV[1] reader field, ARGV[2] latch TTL (ms), ARGV[3] the name
/// as keys are prefixed (`{name}`), ARGV[4] (the last) the publish command.
///
/// Releases the read hold whose latch is KEYS[3] (see the drop fragment).
/// Idempotent through the latch, as the reentrant release. Reply: the
/// latched result; nil when the hold is not there (its key expired, or the
/// field holds no read; the field's expired keys go all the same, and a
/// field left with none goes, the hash settled as a release would); 0 when
/// the lock is still held (by this owner's other reads, other readers, or
/// the writer); 1 when it was freed and `0` published.
pub(super) static READ_RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(READ_RELEASE_LUA));
pub(super) const READ_RELEASE_LUA: &str = concat!(
    r#"
local field, prefix, tagged = ARGV[1], KEYS[4], ARGV[3]
"#,
    latched_release_lua!(),
    r#"
if #KEYS > 4 then
    redis.call('del', unpack(KEYS, 5))
end
if latched then
    return latched
end
if not count then
    return nil
end
count = tonumber(count)
"#,
    drop_read_hold_lua!(),
    r#"
if not found then
    -- This hold had expired: not held (the field lost its dead keys).
    return nil
end
local result = freed and 1 or 0
redis.call('set', KEYS[3], result, 'px', ARGV[2])
return result
"#
);

/// Release the read hold whose latch is `latch` of `field`.
pub(crate) fn read_release(
    keys: &LockKeys,
    field: &str,
    latch: &str,
    spent: impl IntoIterator<Item = String>,
) -> Call<Released> {
    let mut invocation = READ_RELEASE.key(&*keys.name);
    invocation
        .key(&keys.channel)
        .key(latch)
        .key(read_timeouts(keys, field));
    for spent in spent {
        invocation.key(spent);
    }
    invocation
        .arg(field)
        .arg(UNLOCK_LATCH_TTL_MS)
        .arg(tagged(keys))
        .arg(keys.publish.command());
    Call::script(invocation, decode_released)
}

/// KEYS[1] lock, KEYS[2] channel, KEYS[3] the hold's latch, KEYS[4..]
/// latches of earlier releases to delete. ARGV[1] writer field, ARGV[2]
/// latch TTL (ms), ARGV[3] (the last) the publish command.
///
/// Releases one write hold. The last one frees the lock and publishes `1`,
/// or, when the writer still holds live reads, downgrades it to `read`
/// without a publish (see the downgrade fragment). Reply as the read
/// release's.
pub(super) static WRITE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(WRITE_RELEASE_LUA));
pub(super) const WRITE_RELEASE_LUA: &str = concat!(
    r#"
"#,
    latched_release_lua!(),
    r#"
if #KEYS > 3 then
    redis.call('del', unpack(KEYS, 4))
end
if latched then
    return latched
end
if not count then
    return nil
end
if tonumber(count) > 1 then
    redis.call('hincrby', KEYS[1], ARGV[1], -1)
    redis.call('set', KEYS[3], 0, 'px', ARGV[2])
    return 0
end
redis.call('hdel', KEYS[1], ARGV[1])
local result = 1
"#,
    downgrade_or_free_lua!(),
    r#"
redis.call('set', KEYS[3], result, 'px', ARGV[2])
return result
"#
);

/// Release the write hold whose latch is `latch` of the writer field
/// `field`.
pub(crate) fn write_release(
    keys: &LockKeys,
    field: &str,
    latch: &str,
    spent: impl IntoIterator<Item = String>,
) -> Call<Released> {
    let mut invocation = WRITE_RELEASE.key(&*keys.name);
    invocation.key(&keys.channel).key(latch);
    for spent in spent {
        invocation.key(spent);
    }
    invocation
        .arg(field)
        .arg(UNLOCK_LATCH_TTL_MS)
        .arg(keys.publish.command());
    Call::script(invocation, decode_released)
}

/// KEYS[1] lock, KEYS[2] channel, KEYS[3] the request's hold latch,
/// KEYS[4] the field's read timeout prefix. ARGV[1] reader field, ARGV[2]
/// tombstone TTL (ms), ARGV[3] the name as keys are prefixed, ARGV[4]
/// unused (a read hold is known by its key, not by counts), ARGV[5] (the
/// last) the publish command.
///
/// Undoes the read acquire whose latch is KEYS[3], only if it was applied
/// and its hold is still there (its timeout key holds the latch's name),
/// as a read release would; the latch becomes a tombstone either way, as
/// in the reentrant rollback. Reply: nil when nothing was undone; 0 or 1
/// as for a release.
pub(super) static READ_ROLLBACK: LazyLock<Script> =
    LazyLock::new(|| Script::new(READ_ROLLBACK_LUA));
pub(super) const READ_ROLLBACK_LUA: &str = concat!(
    r#"
local field, prefix, tagged = ARGV[1], KEYS[4], ARGV[3]
local count = redis.call('hget', KEYS[1], field)
if count and not tonumber(count) then
    return redis.error_reply('ERR the hold count of ' .. KEYS[1] .. ' is not a number')
end
"#,
    cancel_latch_lua!(),
    r#"
if not count then
    return nil
end
count = tonumber(count)
"#,
    drop_read_hold_lua!(),
    r#"
if not found then
    return nil
end
if freed then
    return 1
end
return 0
"#
);

/// KEYS[1] lock, KEYS[2] channel, KEYS[3] the request's hold latch.
/// ARGV[1] writer field, ARGV[2] tombstone TTL (ms), ARGV[3] unused,
/// ARGV[4] the write holds of the field this client knows of on this node,
/// ARGV[5] (the last) the publish command.
///
/// The reentrant rollback's rule, for a write hold: the last one undone
/// frees the lock (publishing `1`), or downgrades it to the writer's reads.
pub(super) static WRITE_ROLLBACK: LazyLock<Script> =
    LazyLock::new(|| Script::new(WRITE_ROLLBACK_LUA));
pub(super) const WRITE_ROLLBACK_LUA: &str = concat!(
    r#"
local latch = redis.call('get', KEYS[3])
local count = redis.call('hget', KEYS[1], ARGV[1])
if count and not tonumber(count) then
    return redis.error_reply('ERR the hold count of ' .. KEYS[1] .. ' is not a number')
end
"#,
    cancel_latch_lua!(),
    r#"
if not count then
    return nil
end
if latch ~= 'granted' and (latch or tonumber(count) <= tonumber(ARGV[4])) then
    return nil
end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
    return 0
end
redis.call('hdel', KEYS[1], ARGV[1])
"#,
    downgrade_or_free_lua!(),
    r#"
if freed then
    return 1
end
return 0
"#
);

/// Roll back read (`write` false) or write acquire request `hold_id` of
/// the hold field `field` (a reader's, or a writer's `…:write`; see the
/// reentrant `rollback`).
pub(crate) fn rollback(
    keys: &LockKeys,
    field: &str,
    write: bool,
    hold_id: &str,
    known_holds: u64,
    tombstone_ttl: Duration,
) -> Call<Released> {
    let mut invocation = if write {
        WRITE_ROLLBACK.key(&*keys.name)
    } else {
        READ_ROLLBACK.key(&*keys.name)
    };
    invocation
        .key(&keys.channel)
        .key(keys.unlock_latch(hold_id));
    if write {
        invocation.arg(field);
    } else {
        invocation.key(read_timeouts(keys, field)).arg(field);
    }
    invocation
        .arg(millis(tombstone_ttl).max(1))
        .arg(tagged(keys))
        .arg(known_holds)
        .arg(keys.publish.command());
    Call::script(invocation, decode_released)
}

/// KEYS[1] lock, KEYS[2] channel. ARGV[1] the mode it acts in (`read` or
/// `write`), ARGV[2] the message to publish, ARGV[3] (the last) the publish
/// command.
///
/// Deletes the lock only while it is in that mode (Redisson's force unlock
/// of a read lock or a write lock). A key that is not a hash is refused
/// (WRONGTYPE). Reply: 1 when it was deleted.
pub(super) static FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(FORCE_UNLOCK_LUA));
pub(super) const FORCE_UNLOCK_LUA: &str = r#"
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
    return 0
end
if kind ~= 'hash' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is a ' .. kind .. ', not a lock')
end
if redis.call('hget', KEYS[1], 'mode') ~= ARGV[1] then
    return 0
end
redis.call('del', KEYS[1])
redis.call(ARGV[#ARGV], KEYS[2], ARGV[2])
return 1
"#;

/// Delete the read-write lock if it is in the mode of the read (`write`
/// false) or the write lock, whoever holds it, and wake its waiters.
pub(crate) fn force_unlock(keys: &LockKeys, write: bool) -> Call<bool> {
    let (mode, message) = if write {
        ("write", WRITE_UNLOCK_MESSAGE)
    } else {
        ("read", READ_UNLOCK_MESSAGE)
    };
    let mut invocation = FORCE_UNLOCK.key(&*keys.name);
    invocation
        .key(&keys.channel)
        .arg(mode)
        .arg(message)
        .arg(keys.publish.command());
    Call::script(invocation, |reply: Value| {
        Ok(<i64 as redis::FromRedisValue>::from_redis_value(reply)? == 1)
    })
}

/// The lock's name as its keys are prefixed: `{name}`, or the name when it
/// carries a hash tag.
fn tagged(keys: &LockKeys) -> String {
    if keys.name.contains('{') {
        keys.name.to_string()
    } else {
        format!("{{{}}}", keys.name)
    }
}
