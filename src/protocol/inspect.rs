//! The operator's read of a lock: every key of Redisson's family for one
//! name (the hash, a read-write lock's read timeout keys, a fair lock's
//! queue and deadlines, the fencing counter) and the server's clock, in one
//! read-only script. It calls no command that writes: a test checks its
//! source, another watches MONITOR while it runs.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use redis::{FromRedisValue, ParsingError, RedisResult, Script, Value};

use super::{Call, LockKeys};
use crate::inspect::{Holder, LockState, Mode, Waiter};
use crate::timing::ttl_from_pttl;

/// The most read holds whose timeout keys one inspect reads, all readers
/// together: a lock with thousands of readers re-entered thousands of
/// times would otherwise hold the server for seconds. Holds past it are
/// reported without their TTLs, and the state says it was cut short.
const READ_HOLDS_SHOWN: u32 = 1000;

/// The most fields of the hash, and waiters of the queue, one inspect
/// reads; past it the state says it was cut short.
const ENTRIES_SHOWN: u32 = 10_000;

/// Reads a lock. KEYS[1] the hash (the only key declared: the others of
/// the family live in its slot and are named here, so a Cluster's
/// migration redirects the script by the hash alone); ARGV[1] the most read
/// holds to read the timeout keys of, ARGV[2] the most fields and waiters
/// to read.
///
/// Replies `{fields, pttl, reads, queue, deadlines, counter, time,
/// truncated, unreadable}`: the hash's fields and values, flat; its PTTL;
/// for a hash with a `mode` (a read-write lock), each field with a count
/// followed by the PTTLs of its timeout keys
/// `{name}:<field>:rwlock_timeout:<n>`; a fair lock's queue, head first,
/// and each waiter's deadline (nil when it has none); the fencing counter
/// (nil when absent); TIME; 1 when a list was cut short; and the keys of
/// the family that hold another type, each with the server's error (read
/// with `pcall`, so a stray key hides nothing else). The hash itself of
/// another type fails the script: the name is no lock.
pub(super) const INSPECT_LUA: &str = concat!(
    "local key = KEYS[1]\n",
    super::holds::tagged_name_lua!(),
    r#"
local budget, most = tonumber(ARGV[1]), tonumber(ARGV[2])
local truncated, unreadable = 0, {}
local function read(command, target, ...)
    local reply = redis.pcall(command, target, ...)
    if type(reply) == 'table' and reply.err then
        unreadable[#unreadable + 1] = target .. ': ' .. reply.err
        return false
    end
    return reply
end
local fields
if redis.call('hlen', key) > most then
    fields = redis.call('hscan', key, 0, 'COUNT', most)[2]
    truncated = 1
else
    fields = redis.call('hgetall', key)
end
local reads = {}
if redis.call('hexists', key, 'mode') == 1 then
    for i = 1, #fields, 2 do
        local field, holds = fields[i], tonumber(fields[i + 1])
        if field ~= 'mode' and holds then
            local ttls = {}
            for n = 1, math.min(holds, budget) do
                ttls[n] = redis.call('pttl', tagged .. ':' .. field .. ':rwlock_timeout:' .. n)
            end
            budget = budget - #ttls
            if #ttls < holds then
                truncated = 1
            end
            reads[#reads + 1] = field
            reads[#reads + 1] = ttls
        end
    end
end
local queue_key = 'redisson_lock_queue:' .. tagged
local queue = read('lrange', queue_key, 0, most - 1) or {}
if #queue == most and (read('llen', queue_key) or 0) > most then
    truncated = 1
end
local deadlines_key = 'redisson_lock_timeout:' .. tagged
local deadlines = {}
for i = 1, #queue do
    local deadline = read('zscore', deadlines_key, queue[i])
    if #unreadable > 0 and unreadable[#unreadable]:sub(1, #deadlines_key) == deadlines_key then
        break
    end
    deadlines[i] = deadline
end
return {
    fields,
    redis.call('pttl', key),
    reads,
    queue,
    deadlines,
    read('get', 'redisson_lock_token:' .. tagged),
    redis.call('time'),
    truncated,
    unreadable,
}
"#
);

pub(super) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));

/// The commands [`INSPECT_LUA`] may call: each only reads.
#[cfg(test)]
pub(super) const READ_ONLY_COMMANDS: [&str; 10] = [
    "hlen", "hscan", "hgetall", "hexists", "pttl", "lrange", "llen", "zscore", "get", "time",
];

/// Reads the lock of `keys` (any kind: a fair lock's queue and a
/// read-write lock's timeout keys are read whatever the handle's kind, so
/// an operator sees what other clients left under the name).
pub(crate) fn inspect(keys: &LockKeys) -> Call<LockState> {
    let mut invocation = INSPECT.prepare_invoke();
    invocation
        .key(&*keys.name)
        .arg(READ_HOLDS_SHOWN)
        .arg(ENTRIES_SHOWN);
    Call::script(invocation, parse_state)
}

/// [`INSPECT_LUA`]'s reply, as decoded. Names and fields are bytes: a
/// foreign client's field need not be UTF-8, and shows lossily.
type InspectReply = (
    Vec<Vec<u8>>,
    i64,
    Vec<Value>,
    Vec<Vec<u8>>,
    Vec<Option<String>>,
    Option<String>,
    (u64, u64),
    i64,
    Vec<String>,
);

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes)
        .unwrap_or_else(|err| String::from_utf8_lossy(err.as_bytes()).into_owned())
}

fn parse_state(reply: Value) -> RedisResult<LockState> {
    let (flat, pttl, reads, queue, deadlines, counter, time, truncated, unreadable): InspectReply =
        FromRedisValue::from_redis_value(reply)?;
    let mut fields = Vec::with_capacity(flat.len() / 2);
    let mut flat = flat.into_iter();
    while let (Some(field), Some(count)) = (flat.next(), flat.next()) {
        fields.push((text(field), text(count)));
    }
    let mode = fields
        .iter()
        .find(|(field, _)| field == "mode")
        .map(|(_, mode)| {
            if mode == "write" {
                Mode::Write
            } else {
                Mode::Read
            }
        });
    let mut read_ttls = parse_reads(reads)?;
    let holders = fields
        .into_iter()
        .filter(|(field, _)| field != "mode")
        .map(|(field, count)| {
            let ttls = read_ttls
                .iter_mut()
                .find(|(reader, _)| *reader == field)
                .map(|(_, ttls)| std::mem::take(ttls))
                .unwrap_or_default();
            // A writer's field has no timeout keys; the writer's own read
            // holds (a downgrade under way) are a reader field beside it.
            let writer = mode == Some(Mode::Write)
                && field.ends_with(":write")
                && ttls.iter().all(Option::is_none);
            let mut holder = Holder::new(field, count, writer);
            if !writer {
                holder.read_holds = ttls;
            }
            holder
        })
        .collect();
    let waiters = queue
        .into_iter()
        .enumerate()
        .map(|(at, field)| {
            let deadline = deadlines
                .get(at)
                .and_then(|score| score.as_deref()?.parse::<f64>().ok())
                .filter(|ms| *ms >= 0.0)
                .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64));
            Waiter::new(text(field), deadline)
        })
        .collect();
    Ok(LockState {
        holders,
        ttl: ttl_from_pttl(pttl),
        mode,
        queue: waiters,
        fencing_counter: counter.and_then(|counter| counter.parse().ok()),
        server_time: SystemTime::UNIX_EPOCH
            + Duration::from_secs(time.0)
            + Duration::from_micros(time.1),
        truncated: truncated == 1,
        unreadable,
    })
}

/// `field, {pttl...}, ...` as each reader's holds' TTLs (`None`: expired).
fn parse_reads(reads: Vec<Value>) -> RedisResult<Vec<(String, Vec<Option<Duration>>)>> {
    let mut readers = Vec::with_capacity(reads.len() / 2);
    let mut reads = reads.into_iter();
    while let Some(field) = reads.next() {
        let Some(ttls) = reads.next() else {
            return Err(ParsingError::from("a reader without its timeout keys").into());
        };
        let field = text(Vec::<u8>::from_redis_value(field)?);
        let ttls: Vec<i64> = FromRedisValue::from_redis_value(ttls)?;
        readers.push((field, ttls.into_iter().map(ttl_from_pttl).collect()));
    }
    Ok(readers)
}

/// How many keys one `SCAN` asks the server to look at: a bounded step,
/// never `KEYS`.
const SCAN_COUNT: u32 = 1000;

/// How many fields of a hash are sampled to tell whether it is a lock.
const FIELDS_SAMPLED: u32 = 8;

/// One step of a `SCAN` for hashes named by `pattern` (a glob), from
/// `cursor`: the next cursor (0 when done) and the keys found.
pub(crate) fn scan_hashes(cursor: u64, pattern: &str) -> Call<(u64, Vec<String>)> {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(SCAN_COUNT)
        .arg("TYPE")
        .arg("hash");
    Call::command(cmd, |reply| {
        let (cursor, keys): (String, Vec<Vec<u8>>) = FromRedisValue::from_redis_value(reply)?;
        let cursor = cursor
            .parse()
            .map_err(|_| ParsingError::from("a SCAN cursor that is not a number"))?;
        // A lock's name is text (ours, and Redisson's Java strings): a key
        // that is not UTF-8 is no lock.
        let keys = keys
            .into_iter()
            .filter_map(|key| String::from_utf8(key).ok())
            .collect();
        Ok((cursor, keys))
    })
}

/// Whether the hash `key` has the shape of a lock of Redisson's family
/// (see [`lock_shape`]), from a sample of its fields (`HRANDFIELD`, Redis
/// 6.2+): `Some(true)` for a read-write lock, `Some(false)` for another
/// lock, `None` for any other hash (or one gone meanwhile).
pub(crate) fn sample_lock_shape(key: &str) -> Call<Option<bool>> {
    let mut cmd = redis::cmd("HRANDFIELD");
    cmd.arg(key).arg(FIELDS_SAMPLED).arg("WITHVALUES");
    Call::command(cmd, |reply| {
        let fields: Vec<(Vec<u8>, Vec<u8>)> = FromRedisValue::from_redis_value(reply)?;
        let fields: Vec<(String, String)> = fields
            .into_iter()
            .map(|(field, value)| (text(field), text(value)))
            .collect();
        Ok(lock_shape(&fields))
    })
}

/// Redisson's shape of a lock hash: every field is either `mode` (`read`
/// or `write`: a read-write lock) or `<client-uuid>:<owner>` (a UUID, then
/// anything, `:write` included) with a hold count. `Some(true)` for a
/// read-write lock, `Some(false)` for another lock, `None` otherwise.
pub(crate) fn lock_shape(fields: &[(String, String)]) -> Option<bool> {
    let mut read_write = false;
    let mut holders = 0;
    for (field, value) in fields {
        if field == "mode" {
            if value != "read" && value != "write" {
                return None;
            }
            read_write = true;
        } else if is_holder_field(field) && value.parse::<u64>().is_ok() {
            holders += 1;
        } else {
            return None;
        }
    }
    (holders > 0).then_some(read_write)
}

/// `<uuid>:<owner>`: 36 characters of a hyphenated UUID, a `:`, an owner.
fn is_holder_field(field: &str) -> bool {
    let bytes = field.as_bytes();
    bytes.len() > 37
        && bytes[36] == b':'
        && bytes[..36].iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(fields: &[(&str, &str)]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|(f, v)| ((*f).into(), (*v).into()))
            .collect()
    }

    const UUID: &str = "3f1c2a9e-0b7d-4c55-9a51-6f0e8d2b7c41";

    #[test]
    fn lock_hashes_are_told_from_other_hashes() {
        let ours = format!("{UUID}:task-17");
        let redisson = format!("{UUID}:1");
        let writer = format!("{UUID}:1:write");
        assert_eq!(lock_shape(&pairs(&[(&ours, "2")])), Some(false));
        assert_eq!(
            lock_shape(&pairs(&[(&redisson, "1"), (&ours, "1")])),
            Some(false)
        );
        assert_eq!(
            lock_shape(&pairs(&[("mode", "write"), (&writer, "1")])),
            Some(true)
        );
        assert_eq!(
            lock_shape(&pairs(&[("mode", "read"), (&redisson, "3")])),
            Some(true)
        );
        // Other hashes: counters, profiles, a bad mode, an empty one.
        assert_eq!(lock_shape(&pairs(&[("page:views", "17")])), None);
        assert_eq!(lock_shape(&pairs(&[(&ours, "2"), ("name", "ada")])), None);
        assert_eq!(lock_shape(&pairs(&[(&ours, "many")])), None);
        assert_eq!(lock_shape(&pairs(&[("mode", "dark"), (&ours, "1")])), None);
        assert_eq!(lock_shape(&pairs(&[("mode", "read")])), None);
        assert_eq!(lock_shape(&[]), None);
        assert_eq!(
            lock_shape(&pairs(&[(&format!("{}:x", &UUID[..35]), "1")])),
            None
        );
    }

    #[test]
    fn the_inspect_script_calls_only_commands_that_read() {
        let mut called = std::collections::HashSet::new();
        for call in ["redis.call('", "read('"] {
            let mut rest = INSPECT_LUA;
            while let Some(at) = rest.find(call) {
                rest = &rest[at + call.len()..];
                let command = &rest[..rest.find('\'').unwrap()];
                assert!(
                    READ_ONLY_COMMANDS.contains(&command),
                    "{command} is not read-only"
                );
                called.insert(command);
            }
        }
        assert_eq!(called.len(), READ_ONLY_COMMANDS.len(), "{called:?}");
        // The one pcall is `read`'s, whose commands are checked above.
        assert_eq!(INSPECT_LUA.matches("redis.pcall(").count(), 1);
        assert!(INSPECT_LUA.contains("redis.pcall(command, target, ...)"));
    }
}
