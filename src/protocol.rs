//! The wire contract: Redisson's lock protocol, built in one place.
//!
//! The data layout is the contract shared with Java (Redisson) and Node
//! services: the lock is a hash named after the lock, whose field
//! `<client-uuid>:<owner>` holds the hold count; unlocks publish `0` on
//! `redisson_lock__channel:{name}`. The scripts are our own; their behaviour
//! is Redisson's.
//!
//! Every script call is built here by a function named after the operation
//! ([`acquire`], [`release`], [`renew_batch`], ...), which fixes the KEYS and
//! ARGV order and how the reply is decoded. Nothing else in the crate (nor
//! the benchmark, which reaches these through `testkit::protocol`) writes a
//! key or an argument of a lock script.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, FromRedisValue, RedisResult, Script, ScriptInvocation, Value};

use crate::timing::{millis, ttl_from_pttl};

/// Message published on the lock's channel when it is released.
const UNLOCK_MESSAGE: &str = "0";

/// How long an unlock latch lives: long enough for a retried release.
const UNLOCK_LATCH_TTL_MS: u64 = 10_000;

/// One request of the protocol and how to read its reply.
pub(crate) struct Call<R> {
    pub(crate) request: Request,
    decode: fn(Value) -> RedisResult<R>,
}

/// What goes on the wire: a script (EVALSHA, loaded on NOSCRIPT) or a
/// plain command.
pub(crate) enum Request {
    Script(ScriptInvocation<'static>),
    Command(Cmd),
}

impl<R> Call<R> {
    fn script(invocation: ScriptInvocation<'static>, decode: fn(Value) -> RedisResult<R>) -> Self {
        Call {
            request: Request::Script(invocation),
            decode,
        }
    }

    fn command(cmd: Cmd, decode: fn(Value) -> RedisResult<R>) -> Self {
        Call {
            request: Request::Command(cmd),
            decode,
        }
    }

    /// Reads the server's reply to this call.
    pub(crate) fn decode(&self, reply: Value) -> RedisResult<R> {
        (self.decode)(reply)
    }
}

/// The names one lock uses on the server, computed once per lock.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// The lock's hash: its name.
    pub(crate) name: String,
    /// The pub/sub channel waiters listen on.
    pub(crate) channel: String,
    /// The fencing token counter (Redisson's fenced lock).
    pub(crate) token: String,
}

impl LockKeys {
    pub(crate) fn new(name: &str) -> LockKeys {
        LockKeys {
            name: name.to_owned(),
            channel: prefixed("redisson_lock__channel", name),
            token: prefixed("redisson_lock_token", name),
        }
    }

    /// The key that remembers one release's result, so a retried release
    /// with the same request id returns the first answer.
    pub(crate) fn unlock_latch(&self, request_id: &str) -> String {
        format!(
            "{}:{request_id}",
            prefixed("redisson_unlock_latch", &self.name)
        )
    }
}

/// The hash field of a hold: `<client-uuid>:<owner>`.
pub(crate) fn field(client_id: &str, owner: &str) -> std::sync::Arc<str> {
    format!("{client_id}:{owner}").into()
}

/// Redisson's `prefixName`: `prefix:{name}`, or `prefix:name` when the name
/// already carries a hash tag.
fn prefixed(prefix: &str, name: &str) -> String {
    if name.contains('{') {
        format!("{prefix}:{name}")
    } else {
        format!("{prefix}:{{{name}}}")
    }
}

/// What an acquire request found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// Granted (or re-entered), with the fencing token when fenced.
    Granted(Option<u64>),
    /// Held by someone else, with the key's remaining TTL when it has one.
    Taken(Option<Duration>),
}

/// What a release request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The field was absent: this owner did not hold the lock.
    NotHeld,
    /// The hold count went down but is still above zero.
    StillHeld,
    /// The key was deleted and waiters were told.
    Deleted,
}

// ---------------------------------------------------------------------------
// Acquire

/// KEYS[1] lock key. ARGV[1] lease (ms), ARGV[2] field.
/// Reply: nil when granted (or re-entered); else the key's PTTL in ms
/// (-1 when the key has no expiry).
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
const ACQUIRE_LUA: &str = r#"
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
return redis.call('pttl', KEYS[1])
"#;

/// Acquire `keys` for `field` with `lease`.
pub(crate) fn acquire(keys: &LockKeys, field: &str, lease: Duration) -> Call<Acquired> {
    let mut invocation = ACQUIRE.key(&keys.name);
    invocation.arg(millis(lease)).arg(field);
    Call::script(invocation, |reply| {
        Ok(match Option::<i64>::from_redis_value(reply)? {
            None => Acquired::Granted(None),
            Some(pttl) => Acquired::Taken(ttl_from_pttl(pttl)),
        })
    })
}

/// KEYS[1] lock key, KEYS[2] token counter. ARGV[1] lease (ms), ARGV[2] field.
/// Reply: `{1, token}` when granted (the counter is INCRed on every grant,
/// re-entries included, as Redisson's `RedissonFencedLock` does), `{0, pttl}`
/// otherwise.
static ACQUIRE_FENCED: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_FENCED_LUA));
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

/// Acquire with a fencing token (Redisson's fenced lock).
pub(crate) fn acquire_fenced(keys: &LockKeys, field: &str, lease: Duration) -> Call<Acquired> {
    let mut invocation = ACQUIRE_FENCED.key(&keys.name);
    invocation.key(&keys.token).arg(millis(lease)).arg(field);
    Call::script(invocation, |reply| {
        Ok(match <(i64, i64)>::from_redis_value(reply)? {
            (1, token) => Acquired::Granted(Some(token.max(0) as u64)),
            (_, pttl) => Acquired::Taken(ttl_from_pttl(pttl)),
        })
    })
}

// ---------------------------------------------------------------------------
// Fencing

/// KEYS[1] token counter. ARGV[1] minimum. Reply: the counter afterwards.
static RAISE_TOKEN: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_TOKEN_LUA));
const RAISE_TOKEN_LUA: &str = r#"
local current = tonumber(redis.call('get', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if current < wanted then
    redis.call('set', KEYS[1], ARGV[1])
    return wanted
end
return current
"#;

/// Raise the fencing counter of `keys` to at least `minimum` (multi-node
/// fencing: every granted node's counter reaches the token handed out).
/// Reply: the counter afterwards.
pub(crate) fn raise_token(keys: &LockKeys, minimum: u64) -> Call<u64> {
    let mut invocation = RAISE_TOKEN.key(&keys.token);
    invocation.arg(minimum);
    Call::script(invocation, |reply| Ok(u64::from_redis_value(reply)?))
}

// ---------------------------------------------------------------------------
// Release

/// KEYS[1] lock key, KEYS[2] channel, KEYS[3] unlock latch.
/// ARGV[1] lease (ms), ARGV[2] field, ARGV[3] latch TTL (ms), ARGV[4] unlock message.
/// Reply: the latched result when this request already ran; nil when the
/// field is absent (not the holder); 0 when the count is still above zero
/// (the lease is refreshed); 1 when the key was deleted and `0` published.
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
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

/// Release one hold of `field`, idempotently: resent with the same
/// `request_id`, it returns the first result (the unlock latch).
pub(crate) fn release(
    keys: &LockKeys,
    field: &str,
    lease: Duration,
    request_id: &str,
) -> Call<Released> {
    let mut invocation = RELEASE.key(&keys.name);
    invocation
        .key(&keys.channel)
        .key(keys.unlock_latch(request_id))
        .arg(millis(lease))
        .arg(field)
        .arg(UNLOCK_LATCH_TTL_MS)
        .arg(UNLOCK_MESSAGE);
    Call::script(invocation, |reply| {
        Ok(match Option::<i64>::from_redis_value(reply)? {
            None => Released::NotHeld,
            Some(0) => Released::StillHeld,
            Some(_) => Released::Deleted,
        })
    })
}

/// A fresh release request id. From the thread-local RNG: `Uuid::new_v4`
/// asks the OS for entropy on every call.
pub(crate) fn new_request_id() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .to_string()
}

// ---------------------------------------------------------------------------
// Renewal

/// KEYS[i] lock key i. ARGV[1] lease (ms), ARGV[i+1] field i.
/// Reply: one integer per key, 1 when renewed, 0 when the field is gone.
static RENEW_BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_BATCH_LUA));
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

/// Renew many holds on one node in one call (the watchdog's batch): each
/// `(lock key, field)` gets `lease` if the field is still there. Reply: one
/// `true` (renewed) or `false` (gone) per hold, in order.
pub(crate) fn renew_batch<'a>(
    holds: impl IntoIterator<Item = (&'a str, &'a str)>,
    lease: Duration,
) -> Call<Vec<bool>> {
    let mut invocation = RENEW_BATCH.prepare_invoke();
    invocation.arg(millis(lease));
    for (key, field) in holds {
        invocation.key(key).arg(field);
    }
    Call::script(invocation, |reply| {
        Ok(Vec::<i64>::from_redis_value(reply)?
            .into_iter()
            .map(|renewed| renewed == 1)
            .collect())
    })
}

// ---------------------------------------------------------------------------
// Force unlock

/// KEYS[1] lock key, KEYS[2] channel. ARGV[1] unlock message.
/// Reply: 1 when the key existed (and `0` was published), else 0.
static FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(FORCE_UNLOCK_LUA));
const FORCE_UNLOCK_LUA: &str = r#"
if redis.call('del', KEYS[1]) == 1 then
    redis.call('publish', KEYS[2], ARGV[1])
    return 1
end
return 0
"#;

/// Delete the lock whoever holds it and wake its waiters. Reply: whether it
/// existed.
pub(crate) fn force_unlock(keys: &LockKeys) -> Call<bool> {
    let mut invocation = FORCE_UNLOCK.key(&keys.name);
    invocation.key(&keys.channel).arg(UNLOCK_MESSAGE);
    Call::script(invocation, |reply| Ok(i64::from_redis_value(reply)? == 1))
}

// ---------------------------------------------------------------------------
// Reads and replica sync

/// Whether anyone holds the lock.
pub(crate) fn is_locked(keys: &LockKeys) -> Call<bool> {
    let mut cmd = redis::cmd("EXISTS");
    cmd.arg(&keys.name);
    Call::command(cmd, |reply| Ok(bool::from_redis_value(reply)?))
}

/// The hold count of `field` (0 when it does not hold the lock).
pub(crate) fn hold_count(keys: &LockKeys, field: &str) -> Call<u32> {
    let mut cmd = redis::cmd("HGET");
    cmd.arg(&keys.name).arg(field);
    Call::command(cmd, |reply| {
        Ok(Option::<u32>::from_redis_value(reply)?.unwrap_or(0))
    })
}

/// The lock's remaining TTL; `None` when it does not exist or has no expiry.
pub(crate) fn remaining_ttl(keys: &LockKeys) -> Call<Option<Duration>> {
    let mut cmd = redis::cmd("PTTL");
    cmd.arg(&keys.name);
    Call::command(cmd, |reply| {
        Ok(ttl_from_pttl(i64::from_redis_value(reply)?))
    })
}

/// `WAIT replicas timeout`: how many replicas acknowledged the writes made
/// so far on this connection. Blocks the connection meanwhile.
pub(crate) fn wait_for_replicas(replicas: u32, timeout: Duration) -> Call<u32> {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas).arg(millis(timeout));
    Call::command(cmd, |reply| Ok(u32::from_redis_value(reply)?))
}

/// Every script as (name, source, script), for tests that check hashes
/// against `SCRIPT LOAD`.
#[cfg(any(test, feature = "testkit"))]
pub(crate) fn all_scripts() -> [(&'static str, &'static str, &'static Script); 6] {
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
        let keys = LockKeys::new("orders:42");
        assert_eq!(keys.channel, "redisson_lock__channel:{orders:42}");
        assert_eq!(keys.token, "redisson_lock_token:{orders:42}");
        assert_eq!(
            keys.unlock_latch("r1"),
            "redisson_unlock_latch:{orders:42}:r1"
        );
        let tagged = LockKeys::new("a{b}c");
        assert_eq!(tagged.channel, "redisson_lock__channel:a{b}c");
        assert_eq!(tagged.token, "redisson_lock_token:a{b}c");
    }

    #[test]
    fn hashes_are_distinct_sha1() {
        let hashes: std::collections::HashSet<_> = all_scripts()
            .iter()
            .map(|(_, _, s)| s.get_hash().to_owned())
            .collect();
        assert_eq!(hashes.len(), all_scripts().len());
        assert!(hashes.iter().all(|h| h.len() == 40));
    }

    #[test]
    fn replies_decode() {
        let keys = LockKeys::new("x");
        let call = acquire(&keys, "f", Duration::from_secs(1));
        assert_eq!(call.decode(Value::Nil).unwrap(), Acquired::Granted(None));
        assert_eq!(
            call.decode(Value::Int(1500)).unwrap(),
            Acquired::Taken(Some(Duration::from_millis(1500)))
        );
        assert_eq!(call.decode(Value::Int(-1)).unwrap(), Acquired::Taken(None));
        let fenced = acquire_fenced(&keys, "f", Duration::from_secs(1));
        assert_eq!(
            fenced
                .decode(Value::Array(vec![Value::Int(1), Value::Int(7)]))
                .unwrap(),
            Acquired::Granted(Some(7))
        );
        let release = release(&keys, "f", Duration::from_secs(1), "r");
        assert_eq!(release.decode(Value::Nil).unwrap(), Released::NotHeld);
        assert_eq!(release.decode(Value::Int(0)).unwrap(), Released::StillHeld);
        assert_eq!(release.decode(Value::Int(1)).unwrap(), Released::Deleted);
        let renew = renew_batch([("a", "f"), ("b", "g")], Duration::from_secs(1));
        assert_eq!(
            renew
                .decode(Value::Array(vec![Value::Int(1), Value::Int(0)]))
                .unwrap(),
            vec![true, false]
        );
    }
}
