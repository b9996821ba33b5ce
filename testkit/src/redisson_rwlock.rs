//! Redisson 3.24+'s read-write lock (`getReadWriteLock`, `readLock()` /
//! `writeLock()`) as a Redisson client sends it, written from the wire facts
//! and not from this crate's scripts: the foreign client of interop tests,
//! and a limit for the benchmark.
//!
//! One hash per lock: `mode` -> `read` or `write`, each reader's field
//! `<uuid>:<owner>` -> its read count, the writer's [`write_field`] -> its
//! write count. Each read hold n also has its own key [`read_timeout`],
//! with that hold's lease. Readers and writers share one channel,
//! [`channel`]: a write release publishes `1` (wake all), the last read
//! release `0`. Releases go through the unlock latch of
//! [`redisson::unlock_latch`], as the reentrant lock's.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use multilock_testkit::{redisson, redisson_rwlock};
//!
//! # async fn demo(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<()> {
//! let field = "6f1c0e9a-1111-2222-3333-444455556666:1";
//! let lease = Duration::from_secs(30);
//! let read: Option<i64> = redisson_rwlock::read_acquire("orders:42", field, lease)
//!     .invoke_async(conn)
//!     .await?;
//! assert_eq!(read, None, "granted");
//! let request = redisson::new_request_id();
//! let released: Option<i64> = redisson_rwlock::read_release("orders:42", field, &request)
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

use redis::{Script, ScriptInvocation};

use super::redisson;

/// The message of a read release: one waiter may enter.
const READ_RELEASED: i64 = 0;

/// The message of a write release: every waiter may try.
const WRITE_RELEASED: i64 = 1;

/// KEYS[1] lock, KEYS[2] the caller's timeout prefix
/// (`{name}:<field>:rwlock_timeout`). ARGV[1] lease (ms), ARGV[2] field,
/// ARGV[3] write field. Reply: nil when granted, else the lock's PTTL.
static READ_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local mode = redis.call('hget', KEYS[1], 'mode');
if mode == false then
    redis.call('hset', KEYS[1], 'mode', 'read');
    redis.call('hset', KEYS[1], ARGV[2], 1);
    redis.call('set', KEYS[2] .. ':1', 1, 'px', ARGV[1]);
    redis.call('pexpire', KEYS[1], ARGV[1]);
    return nil;
end;
if mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
    local n = redis.call('hincrby', KEYS[1], ARGV[2], 1);
    redis.call('set', KEYS[2] .. ':' .. n, 1, 'px', ARGV[1]);
    local remaining = redis.call('pttl', KEYS[1]);
    redis.call('pexpire', KEYS[1], math.max(remaining, tonumber(ARGV[1])));
    return nil;
end;
return redis.call('pttl', KEYS[1]);
"#,
    )
});

/// KEYS[1] lock. ARGV[1] lease (ms), ARGV[2] write field. Reply: nil when
/// granted (or re-entered), else the lock's PTTL.
static WRITE_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local mode = redis.call('hget', KEYS[1], 'mode');
if mode == false then
    redis.call('hset', KEYS[1], 'mode', 'write');
    redis.call('hset', KEYS[1], ARGV[2], 1);
    redis.call('pexpire', KEYS[1], ARGV[1]);
    return nil;
end;
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1);
    local remaining = redis.call('pttl', KEYS[1]);
    redis.call('pexpire', KEYS[1], remaining + tonumber(ARGV[1]));
    return nil;
end;
return redis.call('pttl', KEYS[1]);
"#,
    )
});

/// KEYS[1] lock, KEYS[2] channel, KEYS[3] the caller's timeout prefix,
/// KEYS[4] the key prefix `{name}`, KEYS[5] unlock latch. ARGV[1] message,
/// ARGV[2] field, ARGV[3] publish command, ARGV[4] latch TTL (ms). Reply:
/// the latched result when this unlock already ran; nil not held (a hash
/// already gone is still published and latched as 1); 0 other holds remain;
/// 1 deleted and published.
static READ_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local val = redis.call('get', KEYS[5]);
if val ~= false then
    return tonumber(val);
end;
local mode = redis.call('hget', KEYS[1], 'mode');
if mode == false then
    redis.call(ARGV[3], KEYS[2], ARGV[1]);
    redis.call('set', KEYS[5], 1, 'px', ARGV[4]);
    return nil;
end;
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return nil;
end;
local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1);
if counter == 0 then
    redis.call('hdel', KEYS[1], ARGV[2]);
end;
redis.call('del', KEYS[3] .. ':' .. (counter + 1));
if redis.call('hlen', KEYS[1]) > 1 then
    local longest = -3;
    local fields = redis.call('hkeys', KEYS[1]);
    for _, field in ipairs(fields) do
        local holds = tonumber(redis.call('hget', KEYS[1], field));
        if type(holds) == 'number' then
            for i = holds, 1, -1 do
                local remaining = redis.call('pttl', KEYS[4] .. ':' .. field .. ':rwlock_timeout:' .. i);
                longest = math.max(remaining, longest);
            end;
        end;
    end;
    if longest > 0 then
        redis.call('pexpire', KEYS[1], longest);
        redis.call('set', KEYS[5], 0, 'px', ARGV[4]);
        return 0;
    end;
    if mode == 'write' then
        redis.call('set', KEYS[5], 0, 'px', ARGV[4]);
        return 0;
    end;
end;
redis.call('del', KEYS[1]);
redis.call(ARGV[3], KEYS[2], ARGV[1]);
redis.call('set', KEYS[5], 1, 'px', ARGV[4]);
return 1;
"#,
    )
});

/// KEYS[1] lock, KEYS[2] channel, KEYS[3] unlock latch. ARGV[1] message,
/// ARGV[2] lease (ms), ARGV[3] write field, ARGV[4] publish command, ARGV[5]
/// latch TTL (ms). Reply: the latched result when this unlock already ran;
/// nil not held (a hash already gone is still published and latched as 1);
/// 0 still held (the lease renewed); 1 released (deleted and published, or
/// downgraded to read).
static WRITE_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local val = redis.call('get', KEYS[3]);
if val ~= false then
    return tonumber(val);
end;
local mode = redis.call('hget', KEYS[1], 'mode');
if mode == false then
    redis.call(ARGV[4], KEYS[2], ARGV[1]);
    redis.call('set', KEYS[3], 1, 'px', ARGV[5]);
    return nil;
end;
if mode ~= 'write' or redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil;
end;
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1);
if counter > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2]);
    redis.call('set', KEYS[3], 0, 'px', ARGV[5]);
    return 0;
end;
redis.call('hdel', KEYS[1], ARGV[3]);
if redis.call('hlen', KEYS[1]) == 1 then
    redis.call('del', KEYS[1]);
    redis.call(ARGV[4], KEYS[2], ARGV[1]);
else
    redis.call('hset', KEYS[1], 'mode', 'read');
end;
redis.call('set', KEYS[3], 1, 'px', ARGV[5]);
return 1;
"#,
    )
});

/// KEYS[1] lock, KEYS[2] the key prefix `{name}`. ARGV[1] lease (ms),
/// ARGV[2] field. Reply: 1 renewed, 0 the owner holds no read.
static RENEW_READS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local holds = redis.call('hget', KEYS[1], ARGV[2]);
if holds == false then
    return 0;
end;
for i = tonumber(holds), 1, -1 do
    redis.call('pexpire', KEYS[2] .. ':' .. ARGV[2] .. ':rwlock_timeout:' .. i, ARGV[1]);
end;
redis.call('pexpire', KEYS[1], ARGV[1]);
return 1;
"#,
    )
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

/// The prefix of `field`'s read timeout keys: `{name}:<field>:rwlock_timeout`.
fn timeout_prefix(name: &str, field: &str) -> String {
    format!("{}:{field}:rwlock_timeout", tagged(name))
}

/// The channel readers and writers of read-write lock `name` share:
/// `redisson_rwlock:{name}`.
pub fn channel(name: &str) -> String {
    format!("redisson_rwlock:{}", tagged(name))
}

/// The timeout key of read hold `n` (1-based) of `field` on read-write lock
/// `name`: `{name}:<field>:rwlock_timeout:<n>`, a string `1` with that
/// hold's lease.
pub fn read_timeout(name: &str, field: &str, n: u32) -> String {
    format!("{}:{n}", timeout_prefix(name, field))
}

/// The hash field of `field`'s write holds: `<field>:write`.
pub fn write_field(field: &str) -> String {
    format!("{field}:write")
}

/// The read-acquire script call of `field` (`<client-uuid>:<thread-id>`) on
/// read-write lock `name` with `lease`.
///
/// KEYS: the lock, `{name}:<field>:rwlock_timeout`. ARGV: lease (ms), field,
/// [`write_field`]. Granted when the hash is absent (sets `mode` read), when
/// `mode` is read, or when it is write and the caller holds the write lock
/// (mode stays write); each grant adds read hold n and its key
/// [`read_timeout`] with `lease`, and makes the hash's TTL max(PTTL, lease).
///
/// Reply: nil when granted, else the lock's PTTL.
pub fn read_acquire(name: &str, field: &str, lease: Duration) -> ScriptInvocation<'static> {
    let mut invocation = READ_ACQUIRE.key(name);
    invocation
        .key(timeout_prefix(name, field))
        .arg(lease.as_millis() as u64)
        .arg(field)
        .arg(write_field(field));
    invocation
}

/// The write-acquire script call of `field` (its hash field is
/// [`write_field`]) on read-write lock `name` with `lease`.
///
/// KEYS: the lock. ARGV: lease (ms), [`write_field`]. Granted when the hash
/// is absent (sets `mode` write, TTL `lease`) or on re-entry by the writer
/// (TTL becomes PTTL + `lease`); never while a read hold exists, not even
/// the caller's own (no upgrade).
///
/// Reply: nil when granted, else the lock's PTTL.
pub fn write_acquire(name: &str, field: &str, lease: Duration) -> ScriptInvocation<'static> {
    let mut invocation = WRITE_ACQUIRE.key(name);
    invocation
        .arg(lease.as_millis() as u64)
        .arg(write_field(field));
    invocation
}

/// The read-unlock script call of `field` on read-write lock `name`, as
/// unlock request `request_id` (resent with the same id, it returns the
/// first result). Redisson's read unlock sends no lease.
///
/// KEYS: the lock, [`channel`], `{name}:<field>:rwlock_timeout`, `{name}`,
/// the unlock latch. ARGV: message `0`, field, `publish`, latch TTL (ms).
/// Reads the latch first; deletes the caller's highest-numbered
/// [`read_timeout`]. While other fields remain, the hash's TTL becomes the
/// longest remaining among all readers' timeout keys and nothing is
/// published (in write mode with none left it replies 0); otherwise the
/// hash is deleted and `0` published. A hash already gone is still
/// published. Send [`redisson::delete_latch`] after the reply.
///
/// Reply: nil (not held, or already gone), 0 (holds remain) or 1 (deleted
/// and published).
pub fn read_release(name: &str, field: &str, request_id: &str) -> ScriptInvocation<'static> {
    let mut invocation = READ_RELEASE.key(name);
    invocation
        .key(channel(name))
        .key(timeout_prefix(name, field))
        .key(tagged(name))
        .key(redisson::unlock_latch(name, request_id))
        .arg(READ_RELEASED)
        .arg(field)
        .arg("publish")
        .arg(redisson::UNLOCK_LATCH_TTL.as_millis() as u64);
    invocation
}

/// The write-unlock script call of `field` on read-write lock `name`, as
/// unlock request `request_id` (resent with the same id, it returns the
/// first result); a write hold that remains is renewed to `lease`.
///
/// KEYS: the lock, [`channel`], the unlock latch. ARGV: message `1`, lease
/// (ms), [`write_field`], `publish`, latch TTL (ms). Reads the latch first.
/// The last write hold: if the caller's read holds remain, `mode` becomes
/// read (a downgrade, nothing published); else the hash is deleted and `1`
/// published. A hash already gone is still published. Send
/// [`redisson::delete_latch`] after the reply.
///
/// Reply: nil (not held, or already gone), 0 (still held) or 1 (released).
pub fn write_release(
    name: &str,
    field: &str,
    request_id: &str,
    lease: Duration,
) -> ScriptInvocation<'static> {
    let mut invocation = WRITE_RELEASE.key(name);
    invocation
        .key(channel(name))
        .key(redisson::unlock_latch(name, request_id))
        .arg(WRITE_RELEASED)
        .arg(lease.as_millis() as u64)
        .arg(write_field(field))
        .arg("publish")
        .arg(redisson::UNLOCK_LATCH_TTL.as_millis() as u64);
    invocation
}

/// The watchdog's read renewal of `field` on read-write lock `name` to
/// `lease` (Redisson 4.4+): the hash and only this owner's own timeout
/// keys, so a crashed reader's holds still expire.
///
/// KEYS: the lock, `{name}`. ARGV: lease (ms), field. Reply: 1 renewed, 0
/// the owner holds no read.
pub fn renew_reads(name: &str, field: &str, lease: Duration) -> ScriptInvocation<'static> {
    let mut invocation = RENEW_READS.key(name);
    invocation
        .key(tagged(name))
        .arg(lease.as_millis() as u64)
        .arg(field);
    invocation
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_redisson_naming() {
        assert_eq!(channel("orders:42"), "redisson_rwlock:{orders:42}");
        assert_eq!(
            read_timeout("orders:42", "u:1", 2),
            "{orders:42}:u:1:rwlock_timeout:2"
        );
        assert_eq!(write_field("u:1"), "u:1:write");
        assert_eq!(channel("a{b}c"), "redisson_rwlock:a{b}c");
        assert_eq!(
            read_timeout("a{b}c", "u:1", 1),
            "a{b}c:u:1:rwlock_timeout:1"
        );
    }
}
