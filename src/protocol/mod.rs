//! The wire contract: Redisson's lock protocol, built in one place.
//!
//! The data layout is the contract shared with Java (Redisson) and Node
//! services: the lock is a hash named after the lock, whose field
//! `<client-uuid>:<owner>` holds the hold count; unlocks publish `0` on
//! `redisson_lock__channel:{name}` (with `spublish` on a cluster in sharded
//! mode, see [`Publish`]). The scripts are our own; their behaviour is
//! Redisson's.
//!
//! Every script call is built here by a function named after the operation
//! ([`acquire`], [`release`], [`renew_batch`], ...), which fixes the KEYS and
//! ARGV order and how the reply is decoded. Nothing else in the crate (nor
//! the test kit and the benchmarks, which reach these through the `wire`
//! module) writes a key or an argument of a lock script.

use std::time::Duration;

use redis::{Cmd, FromRedisValue, RedisResult, Script, ScriptInvocation, Value};

use crate::timing::{millis, ttl_from_pttl};

pub(crate) mod fair;
mod fencing;
mod holds;
mod inspect;
mod read_keys;
pub(crate) mod rw;

pub(crate) use fencing::{
    Fencing, Missing, Raised, raise_token, read_token, repair_token, server_mark,
};
pub(crate) use holds::{
    acquire, bury, extend, force_unlock, parse_acquired, release, renew_batch, rollback,
};
pub(crate) use inspect::{inspect, sample_lock_shape, scan_hashes};

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

/// Which command a lock's releases publish with: `publish`, or `spublish`
/// on a Redis Cluster with sharded pub/sub (Redisson's
/// `shardedSubscriptionMode`). Shared with the node, which may learn the
/// answer (Auto mode) at its first contact with the cluster.
///
/// Every script that publishes takes the command as its last argument
/// (`redis.call(ARGV[#ARGV], ...)`, as Redisson passes it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Publish(Option<std::sync::Arc<std::sync::atomic::AtomicBool>>);

impl Publish {
    /// Always `publish` (standalone and Sentinel nodes).
    pub(crate) const PLAIN: Publish = Publish(None);

    /// `spublish` while `sharded` is true, else `publish`.
    #[cfg(any(feature = "cluster", feature = "wire", test))]
    pub(crate) fn shared(sharded: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Publish {
        Publish(Some(sharded))
    }

    /// The command name to pass to a script.
    pub(crate) fn command(&self) -> &'static str {
        match &self.0 {
            Some(sharded) if sharded.load(std::sync::atomic::Ordering::Relaxed) => "spublish",
            _ => "publish",
        }
    }
}

/// The names one lock uses on the server, computed once per lock.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// The lock's hash: its name. Shared: the client's record of every hold
    /// is keyed by it.
    pub(crate) name: std::sync::Arc<str>,
    /// The pub/sub channel waiters listen on.
    pub(crate) channel: String,
    /// The fencing token counter (Redisson's fenced lock).
    pub(crate) token: String,
    /// The command releases publish with (the last argument of every
    /// script that publishes).
    pub(crate) publish: Publish,
}

impl LockKeys {
    pub(crate) fn new(name: &str) -> LockKeys {
        LockKeys {
            name: name.into(),
            channel: prefixed("redisson_lock__channel", name),
            token: prefixed("redisson_lock_token", name),
            publish: Publish::PLAIN,
        }
    }

    /// These names, whose scripts publish with `publish` (see [`Publish`]).
    pub(crate) fn with_publish(mut self, publish: Publish) -> LockKeys {
        self.publish = publish;
        self
    }

    /// The vouch of the fencing counter, `multilock_token_vouch:{name}`
    /// (in the counter's slot): the `run_id`, replication ID and value
    /// a seal or a repair last left the counter at. Made on use: only multi-node
    /// fencing needs it.
    pub(crate) fn token_vouch(&self) -> String {
        prefixed("multilock_token_vouch", &self.name)
    }

    /// The names of a read-write lock: its channel is
    /// `redisson_rwlock:{name}`, shared by readers and writers.
    pub(crate) fn read_write(name: &str) -> LockKeys {
        LockKeys {
            channel: prefixed("redisson_rwlock", name),
            ..LockKeys::new(name)
        }
    }

    /// The key that remembers one release's result, so a retried release
    /// with the same request id returns the first answer.
    pub(crate) fn unlock_latch(&self, request_id: &str) -> String {
        let mut latch =
            prefixed_with_room("redisson_unlock_latch", &self.name, 1 + request_id.len());
        latch.push(':');
        latch.push_str(request_id);
        latch
    }
}

/// Hash slots of a Redis Cluster.
#[cfg(any(feature = "cluster", feature = "wire"))]
pub const SLOTS: u16 = 16384;

/// The hash slot of `key` in a Redis Cluster: CRC16 (XMODEM) of its hash
/// tag (the part between the first `{` and the next `}`, when not empty),
/// else of the whole key, modulo 16384. Every key of one lock shares the
/// name's slot.
#[cfg(any(feature = "cluster", feature = "wire"))]
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let crc = hashed.iter().fold(0u16, |mut crc, &byte| {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = (crc << 1) ^ if crc & 0x8000 != 0 { 0x1021 } else { 0 };
        }
        crc
    });
    crc % SLOTS
}

/// The hash field of a hold: `<client-uuid>:<owner>`.
pub(crate) fn field(client_id: &str, owner: &str) -> std::sync::Arc<str> {
    // Built by hand, not `format!`: this runs for every acquire.
    let mut field = String::with_capacity(client_id.len() + 1 + owner.len());
    field.push_str(client_id);
    field.push(':');
    field.push_str(owner);
    field.into()
}

/// Redisson's `prefixName`: `prefix:{name}`, or `prefix:name` when the name
/// already carries a hash tag.
pub(super) fn prefixed(prefix: &str, name: &str) -> String {
    prefixed_with_room(prefix, name, 0)
}

/// [`prefixed`], with `room` bytes more capacity for what the caller adds.
fn prefixed_with_room(prefix: &str, name: &str, room: usize) -> String {
    let mut key = String::with_capacity(prefix.len() + name.len() + 3 + room);
    key.push_str(prefix);
    key.push(':');
    if name.contains('{') {
        key.push_str(name);
    } else {
        key.push('{');
        key.push_str(name);
        key.push('}');
    }
    key
}

/// The write acquire's reply when a read holder asks for the write lock
/// ([`Acquired::UpgradeRefused`]). Here, beside the reply it reads as: the
/// read-write scripts send it and the one acquire parser reads it.
pub(crate) const UPGRADE_REFUSED: i64 = -4;

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
    /// Refused because the caller holds reads of the read-write lock whose
    /// write lock it asked for: a read-write lock does not upgrade.
    UpgradeRefused,
}

/// What a granted acquire left on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The key's TTL right after the grant: at least the lease asked for
    /// (a grant never shortens a hold), more when an earlier hold of the
    /// same owner asked for longer. `None`: exactly the lease (a fresh
    /// hold, whose reply is Redisson's bare nil).
    pub(crate) ttl: Option<Duration>,
    /// The owner's hold count after the grant: 1 for a fresh hold.
    pub(crate) count: u64,
    /// The fencing counter: after the grant's INCR (a fenced lock), or as
    /// the grant found it (a part of a fenced quorum lock, when it exists).
    /// See [`Fencing`].
    pub(crate) token: Option<u64>,
}

impl Grant {
    /// The key's TTL right after a grant that asked for `lease`.
    pub(crate) fn ttl(&self, lease: Duration) -> Duration {
        self.ttl.unwrap_or(lease)
    }
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

/// A fresh request id. From the thread-local RNG: `Uuid::new_v4` asks the
/// OS for entropy on every call. Encoded in place: one allocation.
pub(crate) fn new_request_id() -> std::sync::Arc<str> {
    let mut buf = uuid::Uuid::encode_buffer();
    let id = uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .hyphenated()
        .encode_lower(&mut buf);
    std::sync::Arc::from(&*id)
}

// ---------------------------------------------------------------------------
// Reads and replica sync

/// Whether anyone holds the lock.
pub(crate) fn is_locked(keys: &LockKeys) -> Call<bool> {
    let mut cmd = redis::cmd("EXISTS");
    cmd.arg(&*keys.name);
    Call::command(cmd, |reply| Ok(bool::from_redis_value(reply)?))
}

/// The hold count of `field` (0 when it does not hold the lock).
pub(crate) fn hold_count(keys: &LockKeys, field: &str) -> Call<u32> {
    let mut cmd = redis::cmd("HGET");
    cmd.arg(&*keys.name).arg(field);
    Call::command(cmd, |reply| {
        Ok(Option::<u32>::from_redis_value(reply)?.unwrap_or(0))
    })
}

/// The lock's remaining TTL; `None` when it does not exist or has no expiry.
pub(crate) fn remaining_ttl(keys: &LockKeys) -> Call<Option<Duration>> {
    let mut cmd = redis::cmd("PTTL");
    cmd.arg(&*keys.name);
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
pub(crate) fn all_scripts() -> [(&'static str, &'static str, &'static Script); 23] {
    [
        ("inspect", inspect::INSPECT_LUA, &inspect::INSPECT),
        ("extend", holds::EXTEND_LUA, &holds::EXTEND),
        ("acquire", holds::ACQUIRE_LUA, &holds::ACQUIRE),
        (
            "raise_token",
            fencing::RAISE_TOKEN_LUA,
            &fencing::RAISE_TOKEN,
        ),
        (
            "server_mark",
            fencing::SERVER_MARK_LUA,
            &fencing::SERVER_MARK,
        ),
        ("release", holds::RELEASE_LUA, &holds::RELEASE),
        ("rollback", holds::ROLLBACK_LUA, &holds::ROLLBACK),
        ("bury", holds::BURY_LUA, &holds::BURY),
        ("renew_batch", holds::RENEW_BATCH_LUA, &holds::RENEW_BATCH),
        (
            "force_unlock",
            holds::FORCE_UNLOCK_LUA,
            &holds::FORCE_UNLOCK,
        ),
        ("fair_acquire", fair::ACQUIRE_LUA, &fair::ACQUIRE),
        ("fair_give_up", fair::GIVE_UP_LUA, &fair::GIVE_UP),
        ("fair_release", fair::RELEASE_LUA, &fair::RELEASE),
        ("fair_rollback", fair::ROLLBACK_LUA, &fair::ROLLBACK),
        (
            "fair_force_unlock",
            fair::FORCE_UNLOCK_LUA,
            &fair::FORCE_UNLOCK,
        ),
        ("read_acquire", rw::READ_ACQUIRE_LUA, &rw::READ_ACQUIRE),
        ("write_acquire", rw::WRITE_ACQUIRE_LUA, &rw::WRITE_ACQUIRE),
        ("read_release", rw::READ_RELEASE_LUA, &rw::READ_RELEASE),
        ("write_release", rw::WRITE_RELEASE_LUA, &rw::WRITE_RELEASE),
        ("read_rollback", rw::READ_ROLLBACK_LUA, &rw::READ_ROLLBACK),
        (
            "write_rollback",
            rw::WRITE_ROLLBACK_LUA,
            &rw::WRITE_ROLLBACK,
        ),
        ("rw_force_unlock", rw::FORCE_UNLOCK_LUA, &rw::FORCE_UNLOCK),
        (
            "read_hold_count",
            rw::READ_HOLD_COUNT_LUA,
            &rw::READ_HOLD_COUNT,
        ),
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
mod tests;
