//! The scripts of a hold's life: acquire, release (idempotent through its
//! latch), roll back an acquire nobody received, extend, renew in batches,
//! and force unlock. Each builder fixes its script's KEYS and ARGV.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{FromRedisValue, ParsingError, RedisResult, Script, ScriptInvocation, Value};

use super::{Acquired, Call, Fencing, Grant, LockKeys, Released};
use crate::timing::{millis, ttl_from_pttl};

/// Message published on the lock's channel when it is released.
const UNLOCK_MESSAGE: &str = "0";

/// How long a release's result stays in its latch: long enough for a
/// retried release.
const UNLOCK_LATCH_TTL_MS: u64 = 10_000;

// ---------------------------------------------------------------------------
// Acquire

/// The grant every acquire script ends with, once it decided to grant and
/// checked the request's latch: validates the fencing counter, then counts
/// the hold, sets the TTL (never shorter), writes a re-entry's latch, and
/// takes the token. Expects KEYS[1] lock, KEYS[2] the request's hold latch,
/// ARGV[1] lease, ARGV[2] field, and the locals `exists` (the key existed),
/// `fencing` (nil, `1` or `2`), `floor`, `token_key` and `mode_on_grant`
/// (a read-write lock's `mode` for a hash the grant creates; nil for other
/// locks). Replies as
/// [`ACQUIRE`] does for a grant.
macro_rules! grant_lua {
    () => {
        concat!(
            $crate::protocol::fencing::raisable_counter_lua!(),
            r#"
local fenced = fencing == '1' or (fencing == '2' and redis.call('exists', token_key) == 1)
if fenced then
    local counter = redis.call('get', token_key)
    if counter and not raisable(counter) then
        return not_raisable(token_key)
    end
end
local count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
if mode_on_grant then
    redis.call('hsetnx', KEYS[1], 'mode', mode_on_grant)
end
local lease = tonumber(ARGV[1])
local ttl = lease
if exists then
    redis.call('set', KEYS[2], 'granted', 'px', math.min(lease, 60000))
    ttl = redis.call('pttl', KEYS[1])
    if ttl < lease then
        redis.call('pexpire', KEYS[1], lease)
        ttl = lease
    end
else
    redis.call('pexpire', KEYS[1], lease)
end
local token = -1
if fencing == '1' then
    if redis.call('exists', token_key) == 0 then
        redis.call('set', token_key, floor)
    end
    token = redis.call('incr', token_key)
elseif fenced then
    token = tonumber(redis.call('get', token_key))
end
if not exists and token == -1 then
    return nil
end
return {ttl, count, token}
"#
        )
    };
}
pub(super) use grant_lua;

/// KEYS[1] lock key, KEYS[2] this request's hold latch, KEYS[3] token
/// counter (fenced only). ARGV[1] lease (ms), ARGV[2] field, ARGV[3]
/// fencing (absent: off; 1 single: INCR, creating a missing counter at the
/// floor ARGV[4] first; 2 a quorum's part: report the counter, if it
/// exists, without writing it: the quorum settles the token).
///
/// Grants when the key is absent or holds the field. A grant never shortens
/// the key's TTL: a re-entry extends it to the lease only when less is left.
///
/// A fresh hold writes the hash and its TTL and nothing else, as Redisson's
/// acquire does: its rollback knows it by the hold count. A re-entry also
/// writes its hold latch (`granted`, for min(lease, 60 s), the rollback
/// window), because there the count cannot tell a re-entry that was
/// applied from one that was not. If a rollback of this request ran first,
/// its tombstone is in the latch and the request is refused.
///
/// The common case, a fresh unfenced hold, takes the first branch: one
/// EXISTS over the lock and the latch (neither there), then Redisson's
/// HINCRBY and PEXPIRE. Every other case reads and checks everything before
/// its first write, and that write (HINCRBY) is the only one that can fail:
/// Redis keeps what a script wrote before an error, so a key of the wrong
/// type, a count or a counter that is no integer is refused with nothing
/// changed.
///
/// Reply (the common one is Redisson's own): nil, a fresh hold granted
/// unfenced (TTL = the lease, count 1); `{ttl after, count after, token or
/// -1}` any other grant; an integer >= -1, taken, the key's PTTL; -3,
/// cancelled by a rollback that came first.
pub(super) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
pub(super) const ACQUIRE_LUA: &str = concat!(
    r#"
if not ARGV[3] and redis.call('exists', KEYS[1], KEYS[2]) == 0 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
local exists = redis.call('exists', KEYS[1]) == 1
if exists and redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return redis.call('pttl', KEYS[1])
end
if redis.call('get', KEYS[2]) then
    return -3
end
local fencing, floor, token_key, mode_on_grant = ARGV[3], ARGV[4], KEYS[3], nil
"#,
    grant_lua!()
);

/// The acquire's reply when a rollback of the same request ran first.
const CANCELLED: i64 = -3;

/// Acquire `keys` for `field` with `lease`, as hold `hold_id` (a fresh
/// [`new_request_id`]; the hold's release and rollback name it again).
///
/// [`new_request_id`]: super::new_request_id
pub(crate) fn acquire(
    keys: &LockKeys,
    field: &str,
    lease: Duration,
    hold_id: &str,
    fencing: Fencing,
) -> Call<Acquired> {
    let mut invocation = ACQUIRE.key(&*keys.name);
    invocation
        .key(keys.unlock_latch(hold_id))
        .arg(millis(lease))
        .arg(field);
    fencing_args(&mut invocation, keys, fencing);
    Call::script(invocation, |reply| Ok(parse_acquired(reply)?))
}

/// Appends an acquire's fencing key and arguments, last: the token counter,
/// the mode and (single-node fencing) the floor. Unfenced, the counter is
/// neither named nor read: the common call carries only what it uses.
pub(super) fn fencing_args(
    invocation: &mut ScriptInvocation<'static>,
    keys: &LockKeys,
    fencing: Fencing,
) {
    match fencing {
        Fencing::Off => {}
        // A counter lost with its node's data starts again above every
        // token it had reached (the wall-clock floor), not at 1.
        Fencing::Single => {
            invocation
                .key(&keys.token)
                .arg(fencing.arg())
                .arg(crate::timing::token_floor());
        }
        Fencing::Quorum => {
            invocation.key(&keys.token).arg(fencing.arg());
        }
    }
}

/// Reads an acquire's reply (see [`ACQUIRE`]).
pub(crate) fn parse_acquired(reply: Value) -> Result<Acquired, ParsingError> {
    Ok(match reply {
        Value::Nil => Acquired::Granted(Grant {
            ttl: None,
            count: 1,
            token: None,
        }),
        Value::Int(CANCELLED) => Acquired::Cancelled,
        Value::Int(super::UPGRADE_REFUSED) => Acquired::UpgradeRefused,
        Value::Int(pttl) => Acquired::Taken(ttl_from_pttl(pttl)),
        reply => match Vec::<i64>::from_redis_value(reply)?.as_slice() {
            [ttl, count, token] => Acquired::Granted(Grant {
                ttl: Some(Duration::from_millis((*ttl).max(0) as u64)),
                count: (*count).max(0) as u64,
                token: (*token >= 0).then_some(*token as u64),
            }),
            other => return Err(format!("unexpected acquire reply {other:?}").into()),
        },
    })
}

// ---------------------------------------------------------------------------
// Release and rollback

/// A release's first reads: its latch (`latched`: the first send's result
/// when this release already ran) and, if none, the field's count
/// (`count`: false when the field is absent), refusing a count that is no
/// number before anything is written. Expects KEYS[1] lock, KEYS[3] the
/// hold's latch and ARGV[1] the field.
macro_rules! latched_release_lua {
    () => {
        r#"
local latched = redis.call('get', KEYS[3])
latched = (latched == '0' or latched == '1') and tonumber(latched)
local count = false
if not latched then
    count = redis.call('hget', KEYS[1], ARGV[1])
    if count and not tonumber(count) then
        return redis.error_reply('ERR the hold count of ' .. KEYS[1] .. ' is not a number')
    end
end
"#
    };
}
pub(super) use latched_release_lua;

/// KEYS[1] lock key, KEYS[2] channel, KEYS[3] the hold's latch, KEYS[4..]
/// latches of earlier releases to delete. ARGV[1] field, ARGV[2] latch TTL
/// (ms), ARGV[3] unlock message, ARGV[4] (the last) the publish command
/// (`publish` or `spublish`, see [`Publish`](super::Publish)).
///
/// Idempotent: the result is kept in the hold's latch (Redisson's unlock
/// latch), so a retried release returns the first result. Every send reads
/// the latch, the first one too: a first send held up in the network can
/// reach the server after its retry went through on another connection
/// (and after the owner took the lock again), and must then answer with the
/// retry's result instead of releasing once more. Redisson's client deletes
/// its latch with a command of its own after the reply; we delete ours with
/// the node's next release instead (KEYS[4..], in the DEL of the lock when
/// it goes): the same work on the server, without a command on the wire,
/// and no latch piles up for its TTL. A release that leaves the count above
/// zero does not touch the TTL: the holds left keep what they were granted.
///
/// Reads and checks come first, so a failed release changes nothing.
///
/// Reply: the latched result when this release already ran; nil when the
/// field is absent (not the holder); 0 when the count is still above zero;
/// 1 when the key was deleted and `0` published.
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
pub(super) const RELEASE_LUA: &str = concat!(
    r#"
"#,
    latched_release_lua!(),
    r#"
if latched or not count or tonumber(count) > 1 then
    if #KEYS > 3 then
        redis.call('del', unpack(KEYS, 4))
    end
    if latched then
        return latched
    end
    if not count then
        return nil
    end
    redis.call('hincrby', KEYS[1], ARGV[1], -1)
    redis.call('set', KEYS[3], 0, 'px', ARGV[2])
    return 0
end
redis.call('del', KEYS[1], unpack(KEYS, 4))
redis.call(ARGV[#ARGV], KEYS[2], ARGV[3])
redis.call('set', KEYS[3], 1, 'px', ARGV[2])
return 1
"#
);

pub(super) fn decode_released(reply: Value) -> RedisResult<Released> {
    Ok(match Option::<i64>::from_redis_value(reply)? {
        None => Released::NotHeld,
        Some(0) => Released::StillHeld,
        Some(_) => Released::Deleted,
    })
}

/// Release the hold whose latch is `latch` (its [`LockKeys::unlock_latch`])
/// of `field`, idempotently: resent, it returns the first result. `spent`:
/// latches of earlier releases on this node whose replies came, deleted on
/// the way (none of them can be retried any more).
pub(crate) fn release(
    keys: &LockKeys,
    field: &str,
    latch: &str,
    spent: impl IntoIterator<Item = String>,
) -> Call<Released> {
    let mut invocation = RELEASE.key(&*keys.name);
    invocation.key(&keys.channel).key(latch);
    for spent in spent {
        invocation.key(spent);
    }
    invocation
        .arg(field)
        .arg(UNLOCK_LATCH_TTL_MS)
        .arg(UNLOCK_MESSAGE)
        .arg(keys.publish.command());
    Call::script(invocation, decode_released)
}

/// KEYS[1] lock key, KEYS[2] channel, KEYS[3] the request's hold latch.
/// ARGV[1] field, ARGV[2] tombstone TTL (ms), ARGV[3] unlock message,
/// ARGV[4] the holds of the field this client knows of on this node,
/// ARGV[5] (the last) the publish command.
///
/// Undoes an acquire whose reply nobody received, only if that very request
/// was applied, so a request that never ran cannot lower another hold of
/// the same owner:
/// - its latch says `granted`: it was applied as a re-entry;
/// - no latch, and the field holds more than the client knows of: it was
///   applied as a fresh hold (a fresh hold writes no latch). The client
///   counts its holds and records this rollback under one lock, so a grant
///   of its own still in flight is not mistaken for this one (it is not
///   trusted; see `Watchdogs::begin_guessing_rollback`).
///
/// Either way the latch becomes a tombstone (`cancelled`), which refuses the
/// request if it arrives later and makes a retried rollback do nothing.
/// Reads and checks come first (a failed rollback changes nothing).
///
/// Reply: nil when nothing was undone; 0 or 1 as for a release.
pub(super) static ROLLBACK: LazyLock<Script> = LazyLock::new(|| Script::new(ROLLBACK_LUA));
pub(super) const ROLLBACK_LUA: &str = concat!(
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
redis.call('del', KEYS[1])
redis.call(ARGV[#ARGV], KEYS[2], ARGV[3])
return 1
"#
);

/// Roll back acquire request `hold_id` of `field`: undo it if it was
/// applied, refuse it if it comes later. `known_holds`: the holds of
/// `field` on this node the client has on record. `tombstone_ttl`: at
/// least as long as the request's latch TTL.
pub(crate) fn rollback(
    keys: &LockKeys,
    field: &str,
    hold_id: &str,
    known_holds: u64,
    tombstone_ttl: Duration,
) -> Call<Released> {
    let mut invocation = ROLLBACK.key(&*keys.name);
    invocation
        .key(&keys.channel)
        .key(keys.unlock_latch(hold_id))
        .arg(field)
        .arg(millis(tombstone_ttl).max(1))
        .arg(UNLOCK_MESSAGE)
        .arg(known_holds)
        .arg(keys.publish.command());
    Call::script(invocation, decode_released)
}

/// KEYS[1] a request's latch (its [`LockKeys::unlock_latch`]). ARGV[1] TTL
/// (ms).
///
/// Buries a release or rollback that got no answer within the rollback
/// window. Copies of it may still be on their way (in a partitioned link's
/// TCP buffers, or a frozen server's), and one landing after its owner's
/// next grant would find the owner's field and take that hold. Buried, the
/// latch answers for them: a release returns the latched result, a rollback
/// and a late acquire of the request see a latch and do nothing. A
/// release's result (`1`) is kept; anything else (none, a re-entry's
/// `granted`, a rollback's `cancelled`) becomes `0` (a re-entry that was
/// applied and never rolled back then ends with the key's lease).
pub(super) static BURY: LazyLock<Script> = LazyLock::new(|| Script::new(BURY_LUA));
pub(super) const BURY_LUA: &str = r#"
local latched = redis.call('get', KEYS[1])
if latched ~= '1' then
    latched = '0'
end
redis.call('set', KEYS[1], latched, 'px', ARGV[1])
return 1
"#;

/// Bury `latch` for `ttl` (see [`BURY`]).
pub(crate) fn bury(latch: &str, ttl: Duration) -> Call<()> {
    let mut invocation = BURY.key(latch);
    invocation.arg(millis(ttl).max(1));
    Call::script(invocation, |_| Ok(()))
}

/// A rollback's tombstone in the request's latch (KEYS[3]), for at least
/// ARGV[2] ms and never shorter than the latch already lives: a buried
/// request's latch (see [`BURY`]) must outlast every copy of it.
macro_rules! cancel_latch_lua {
    () => {
        "redis.call('set', KEYS[3], 'cancelled', 'px', math.max(redis.call('pttl', KEYS[3]), tonumber(ARGV[2])))\n"
    };
}
pub(super) use cancel_latch_lua;

/// Sets the local `tagged` to the lock name in the local `key` as its keys
/// are prefixed: `{name}`, or the name itself when it carries a hash tag
/// (Redisson's rule, as [`LockKeys`] applies it in Rust).
macro_rules! tagged_name_lua {
    () => {
        r#"
local tagged = key
if not string.find(key, '{', 1, true) then
    tagged = '{' .. key .. '}'
end
"#
    };
}
pub(super) use tagged_name_lua;

/// A read hold of a read-write lock lives by its timeout keys, one per hold
/// count, `{name}:<field>:rwlock_timeout:<n>`, not by its hash field: the
/// field outlives them (another reader's hold keeps the hash), and when
/// another reader releases, the hash's TTL becomes the longest of these
/// keys, or the hash goes when none is left. So a read hold is alive while
/// one of its keys lives, and renewing it renews those keys; a read hold
/// whose keys are all gone is expired, whatever its field says, and is
/// never renewed. Expects the locals `key`, `field`, `count` (its field's
/// count, a number) and `lease`; sets `reads_alive`.
macro_rules! renew_read_timeouts_lua {
    () => {
        concat!(
            tagged_name_lua!(),
            r#"
local reads_alive = false
for n = 1, count do
    local timeout = tagged .. ':' .. field .. ':rwlock_timeout:' .. n
    local ttl = redis.call('pttl', timeout)
    if ttl ~= -2 then
        reads_alive = true
        if ttl ~= -1 and ttl < lease then
            redis.call('pexpire', timeout, lease)
        end
    end
end
"#
        )
    };
}

// ---------------------------------------------------------------------------
// Renewal

/// KEYS[i] lock key i. ARGV[1] lease (ms), ARGV[2] one letter per key:
/// `r` for a read-write lock's read hold, `-` for any other hold;
/// ARGV[i+2] field i.
///
/// Each key on its own: a key that is not a hash (WRONGTYPE), or whose
/// field is no count, counts as gone for its hold, is left as it is, and
/// does not stop the others (`redis.pcall`). A read hold is renewed only
/// while one of its timeout keys lives (see the read fragment): its field
/// alone proves nothing. A renewal never shortens a TTL that another hold
/// made longer.
///
/// Reply: one integer per key, 1 when renewed, 0 when the hold is gone.
pub(super) static RENEW_BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_BATCH_LUA));
pub(super) const RENEW_BATCH_LUA: &str = concat!(
    r#"
local lease = tonumber(ARGV[1])
local renewed = {}
for i = 1, #KEYS do
    local key, field = KEYS[i], ARGV[i + 2]
    local count = redis.pcall('hget', key, field)
    local alive = type(count) == 'string' and tonumber(count) ~= nil
    if alive and string.byte(ARGV[2], i) == 114 then
        count = tonumber(count)
"#,
    renew_read_timeouts_lua!(),
    r#"
        alive = reads_alive
    end
    if alive then
        if redis.call('pttl', key) < lease then
            redis.call('pexpire', key, lease)
        end
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
"#
);

/// Renew many holds on one node in one call (the watchdog's batch): each
/// `(lock key, field, read hold?)` keeps at least `lease` if the hold is
/// still there (for a read hold: one of its timeout keys).
/// Reply: one `true` (renewed) or `false` (gone) per hold, in order.
pub(crate) fn renew_batch<'a>(
    holds: impl IntoIterator<Item = (&'a str, &'a str, bool)>,
    lease: Duration,
) -> Call<Vec<bool>> {
    let mut invocation = RENEW_BATCH.prepare_invoke();
    let mut kinds = String::new();
    let mut fields = Vec::new();
    for (key, field, reads) in holds {
        invocation.key(key);
        kinds.push(if reads { 'r' } else { '-' });
        fields.push(field);
    }
    invocation.arg(millis(lease)).arg(kinds);
    for field in fields {
        invocation.arg(field);
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

/// KEYS[1] lock key. ARGV[1] lease (ms), ARGV[2] field, ARGV[3] `1` for a
/// read-write lock's read hold (it lives by its timeout keys).
/// Reply: the key's TTL after (at least the lease: never shortened; a read
/// hold's own, the lease) when the field holds it; -1 when it does not, or
/// a read hold's timeout keys are all gone (never revived).
pub(super) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_LUA));
pub(super) const EXTEND_LUA: &str = concat!(
    r#"
local count = redis.call('hget', KEYS[1], ARGV[2])
if not count then
    return -1
end
local lease = tonumber(ARGV[1])
local key, field = KEYS[1], ARGV[2]
if ARGV[3] == '1' then
    count = tonumber(count) or 0
"#,
    renew_read_timeouts_lua!(),
    r#"
    if not reads_alive then
        return -1
    end
    if redis.call('pttl', key) < lease then
        redis.call('pexpire', key, lease)
    end
    return lease
end
local ttl = redis.call('pttl', key)
if ttl < lease then
    redis.call('pexpire', key, lease)
    ttl = lease
end
return ttl
"#
);

/// Extend `field`'s hold of `keys` (`reads`: a read lock's) to at least
/// `lease` from now. Reply: the key's TTL after (a read hold's: the
/// lease), `None` when the field no longer holds it.
pub(crate) fn extend(
    keys: &LockKeys,
    field: &str,
    lease: Duration,
    reads: bool,
) -> Call<Option<Duration>> {
    let mut invocation = EXTEND.key(&*keys.name);
    invocation
        .arg(millis(lease))
        .arg(field)
        .arg(if reads { "1" } else { "0" });
    Call::script(invocation, |reply| {
        Ok(ttl_from_pttl(i64::from_redis_value(reply)?))
    })
}

// ---------------------------------------------------------------------------
// Force unlock

/// KEYS[1] lock key, KEYS[2] channel. ARGV[1] unlock message, ARGV[2] (the
/// last) the publish command.
/// A key that is not a hash is not a lock: refused (WRONGTYPE), not deleted.
/// Reply: 1 when the key existed (and `0` was published), else 0.
pub(super) static FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(FORCE_UNLOCK_LUA));
pub(super) const FORCE_UNLOCK_LUA: &str = r#"
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
    return 0
end
if kind ~= 'hash' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is a ' .. kind .. ', not a lock')
end
redis.call('del', KEYS[1])
redis.call(ARGV[#ARGV], KEYS[2], ARGV[1])
return 1
"#;

/// Delete the lock whoever holds it and wake its waiters. Reply: whether it
/// existed.
pub(crate) fn force_unlock(keys: &LockKeys) -> Call<bool> {
    let mut invocation = FORCE_UNLOCK.key(&*keys.name);
    invocation
        .key(&keys.channel)
        .arg(UNLOCK_MESSAGE)
        .arg(keys.publish.command());
    Call::script(invocation, |reply| Ok(i64::from_redis_value(reply)? == 1))
}
