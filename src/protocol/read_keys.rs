//! How a read-write lock keeps its read holds: one expiring key per hold,
//! `{name}:<field>:rwlock_timeout:<n>`, whose value names the hold's
//! request; the hash lives as long as the longest of them. The Lua
//! fragments here drop a hold, settle the hash's TTL after one left, and
//! downgrade or free the lock after the writer's last write; the scripts
//! of [`super::rw`] are built from them.

/// The hash's TTL from the read timeout keys left, as Redisson's read
/// release computes it: the longest of them (-2 when there are none).
/// Expects the local `tagged` (the name as its keys are prefixed).
///
/// Every field with a count is looked at, as Redisson does: a field is a
/// reader's by having timeout keys, never by its name (the writer's field
/// has none, so it adds nothing). Telling them apart by the `:write`
/// suffix would hide a reader whose owner id ends with it.
macro_rules! longest_read_timeout_lua {
    () => {
        r#"
local longest = -2
local fields = redis.call('hgetall', KEYS[1])
for i = 1, #fields, 2 do
    local reader, holds = fields[i], tonumber(fields[i + 1])
    if reader ~= 'mode' and holds then
        for n = 1, holds do
            longest = math.max(longest, redis.call('pttl', tagged .. ':' .. reader .. ':rwlock_timeout:' .. n))
        end
    end
end
"#
    };
}
pub(super) use longest_read_timeout_lua;

/// Gives up the read hold of `field` (whose count was `count`, > 0)
/// whose timeout key holds the name of the request's latch, KEYS[3]: each
/// read acquire writes its latch's name as its key's value (Redisson
/// writes `1` and reads only the TTLs, so it sees no difference). The hold
/// is known exactly, whatever the order of releases and expiries: its key
/// goes, and so do the keys of the field's holds that already expired; the
/// keys left are numbered 1.. again, each keeping its value and TTL, and
/// the count becomes theirs. Sets `found` (the hold's key was alive) and
/// `mine` (its TTL; -2 when not found), then settles the hash (see
/// [`settle_read_hash_lua`]). Expects the locals `field`, `count`,
/// `tagged`, `prefix` (this field's timeout keys), and the publish command
/// (`publish` or `spublish`, see [`Publish`](super::Publish)) as the last
/// ARGV: every script that includes this takes it last; sets `freed`.
///
/// Numbers alone cannot tell the holds apart: a rule such as "the key that
/// expires first goes" takes a live hold's key in the place of one that
/// already expired (or of the rolled-back request's), and leaves a hold
/// nobody releases.
macro_rules! drop_read_hold_lua {
    () => {
        concat!(
            r#"
local mine, found, live = -2, false, {}
for n = 1, count do
    local key = prefix .. ':' .. n
    local ttl = redis.call('pttl', key)
    if ttl ~= -2 then
        local value = redis.call('get', key)
        if not found and value == KEYS[3] then
            found, mine = true, ttl
        else
            live[#live + 1] = {n, value, ttl}
        end
    end
end
for i, hold in ipairs(live) do
    if hold[1] ~= i then
        if hold[3] > 0 then
            redis.call('set', prefix .. ':' .. i, hold[2], 'px', hold[3])
        else
            redis.call('set', prefix .. ':' .. i, hold[2])
        end
    end
end
for n = #live + 1, count do
    redis.call('del', prefix .. ':' .. n)
end
if #live == 0 then
    redis.call('hdel', KEYS[1], field)
else
    redis.call('hset', KEYS[1], field, #live)
end
"#,
            settle_read_hash_lua!()
        )
    };
}
pub(super) use drop_read_hold_lua;

/// After a read hold of `field` left (its timeout key `mine`'s TTL, -2 when
/// it had none), the hash lives as long as the longest timeout key left, or
/// goes and `0` is published when no hold is left. Settled by a scan of the
/// readers' keys when this hold may have kept the hash (its key ended at
/// most 25 ms before the hash: see the script). Expects the locals
/// `mine` and `tagged`, and the publish command as the last ARGV; sets
/// `freed`.
macro_rules! settle_read_hash_lua {
    () => {
        concat!(
            r#"
local freed = false
if redis.call('hlen', KEYS[1]) > 1 then
    -- In write mode the writer's lease keeps the hash (never shortened).
    -- A hold that expires well before the hash did not keep it: the hash
    -- already lives no longer than another hold made it. The scan (one
    -- PTTL per read hold) is for the hold that kept it, and that hold's
    -- key may end a little before the hash: a grant or a renewal sets the
    -- two with two commands, a clock tick apart now and then (further on
    -- a server descheduled mid-script), and taking the hash for another
    -- hold's then kept it, with nobody's hold, to the end of the lease.
    if redis.call('hget', KEYS[1], 'mode') ~= 'write' and mine + 25 >= redis.call('pttl', KEYS[1]) then
"#,
            longest_read_timeout_lua!(),
            r#"
        if longest > 0 then
            redis.call('pexpire', KEYS[1], longest)
        else
            freed = true
        end
    end
else
    freed = true
end
if freed then
    redis.call('del', KEYS[1])
    redis.call(ARGV[#ARGV], KEYS[2], '0')
end
"#
        )
    };
}
pub(super) use settle_read_hash_lua;

/// After the writer's last write hold left: when the writer's own reads
/// are alive, the lock is downgraded to them (`mode` read, the hash living
/// as long as their longest timeout key, not the write's lease); when none
/// is (there are none, or they expired), the hash goes and `1` is
/// published. Sets `freed`. Expects the publish command as the last ARGV.
macro_rules! downgrade_or_free_lua {
    () => {
        concat!(
            r#"
local freed = true
if redis.call('hlen', KEYS[1]) > 1 then
    local key = KEYS[1]
"#,
            tagged_name_lua!(),
            longest_read_timeout_lua!(),
            r#"
    if longest ~= -2 then
        freed = false
        redis.call('hset', KEYS[1], 'mode', 'read')
        if longest > 0 then
            redis.call('pexpire', KEYS[1], longest)
        end
    end
end
if freed then
    redis.call('del', KEYS[1])
    redis.call(ARGV[#ARGV], KEYS[2], '1')
end
"#
        )
    };
}
pub(super) use downgrade_or_free_lua;

/// Whether one of the `count` read holds whose timeout keys start with
/// `prefix` is alive (its key exists): a read hold lives by its timeout
/// key, not its field. Sets `reads_alive`.
macro_rules! reads_alive_lua {
    () => {
        r#"
local reads_alive = false
for n = 1, count do
    if redis.call('exists', prefix .. ':' .. n) == 1 then
        reads_alive = true
        break
    end
end
"#
    };
}
pub(super) use reads_alive_lua;
