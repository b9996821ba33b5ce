//! The fencing counter: how an acquire treats it, and the raise that
//! settles a multi-node lock's token.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{FromRedisValue, Script};

use super::{Call, LockKeys};

/// How an acquire treats the fencing counter `redisson_lock_token:{name}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fencing {
    /// Not fenced: the counter is not touched.
    Off,
    /// Redisson's fenced lock (one node): every grant INCRs the counter. A
    /// missing counter (a new name, or one lost with the node's data) is
    /// created at the wall-clock floor first (Redisson starts at 1), so a
    /// token never falls back below one handed out before.
    Single,
    /// A part of a multi-node lock: a grant reports the counter (if it
    /// exists) and writes nothing; the settlement reads, raises and seals
    /// the counters (see `quorum::fencing`).
    Quorum,
}

impl Fencing {
    pub(super) fn arg(self) -> u8 {
        match self {
            Fencing::Off => 0,
            Fencing::Single => 1,
            Fencing::Quorum => 2,
        }
    }
}

// ---------------------------------------------------------------------------
// Fencing

/// The Lua function every script that reads a fencing counter checks it
/// with, `raisable(counter)`: a non-negative integer the scripts can raise
/// exactly. Lua numbers are doubles, exact up to 2^53: a counter is at
/// most 2^53 - 2, so one more (an INCR, a settled token) is still exact,
/// and the last token is 2^53 - 1. Past it, an INCR would round (a token
/// handed out twice) and a raise would write a rounded value back (a
/// counter lowered, or rewritten as `1.2e+17`). The wall-clock floor is
/// about 1.8 * 10^15 today, a twentieth of the range.
macro_rules! raisable_counter_lua {
    () => {
        r#"
local function raisable(counter)
    return string.match(counter, '^%d+$') ~= nil
        and (#counter < 16 or (#counter == 16 and counter <= '9007199254740990'))
end
local function not_raisable(key)
    return redis.error_reply('ERR the fencing counter ' .. key .. ' is not a counter a token can follow exactly (an integer up to 2^53 - 2)')
end
"#
    };
}
pub(super) use raisable_counter_lua;

/// KEYS[1] token counter. ARGV[1] minimum. ARGV[2] `1`: create a missing
/// counter at the minimum (a settled token); `0`: leave it missing.
/// ARGV[3] the counter's expiry (ms) from now, renewed whenever it exists
/// after the raise; `0`: none (an expiry another client left on it is
/// removed). Reply: `{before (-1 when the counter was missing), after (0
/// when it still is)}`. Values are written as the strings they came as, so
/// no double is formatted back.
pub(super) static RAISE_TOKEN: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_TOKEN_LUA));
pub(super) const RAISE_TOKEN_LUA: &str = concat!(
    raisable_counter_lua!(),
    r#"
local before = redis.call('get', KEYS[1])
if before and not raisable(before) then
    return not_raisable(KEYS[1])
end
local after = ARGV[1]
if before == false then
    if ARGV[2] ~= '1' then
        return {-1, 0}
    end
elseif tonumber(before) >= tonumber(after) then
    after = before
end
if ARGV[3] ~= '0' then
    redis.call('set', KEYS[1], after, 'px', ARGV[3])
elseif after ~= before then
    redis.call('set', KEYS[1], after)
else
    redis.call('persist', KEYS[1])
end
return {tonumber(before or -1), tonumber(after)}
"#
);

/// What a raise found and left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Raised {
    /// The counter before, `None` when it was missing (never used there, or
    /// lost with the node's data).
    pub(crate) before: Option<u64>,
    /// The counter after: at least the minimum asked for, or 0 when it was
    /// missing and left so.
    pub(crate) after: u64,
}

/// What a raise does with a counter that is missing (its node lost its
/// data, or never saw the lock fenced).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    /// Leave it missing: the minimum is not a settled token yet, and a
    /// counter created below the token would later count as a survivor.
    Leave,
    /// Create it at the minimum: a settled token.
    Seed,
}

/// Raise the fencing counter of `keys` to at least `minimum` (multi-node
/// fencing: the token's settlement), renewing its expiry (`None`: it has
/// none).
pub(crate) fn raise_token(
    keys: &LockKeys,
    minimum: u64,
    missing: Missing,
    expiry: Option<Duration>,
) -> Call<Raised> {
    let mut invocation = RAISE_TOKEN.key(&keys.token);
    invocation
        .arg(minimum)
        .arg(u8::from(missing == Missing::Seed))
        .arg(expiry.map_or(0, |expiry| expiry.as_millis() as u64));
    Call::script(invocation, |reply| {
        let (before, after) = <(i64, i64)>::from_redis_value(reply)?;
        Ok(Raised {
            before: (before >= 0).then_some(before as u64),
            after: after.max(0) as u64,
        })
    })
}

/// The fencing counter of `keys` (`None` when missing): what a repair reads
/// on the other nodes, and the check after a seal. A counter that is no
/// integer is an error.
pub(crate) fn read_token(keys: &LockKeys) -> Call<Option<u64>> {
    let mut cmd = redis::cmd("GET");
    cmd.arg(&keys.token);
    Call::command(cmd, |reply| Ok(Option::<u64>::from_redis_value(reply)?))
}
