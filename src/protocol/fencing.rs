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

/// The Lua function the fencing scripts name the server's data with,
/// `server_mark()`: `<run_id>:<master_replid>`, as `INFO` reports them in
/// the script. A restart changes the first; a promotion (even back to a
/// primary that was demoted and resynced) the second.
macro_rules! server_mark_lua {
    () => {
        r#"
local function server_mark()
    return string.match(redis.call('info', 'server'), 'run_id:(%x+)') .. ':'
        .. string.match(redis.call('info', 'replication'), 'master_replid:(%x+)')
end
"#
    };
}

/// KEYS[1] the token counter, only to route the call to the server that
/// holds it. Reply: the server's mark, `<run_id>:<master_replid>` (what a
/// repair names as the data it read its witnesses for).
pub(super) static SERVER_MARK: LazyLock<Script> = LazyLock::new(|| Script::new(SERVER_MARK_LUA));
pub(super) const SERVER_MARK_LUA: &str = concat!(server_mark_lua!(), "return server_mark()\n");

/// KEYS[1] token counter, KEYS[2] its vouch (`<run_id>:<master_replid>:<value>`:
/// the server's process and replication ID, and the value, when a seal, a
/// repair or a raise of a vouched counter last wrote it). ARGV[1] minimum.
/// ARGV[2] `1`: the minimum is a settled token (a seal's, or a repair's
/// value): create a missing counter at it, and vouch for the counter;
/// `0`: leave a missing counter missing, and vouch only for a counter
/// that was vouched for. ARGV[3] the counter's expiry (ms) from now,
/// renewed with its vouch whenever the counter exists after the raise;
/// `0`: none (an expiry another client left on them is removed). ARGV[4]
/// the server's mark (`<run_id>:<master_replid>`) the raise is meant for
/// (a repair's write: its witnesses were read for the server's data under
/// that mark), or empty for any: under another mark nothing is written,
/// and the reply is `{-2, 0, 0}`. Reply:
/// `{before (-1 when the counter was missing), after (0 when it still
/// is), vouched (1 when the counter was there and vouched for on this
/// run and replication ID, at or above the value vouched for)}`. Values
/// are written as the strings they came as, so no double is formatted
/// back.
///
/// The vouch is read in the script, against the `run_id` and replication
/// ID the server reports there (`INFO`), so it says exactly whether the
/// counter was sealed or repaired since the server last started or was
/// promoted: a restart from a stale dump brings back a vouch of the old
/// run, and a primary demoted, resynced from a replica that missed its
/// last seal, and promoted back gets a new replication ID, whoever reads
/// it. A counter below the value vouched for (deleted and INCRed, or set
/// back by hand) is not vouched either.
pub(super) static RAISE_TOKEN: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_TOKEN_LUA));
pub(super) const RAISE_TOKEN_LUA: &str = concat!(
    raisable_counter_lua!(),
    server_mark_lua!(),
    r#"
local before = redis.call('get', KEYS[1])
-- A seal adds nothing: it may find the last token (2^53 - 1) there.
if before and not raisable(before) and not (ARGV[2] == '1' and before == '9007199254740991') then
    return not_raisable(KEYS[1])
end
-- The server's data as it is: this process, in this role.
local mark = server_mark()
if ARGV[4] ~= '' and ARGV[4] ~= mark then
    return {-2, 0, 0}
end
mark = mark .. ':'
local vouch = redis.call('get', KEYS[2])
-- Vouched: marked for this data, and not below the value vouched for (a
-- counter deleted and INCRed, or set back, is not what was sealed).
local vouched = before ~= false and vouch ~= false
    and string.sub(vouch, 1, #mark) == mark
    and tonumber(before) >= (tonumber(string.sub(vouch, #mark + 1)) or math.huge)
local after = ARGV[1]
if before == false then
    if ARGV[2] ~= '1' then
        return {-1, 0, 0}
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
-- A settled value is vouched for; a vouched counter raised stays vouched,
-- at its new value (so setting it back below is seen).
if ARGV[2] == '1' or vouched then
    if ARGV[3] ~= '0' then
        redis.call('set', KEYS[2], mark .. after, 'px', ARGV[3])
    else
        redis.call('set', KEYS[2], mark .. after)
    end
end
return {tonumber(before or -1), tonumber(after), vouched and 1 or 0}
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
    /// The counter before was vouched for: a seal or a repair wrote it
    /// since the server last started or was promoted, and it is not below
    /// what they left, so it is at least every token a seal left there (a
    /// witness, for any client).
    pub(crate) vouched: bool,
}

/// What a raise does with a counter that is missing (its node lost its
/// data, or never saw the lock fenced), and whether it vouches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    /// Leave it missing, and the vouch as it is: the minimum is not a
    /// settled token yet, and a counter created below the token would
    /// later count as a survivor.
    Leave,
    /// Create it at the minimum, and vouch for the counter: the minimum is
    /// a settled token (a seal), or what a repair read from enough
    /// witnesses.
    Seed,
}

/// Raise the fencing counter of `keys` to at least `minimum` (multi-node
/// fencing: the token's settlement, and what a repair reads and writes),
/// renewing its expiry (`None`: it has none).
pub(crate) fn raise_token(
    keys: &LockKeys,
    minimum: u64,
    missing: Missing,
    expiry: Option<Duration>,
) -> Call<Raised> {
    let invocation = raise_invocation(keys, minimum, missing, expiry, "");
    Call::script(invocation, |reply| {
        decode_raise(reply)?.ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "a raise meant for any run reported another run",
            ))
        })
    })
}

/// A repair's write: as [`raise_token`] with [`Missing::Seed`], applied
/// only while the server's data is still under `mark` (see
/// [`server_mark`]), the data the repair read its witnesses for. `None`:
/// the server restarted or was promoted since (it may have lost a token
/// sealed after those reads), so nothing was written.
pub(crate) fn repair_token(
    keys: &LockKeys,
    value: u64,
    expiry: Option<Duration>,
    mark: &str,
) -> Call<Option<Raised>> {
    let invocation = raise_invocation(keys, value, Missing::Seed, expiry, mark);
    Call::script(invocation, decode_raise)
}

/// The mark of the data on the server that holds `keys`' counter (for a
/// Cluster node: its shard's primary), `<run_id>:<master_replid>`: what a
/// repair reads before its witnesses, and names in its write
/// ([`repair_token`]).
pub(crate) fn server_mark(keys: &LockKeys) -> Call<String> {
    let invocation = SERVER_MARK.key(&keys.token);
    Call::script(invocation, |reply| Ok(String::from_redis_value(reply)?))
}

fn raise_invocation(
    keys: &LockKeys,
    minimum: u64,
    missing: Missing,
    expiry: Option<Duration>,
    mark: &str,
) -> redis::ScriptInvocation<'static> {
    let mut invocation = RAISE_TOKEN.key(&keys.token);
    invocation
        .key(keys.token_vouch())
        .arg(minimum)
        .arg(u8::from(missing == Missing::Seed))
        .arg(expiry.map_or(0, |expiry| expiry.as_millis() as u64))
        .arg(mark);
    invocation
}

/// A raise's reply; `None` when it was meant for another run.
fn decode_raise(reply: redis::Value) -> redis::RedisResult<Option<Raised>> {
    let (before, after, vouched) = <(i64, i64, u8)>::from_redis_value(reply)?;
    Ok((before != -2).then(|| Raised {
        before: (before >= 0).then_some(before as u64),
        after: after.max(0) as u64,
        vouched: vouched == 1,
    }))
}

/// The fencing counter of `keys` (`None` when missing): what a repair reads
/// on the other nodes, and the check after a seal. A counter that is no
/// integer is an error.
pub(crate) fn read_token(keys: &LockKeys) -> Call<Option<u64>> {
    let mut cmd = redis::cmd("GET");
    cmd.arg(&keys.token);
    Call::command(cmd, |reply| Ok(Option::<u64>::from_redis_value(reply)?))
}
