//! The Lua scripts and key names of Redisson's lock protocol.
//!
//! The data layout is the contract shared with Java (Redisson) and Node
//! services: the lock is a hash named after the lock, whose field
//! `<client-uuid>:<owner>` holds the hold count; unlocks publish `0` on
//! `redisson_lock__channel:{name}`. The scripts are our own; their behaviour
//! is Redisson's.

use std::sync::LazyLock;

use redis::Script;

/// Message published on the lock's channel when it is released.
pub(crate) const UNLOCK_MESSAGE: &str = "0";

/// How long an unlock latch lives: long enough for a retried release.
pub(crate) const UNLOCK_LATCH_TTL_MS: u64 = 10_000;

/// Redisson's `prefixName`: `prefix:{name}`, or `prefix:name` when the name
/// already carries a hash tag.
fn prefixed(prefix: &str, name: &str) -> String {
    if name.contains('{') {
        format!("{prefix}:{name}")
    } else {
        format!("{prefix}:{{{name}}}")
    }
}

/// The pub/sub channel waiters listen on.
pub(crate) fn channel_name(lock: &str) -> String {
    prefixed("redisson_lock__channel", lock)
}

/// The fencing token counter (Redisson's fenced lock).
pub(crate) fn token_key(lock: &str) -> String {
    prefixed("redisson_lock_token", lock)
}

/// The key that remembers one release's result, so a retried release with the
/// same request id returns the first answer.
pub(crate) fn unlock_latch_key(lock: &str, request_id: &str) -> String {
    format!("{}:{request_id}", prefixed("redisson_unlock_latch", lock))
}

/// Acquire.
///
/// KEYS[1] lock key. ARGV[1] lease (ms), ARGV[2] field.
/// Reply: nil when granted (or re-entered); else the key's PTTL in ms
/// (-1 when the key has no expiry).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
const ACQUIRE_LUA: &str = r#"
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
return redis.call('pttl', KEYS[1])
"#;

/// Acquire with a fencing token (Redisson's fenced lock).
///
/// KEYS[1] lock key, KEYS[2] token counter. ARGV[1] lease (ms), ARGV[2] field.
/// Reply: `{1, token}` when granted (the counter is INCRed on every grant,
/// re-entries included, as Redisson's `RedissonFencedLock` does), `{0, pttl}`
/// otherwise.
pub(crate) static ACQUIRE_FENCED: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_FENCED_LUA));
const ACQUIRE_FENCED_LUA: &str = r#"
local exists = redis.call('exists', KEYS[1])
if (exists == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    local token = redis.call('incr', KEYS[2])
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, token}
end
return {0, redis.call('pttl', KEYS[1])}
"#;

/// Raise a fencing counter to at least a value (multi-node fencing: every
/// granted node's counter reaches the token handed out).
///
/// KEYS[1] token counter. ARGV[1] minimum. Reply: the counter afterwards.
pub(crate) static RAISE_TOKEN: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_TOKEN_LUA));
const RAISE_TOKEN_LUA: &str = r#"
local current = tonumber(redis.call('get', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if current < wanted then
    redis.call('set', KEYS[1], ARGV[1])
    return wanted
end
return current
"#;

/// Release (idempotent through the unlock latch).
///
/// KEYS[1] lock key, KEYS[2] channel, KEYS[3] unlock latch.
/// ARGV[1] lease (ms), ARGV[2] field, ARGV[3] latch TTL (ms), ARGV[4] unlock message.
/// Reply: the latched result when this request already ran; nil when the
/// field is absent (not the holder); 0 when the count is still above zero
/// (the lease is refreshed); 1 when the key was deleted and `0` published.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
const RELEASE_LUA: &str = r#"
local latched = redis.call('get', KEYS[3])
if latched ~= false then
    return tonumber(latched)
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return nil
end
local count = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if count > 0 then
    redis.call('pexpire', KEYS[1], ARGV[1])
    redis.call('set', KEYS[3], 0, 'px', ARGV[3])
    return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[4])
redis.call('set', KEYS[3], 1, 'px', ARGV[3])
return 1
"#;

/// Renew many locks on one node in one call (the watchdog's batch).
///
/// KEYS[i] lock key i. ARGV[1] lease (ms), ARGV[i+1] field i.
/// Reply: one integer per key, 1 when renewed, 0 when the field is gone.
pub(crate) static RENEW_BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_BATCH_LUA));
const RENEW_BATCH_LUA: &str = r#"
local renewed = {}
for i = 1, #KEYS do
    if redis.call('hexists', KEYS[i], ARGV[i + 1]) == 1 then
        redis.call('pexpire', KEYS[i], ARGV[1])
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
"#;

/// Force unlock, whoever holds the lock.
///
/// KEYS[1] lock key, KEYS[2] channel. ARGV[1] unlock message.
/// Reply: 1 when the key existed (and `0` was published), else 0.
pub(crate) static FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(FORCE_UNLOCK_LUA));
const FORCE_UNLOCK_LUA: &str = r#"
if redis.call('del', KEYS[1]) == 1 then
    redis.call('publish', KEYS[2], ARGV[1])
    return 1
end
return 0
"#;

/// Every script as (name, source, script), for tests that check hashes
/// against `SCRIPT LOAD`.
#[cfg(any(test, feature = "testkit"))]
pub(crate) fn all() -> [(&'static str, &'static str, &'static Script); 6] {
    [
        ("acquire", ACQUIRE_LUA, &ACQUIRE),
        ("acquire_fenced", ACQUIRE_FENCED_LUA, &ACQUIRE_FENCED),
        ("raise_token", RAISE_TOKEN_LUA, &RAISE_TOKEN),
        ("release", RELEASE_LUA, &RELEASE),
        ("renew_batch", RENEW_BATCH_LUA, &RENEW_BATCH),
        ("force_unlock", FORCE_UNLOCK_LUA, &FORCE_UNLOCK),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_follow_redisson() {
        assert_eq!(
            channel_name("orders:42"),
            "redisson_lock__channel:{orders:42}"
        );
        assert_eq!(channel_name("a{b}c"), "redisson_lock__channel:a{b}c");
        assert_eq!(token_key("x"), "redisson_lock_token:{x}");
        assert_eq!(unlock_latch_key("x", "r1"), "redisson_unlock_latch:{x}:r1");
    }

    #[test]
    fn hashes_are_distinct_sha1() {
        let hashes: std::collections::HashSet<_> = all()
            .iter()
            .map(|(_, _, s)| s.get_hash().to_owned())
            .collect();
        assert_eq!(hashes.len(), all().len());
        assert!(hashes.iter().all(|h| h.len() == 40));
    }
}
