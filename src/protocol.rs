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
    /// Granted (or re-entered).
    Granted(Grant),
    /// Held by someone else, with the key's remaining TTL when it has one.
    Taken(Option<Duration>),
    /// Refused without looking: a rollback of this very request ran first
    /// (its tombstone). Only a request that was sent, abandoned and rolled
    /// back before it reached the server gets this.
    Cancelled,
}

/// What a granted acquire left on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The key's TTL right after the grant: at least the lease asked for
    /// (a grant never shortens a hold), more when an earlier hold of the
    /// same owner asked for longer.
    pub(crate) ttl: Duration,
    /// The owner's hold count after the grant: 1 for a fresh hold.
    pub(crate) count: u64,
    /// The fencing token: the counter after its INCR, when fenced and the
    /// counter exists (see [`Fencing`]).
    pub(crate) token: Option<u64>,
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

/// How an acquire treats the fencing counter `redisson_lock_token:{name}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fencing {
    /// Not fenced: the counter is not touched.
    Off,
    /// Redisson's fenced lock (one node): every grant INCRs the counter,
    /// creating it at 1 when it is missing.
    Single,
    /// A multi-node lock: every grant INCRs the counter if it exists. A
    /// missing counter (a node that lost its data) is not created: the
    /// token settlement seeds it from the other nodes.
    Quorum,
}

impl Fencing {
    fn arg(self) -> u8 {
        match self {
            Fencing::Off => 0,
            Fencing::Single => 1,
            Fencing::Quorum => 2,
        }
    }
}

// ---------------------------------------------------------------------------
// Acquire

/// KEYS[1] lock key, KEYS[2] this request's hold latch, KEYS[3] token counter.
/// ARGV[1] lease (ms), ARGV[2] field, ARGV[3] hold latch TTL (ms), ARGV[4]
/// fencing (0 off, 1 single: INCR and create, 2 quorum: INCR if it exists).
///
/// Grants when the key is absent or holds the field. A grant never shortens
/// the key's TTL: it extends it to the lease only when less is left. The
/// hold latch (`SET NX`) marks the request as applied for its rollback; if a
/// rollback of this request ran first, the latch exists and the request is
/// refused.
///
/// Reply: `{0, pttl}` taken; `{1, ttl after, count after, token or -1}`
/// granted; `{-1}` cancelled by a rollback that came first.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
const ACQUIRE_LUA: &str = r#"
if redis.call('exists', KEYS[1]) == 1 and redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return {0, redis.call('pttl', KEYS[1])}
end
if not redis.call('set', KEYS[2], 'granted', 'nx', 'px', ARGV[3]) then
    return {-1}
end
local count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
local lease = tonumber(ARGV[1])
local ttl = redis.call('pttl', KEYS[1])
if ttl < lease then
    redis.call('pexpire', KEYS[1], lease)
    ttl = lease
end
local token = -1
if ARGV[4] == '1' or (ARGV[4] == '2' and redis.call('exists', KEYS[3]) == 1) then
    token = redis.call('incr', KEYS[3])
end
return {1, ttl, count, token}
"#;

/// Acquire `keys` for `field` with `lease`, as hold `hold_id` (a fresh
/// [`new_request_id`]; the hold's release and rollback name it again).
/// `latch_ttl` bounds how long a rollback of this request can tell whether
/// it was applied.
pub(crate) fn acquire(
    keys: &LockKeys,
    field: &str,
    lease: Duration,
    hold_id: &str,
    latch_ttl: Duration,
    fencing: Fencing,
) -> Call<Acquired> {
    let mut invocation = ACQUIRE.key(&keys.name);
    invocation
        .key(keys.unlock_latch(hold_id))
        .key(&keys.token)
        .arg(millis(lease))
        .arg(field)
        .arg(millis(latch_ttl).max(1))
        .arg(fencing.arg());
    Call::script(invocation, |reply| {
        let reply = Vec::<i64>::from_redis_value(reply)?;
        Ok(match reply.as_slice() {
            [1, ttl, count, token] => Acquired::Granted(Grant {
                ttl: Duration::from_millis((*ttl).max(0) as u64),
                count: (*count).max(0) as u64,
                token: (*token >= 0).then_some(*token as u64),
            }),
            [0, pttl] => Acquired::Taken(ttl_from_pttl(*pttl)),
            _ => Acquired::Cancelled,
        })
    })
}

// ---------------------------------------------------------------------------
// Fencing

/// KEYS[1] token counter. ARGV[1] minimum.
/// Reply: `{before (-1 when the counter was missing), after}`.
static RAISE_TOKEN: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_TOKEN_LUA));
const RAISE_TOKEN_LUA: &str = r#"
local before = redis.call('get', KEYS[1])
local wanted = tonumber(ARGV[1])
if before == false then
    redis.call('set', KEYS[1], ARGV[1])
    return {-1, wanted}
end
before = tonumber(before)
if before < wanted then
    redis.call('set', KEYS[1], ARGV[1])
    return {before, wanted}
end
return {before, before}
"#;

/// What a raise found and left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Raised {
    /// The counter before, `None` when it was missing (never used there, or
    /// lost with the node's data).
    pub(crate) before: Option<u64>,
    /// The counter after: at least the minimum asked for.
    pub(crate) after: u64,
}

/// Raise the fencing counter of `keys` to at least `minimum` (multi-node
/// fencing: the token's settlement).
pub(crate) fn raise_token(keys: &LockKeys, minimum: u64) -> Call<Raised> {
    let mut invocation = RAISE_TOKEN.key(&keys.token);
    invocation.arg(minimum);
    Call::script(invocation, |reply| {
        let (before, after) = <(i64, i64)>::from_redis_value(reply)?;
        Ok(Raised {
            before: (before >= 0).then_some(before as u64),
            after: after.max(0) as u64,
        })
    })
}

// ---------------------------------------------------------------------------
// Release and rollback

/// KEYS[1] lock key, KEYS[2] channel, KEYS[3] the hold's latch.
/// ARGV[1] field, ARGV[2] latch TTL (ms), ARGV[3] unlock message.
///
/// Idempotent: the result is kept in the hold's latch (Redisson's unlock
/// latch), so a retried release returns the first result. A release that
/// leaves the count above zero does not touch the TTL: the holds left keep
/// what they were granted.
///
/// Reply: the latched result when this release already ran; nil when the
/// field is absent (not the holder); 0 when the count is still above zero;
/// 1 when the key was deleted and `0` published.
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
const RELEASE_LUA: &str = r#"
local latched = redis.call('get', KEYS[3])
if latched == '0' or latched == '1' then
    return tonumber(latched)
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    redis.call('del', KEYS[3])
    return nil
end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
    redis.call('set', KEYS[3], 0, 'px', ARGV[2])
    return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[3])
redis.call('set', KEYS[3], 1, 'px', ARGV[2])
return 1
"#;

fn decode_released(reply: Value) -> RedisResult<Released> {
    Ok(match Option::<i64>::from_redis_value(reply)? {
        None => Released::NotHeld,
        Some(0) => Released::StillHeld,
        Some(_) => Released::Deleted,
    })
}

/// Release hold `hold_id` of `field`, idempotently: resent, it returns the
/// first result.
pub(crate) fn release(keys: &LockKeys, field: &str, hold_id: &str) -> Call<Released> {
    let mut invocation = RELEASE.key(&keys.name);
    invocation
        .key(&keys.channel)
        .key(keys.unlock_latch(hold_id))
        .arg(field)
        .arg(UNLOCK_LATCH_TTL_MS)
        .arg(UNLOCK_MESSAGE);
    Call::script(invocation, decode_released)
}

/// KEYS[1] lock key, KEYS[2] channel, KEYS[3] the request's hold latch.
/// ARGV[1] field, ARGV[2] tombstone TTL (ms), ARGV[3] unlock message.
///
/// Undoes an acquire whose reply nobody received: releases one hold of the
/// field only if that very request was granted (its latch says `granted`),
/// so a request that never ran cannot lower another hold of the same owner.
/// Either way the latch becomes a tombstone (`cancelled`), which refuses the
/// request if it arrives later and makes a retried rollback do nothing.
///
/// Reply: nil when nothing was undone; 0 or 1 as for a release.
static ROLLBACK: LazyLock<Script> = LazyLock::new(|| Script::new(ROLLBACK_LUA));
const ROLLBACK_LUA: &str = r#"
local latch = redis.call('get', KEYS[3])
redis.call('set', KEYS[3], 'cancelled', 'px', ARGV[2])
if latch ~= 'granted' or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return nil
end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
    return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[3])
return 1
"#;

/// Roll back acquire request `hold_id` of `field`: undo it if it was
/// granted, refuse it if it comes later. `tombstone_ttl`: at least as long
/// as the request's latch TTL.
pub(crate) fn rollback(
    keys: &LockKeys,
    field: &str,
    hold_id: &str,
    tombstone_ttl: Duration,
) -> Call<Released> {
    let mut invocation = ROLLBACK.key(&keys.name);
    invocation
        .key(&keys.channel)
        .key(keys.unlock_latch(hold_id))
        .arg(field)
        .arg(millis(tombstone_ttl).max(1))
        .arg(UNLOCK_MESSAGE);
    Call::script(invocation, decode_released)
}

/// A fresh request id. From the thread-local RNG: `Uuid::new_v4` asks the
/// OS for entropy on every call.
pub(crate) fn new_request_id() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .to_string()
}

// ---------------------------------------------------------------------------
// Renewal

/// KEYS[i] lock key i. ARGV[1] lease (ms), ARGV[i+1] field i.
///
/// Each key on its own: a key that is not a hash (WRONGTYPE) counts as gone
/// for its hold and does not stop the others (`redis.pcall`). A renewal
/// never shortens a TTL that another hold made longer.
///
/// Reply: one integer per key, 1 when renewed, 0 when the hold is gone.
static RENEW_BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_BATCH_LUA));
const RENEW_BATCH_LUA: &str = r#"
local lease = tonumber(ARGV[1])
local renewed = {}
for i = 1, #KEYS do
    local held = redis.pcall('hexists', KEYS[i], ARGV[i + 1])
    if held == 1 then
        if redis.call('pttl', KEYS[i]) < lease then
            redis.call('pexpire', KEYS[i], lease)
        end
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
"#;

/// Renew many holds on one node in one call (the watchdog's batch): each
/// `(lock key, field)` keeps at least `lease` if the field is still there.
/// Reply: one `true` (renewed) or `false` (gone) per hold, in order.
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
// Extend

/// KEYS[1] lock key. ARGV[1] lease (ms), ARGV[2] field.
/// Reply: the key's TTL after (at least the lease: never shortened) when
/// the field holds it; -1 when it does not (never revived).
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_LUA));
const EXTEND_LUA: &str = r#"
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return -1
end
local lease = tonumber(ARGV[1])
local ttl = redis.call('pttl', KEYS[1])
if ttl < lease then
    redis.call('pexpire', KEYS[1], lease)
    ttl = lease
end
return ttl
"#;

/// Extend `field`'s hold of `keys` to at least `lease` from now. Reply: the
/// key's TTL after, `None` when the field no longer holds it.
pub(crate) fn extend(keys: &LockKeys, field: &str, lease: Duration) -> Call<Option<Duration>> {
    let mut invocation = EXTEND.key(&keys.name);
    invocation.arg(millis(lease)).arg(field);
    Call::script(invocation, |reply| {
        Ok(ttl_from_pttl(i64::from_redis_value(reply)?))
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

/// Every script, as (name, source, script): loaded on every new
/// connection ([`load_scripts`]), and checked against `SCRIPT LOAD` by tests.
pub(crate) fn all_scripts() -> [(&'static str, &'static str, &'static Script); 7] {
    [
        ("extend", EXTEND_LUA, &EXTEND),
        ("acquire", ACQUIRE_LUA, &ACQUIRE),
        ("raise_token", RAISE_TOKEN_LUA, &RAISE_TOKEN),
        ("release", RELEASE_LUA, &RELEASE),
        ("rollback", ROLLBACK_LUA, &ROLLBACK),
        ("renew_batch", RENEW_BATCH_LUA, &RENEW_BATCH),
        ("force_unlock", FORCE_UNLOCK_LUA, &FORCE_UNLOCK),
    ]
}

/// `SCRIPT LOAD` of every script, pipelined: sent once on every new
/// connection, so no request of ours meets NOSCRIPT after a restart (an
/// EVALSHA that met NOSCRIPT and timed out before its reload would never
/// run, and a rollback could not tell).
pub(crate) fn load_scripts() -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for (_, source, _) in all_scripts() {
        pipe.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
    pipe
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
        let second = Duration::from_secs(1);
        let call = acquire(&keys, "f", second, "r", second, Fencing::Off);
        let ints = |v: &[i64]| Value::Array(v.iter().map(|i| Value::Int(*i)).collect());
        assert_eq!(
            call.decode(ints(&[1, 1500, 2, -1])).unwrap(),
            Acquired::Granted(Grant {
                ttl: Duration::from_millis(1500),
                count: 2,
                token: None
            })
        );
        assert_eq!(
            call.decode(ints(&[1, 1000, 1, 7])).unwrap(),
            Acquired::Granted(Grant {
                ttl: second,
                count: 1,
                token: Some(7)
            })
        );
        assert_eq!(
            call.decode(ints(&[0, 1500])).unwrap(),
            Acquired::Taken(Some(Duration::from_millis(1500)))
        );
        assert_eq!(call.decode(ints(&[0, -1])).unwrap(), Acquired::Taken(None));
        assert_eq!(call.decode(ints(&[-1])).unwrap(), Acquired::Cancelled);
        let release = release(&keys, "f", "r");
        assert_eq!(release.decode(Value::Nil).unwrap(), Released::NotHeld);
        assert_eq!(release.decode(Value::Int(0)).unwrap(), Released::StillHeld);
        assert_eq!(release.decode(Value::Int(1)).unwrap(), Released::Deleted);
        let raise = raise_token(&keys, 5);
        assert_eq!(
            raise.decode(ints(&[-1, 5])).unwrap(),
            Raised {
                before: None,
                after: 5
            }
        );
        assert_eq!(
            raise.decode(ints(&[9, 9])).unwrap(),
            Raised {
                before: Some(9),
                after: 9
            }
        );
        let renew = renew_batch([("a", "f"), ("b", "g")], second);
        assert_eq!(renew.decode(ints(&[1, 0])).unwrap(), vec![true, false]);
    }
}
