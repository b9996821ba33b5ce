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

/// KEYS[1] token counter. ARGV[1] minimum. ARGV[2] `1`: create a missing
/// counter at the minimum (a settled token); `0`: leave it missing.
/// ARGV[3] the counter's expiry (ms) from now, renewed whenever it exists
/// after the raise; `0`: none (a counter left as it was keeps no TTL it
/// did not have). Reply: `{before (-1 when the counter was missing), after
/// (0 when it still is)}`.
pub(super) static RAISE_TOKEN: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_TOKEN_LUA));
pub(super) const RAISE_TOKEN_LUA: &str = r#"
local before = redis.call('get', KEYS[1])
local wanted = tonumber(ARGV[1])
if before and not (string.match(before, '^%d+$') and #before < 19) then
    return redis.error_reply('ERR the fencing counter ' .. KEYS[1] .. ' is not a counter')
end
local after = wanted
if before == false then
    if ARGV[2] ~= '1' then
        return {-1, 0}
    end
else
    before = tonumber(before)
    after = math.max(before, wanted)
end
if ARGV[3] ~= '0' then
    redis.call('set', KEYS[1], after, 'px', ARGV[3])
elseif after ~= before then
    redis.call('set', KEYS[1], after, 'keepttl')
end
return {before or -1, after}
"#;

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
