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
//! the benchmark, which reaches these through `testkit::protocol`) writes a
//! key or an argument of a lock script.

use std::time::Duration;

use redis::{Cmd, FromRedisValue, RedisResult, Script, ScriptInvocation, Value};

use crate::timing::{millis, ttl_from_pttl};

pub(crate) mod fair;
mod fencing;
mod holds;
pub(crate) mod rw;

pub(crate) use fencing::{Fencing, Missing, Raised, raise_token, read_token};
pub(crate) use holds::{
    acquire, extend, force_unlock, parse_acquired, release, renew_batch, rollback,
};

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
pub(crate) fn all_scripts() -> [(&'static str, &'static str, &'static Script); 19] {
    [
        ("extend", holds::EXTEND_LUA, &holds::EXTEND),
        ("acquire", holds::ACQUIRE_LUA, &holds::ACQUIRE),
        (
            "raise_token",
            fencing::RAISE_TOKEN_LUA,
            &fencing::RAISE_TOKEN,
        ),
        ("release", holds::RELEASE_LUA, &holds::RELEASE),
        ("rollback", holds::ROLLBACK_LUA, &holds::ROLLBACK),
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// What a script call puts on the wire: its script's hash, its KEYS and
    /// its ARGV.
    #[derive(Debug)]
    struct Sent {
        sha: String,
        keys: Vec<String>,
        args: Vec<String>,
    }

    /// A connection that answers nil to everything and keeps the last
    /// command it was sent.
    #[derive(Default)]
    struct Capture(Vec<String>);

    impl redis::ConnectionLike for Capture {
        fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
            let Value::Array(parts) = redis::parse_redis_value(cmd)? else {
                panic!("not a command: {cmd:?}");
            };
            self.0 = parts
                .into_iter()
                .map(|part| match part {
                    Value::BulkString(bytes) => String::from_utf8(bytes).unwrap(),
                    other => panic!("not a bulk string: {other:?}"),
                })
                .collect();
            Ok(Value::Nil)
        }

        fn req_packed_commands(&mut self, _: &[u8], _: usize, _: usize) -> RedisResult<Vec<Value>> {
            unreachable!("no pipelines here")
        }

        fn get_db(&self) -> i64 {
            0
        }

        fn check_connection(&mut self) -> bool {
            true
        }

        fn is_open(&self) -> bool {
            true
        }
    }

    /// The EVALSHA `call` sends.
    fn sent<R>(call: &Call<R>) -> Sent {
        let Request::Script(invocation) = &call.request else {
            panic!("not a script call");
        };
        let mut conn = Capture::default();
        let _: Value = invocation.invoke(&mut conn).unwrap();
        let [evalsha, sha, numkeys, rest @ ..] = &conn.0[..] else {
            panic!("{:?}", conn.0);
        };
        assert_eq!(evalsha, "EVALSHA");
        let numkeys: usize = numkeys.parse().unwrap();
        Sent {
            sha: sha.clone(),
            keys: rest[..numkeys].to_vec(),
            args: rest[numkeys..].to_vec(),
        }
    }

    /// Every script call a lock makes on `keys`, as (what it does, whether
    /// its script publishes, the call).
    fn every_script_call(keys: &LockKeys) -> Vec<(&'static str, bool, Sent)> {
        let queue = fair::QueueKeys::new("x");
        let second = Duration::from_secs(1);
        let spent = || vec!["s1".to_owned(), "s2".to_owned()];
        let mut calls = Vec::new();
        for fencing in [Fencing::Off, Fencing::Single, Fencing::Quorum] {
            calls.push((
                "acquire",
                false,
                sent(&acquire(keys, "f", second, "r", fencing)),
            ));
            calls.push((
                "fair acquire",
                false,
                sent(&fair::acquire(
                    keys, &queue, "f", second, "r", fencing, second, 7,
                )),
            ));
            calls.push((
                "write acquire",
                false,
                sent(&rw::write_acquire(keys, "f:write", second, "r", fencing)),
            ));
        }
        calls.push((
            "read acquire",
            false,
            sent(&rw::read_acquire(keys, "f", second, "r")),
        ));
        calls.push(("extend", false, sent(&extend(keys, "f", second))));
        calls.push((
            "renew",
            false,
            sent(&renew_batch([("a", "f"), ("b", "g")], second)),
        ));
        calls.push(("raise", false, sent(&raise_token(keys, 5, Missing::Seed))));
        for spent in [vec![], spent()] {
            calls.push((
                "release",
                true,
                sent(&release(keys, "f", "l", spent.clone())),
            ));
            calls.push((
                "fair release",
                true,
                sent(&fair::release(keys, &queue, "f", "l", spent.clone(), 7)),
            ));
            calls.push((
                "read release",
                true,
                sent(&rw::read_release(keys, "f", "l", spent.clone())),
            ));
            calls.push((
                "write release",
                true,
                sent(&rw::write_release(keys, "f:write", "l", spent)),
            ));
        }
        calls.push(("rollback", true, sent(&rollback(keys, "f", "r", 1, second))));
        calls.push((
            "fair rollback",
            true,
            sent(&fair::rollback(
                keys, &queue, "f", "r", 1, second, second, 7,
            )),
        ));
        calls.push((
            "fair give up",
            true,
            sent(&fair::give_up(keys, &queue, "f", second, 7)),
        ));
        for write in [false, true] {
            calls.push((
                "rw rollback",
                true,
                sent(&rw::rollback(keys, "f", write, "r", 1, second)),
            ));
            calls.push((
                "rw force unlock",
                true,
                sent(&rw::force_unlock(keys, write)),
            ));
        }
        calls.push(("force unlock", true, sent(&force_unlock(keys))));
        calls.push((
            "fair force unlock",
            true,
            sent(&fair::force_unlock(keys, &queue, 7)),
        ));
        calls
    }

    /// The source of the script whose hash is `sha`.
    fn source_of(sha: &str) -> (&'static str, &'static str) {
        all_scripts()
            .into_iter()
            .find(|(_, _, script)| script.get_hash() == sha)
            .map(|(name, source, _)| (name, source))
            .unwrap_or_else(|| panic!("no script {sha}"))
    }

    /// The highest `ARGV[<number>]` a script's source names.
    fn highest_fixed_argv(source: &str) -> usize {
        source
            .match_indices("ARGV[")
            .filter_map(|(at, _)| {
                let rest = &source[at + 5..];
                let digits = rest.find(|c: char| !c.is_ascii_digit())?;
                (rest[digits..].starts_with(']') && digits > 0)
                    .then(|| rest[..digits].parse().unwrap())
            })
            .max()
            .unwrap_or(0)
    }

    /// Every call whose script publishes passes the publish command as its
    /// last argument, which its script reads as `ARGV[#ARGV]` and reads no
    /// other way: `spublish` while the shared flag says sharded, `publish`
    /// otherwise. Scripts that do not publish get no command.
    #[test]
    fn the_publish_command_is_the_last_argument() {
        let sharded = Arc::new(AtomicBool::new(true));
        let flagged = LockKeys::new("x").with_publish(Publish::shared(sharded.clone()));
        let cases = [
            (LockKeys::new("x"), "publish"),
            (LockKeys::read_write("x"), "publish"),
            (flagged.clone(), "spublish"),
            (
                LockKeys::read_write("x").with_publish(Publish::shared(sharded.clone())),
                "spublish",
            ),
        ];
        for (keys, command) in cases {
            for (what, publishes, call) in every_script_call(&keys) {
                let (name, source) = source_of(&call.sha);
                let last = call.args.last().map(String::as_str);
                if publishes {
                    assert_eq!(last, Some(command), "{what} ({name}): {call:?}");
                    assert!(source.contains("ARGV[#ARGV]"), "{what} ({name})");
                    assert!(
                        highest_fixed_argv(source) < call.args.len(),
                        "{what} ({name}) reads its command as a fixed ARGV: {call:?}"
                    );
                    assert!(
                        !call.args[..call.args.len() - 1]
                            .iter()
                            .any(|arg| arg.ends_with("publish")),
                        "{what}: {call:?}"
                    );
                } else {
                    assert!(!source.contains("ARGV[#ARGV]"), "{what} ({name})");
                    assert!(
                        call.args.iter().all(|arg| !arg.ends_with("publish")),
                        "{what}: {call:?}"
                    );
                }
                assert!(call.keys.iter().all(|key| !key.is_empty()), "{what}");
            }
        }
        // The flag is read when a call is built: a node that learns it is
        // not sharded after all switches every lock that shares it.
        sharded.store(false, Ordering::Relaxed);
        assert_eq!(flagged.publish.command(), "publish");
        let call = sent(&release(&flagged, "f", "l", None));
        assert_eq!(call.args.last().map(String::as_str), Some("publish"));
        assert_eq!(Publish::PLAIN.command(), "publish");
        assert_eq!(Publish::default().command(), "publish");
    }

    /// Every script that publishes is called by a builder that passes the
    /// command: no script publishes any other way.
    #[test]
    fn every_publishing_script_takes_the_command() {
        let called: std::collections::HashSet<_> = every_script_call(&LockKeys::new("x"))
            .into_iter()
            .filter(|(_, publishes, _)| *publishes)
            .map(|(_, _, call)| source_of(&call.sha).0)
            .collect();
        for (name, source, _) in all_scripts() {
            let compact: String = source.split_whitespace().collect();
            assert!(!compact.contains("redis.call('publish'"), "{name}");
            assert!(!compact.contains("redis.call(\"publish\""), "{name}");
            assert!(!compact.contains("redis.pcall('publish'"), "{name}");
            assert!(!source.contains("'publish'"), "{name}");
            assert!(!source.contains("'spublish'"), "{name}");
            assert_eq!(
                source.contains("ARGV[#ARGV]"),
                called.contains(name),
                "{name}: a script that publishes must be called with the command"
            );
        }
        assert_eq!(called.len(), 12, "{called:?}");
    }

    /// The acquire script caps a re-entry's hold latch at the rollback
    /// window, written out in its Lua.
    #[test]
    fn the_hold_latch_lives_at_most_the_rollback_window() {
        let cap = format!(
            "math.min(lease, {})",
            crate::timing::ROLLBACK_WINDOW.as_millis()
        );
        assert!(holds::ACQUIRE_LUA.contains(&cap), "{cap}");
    }

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
        let call = acquire(&keys, "f", second, "r", Fencing::Off);
        let ints = |v: &[i64]| Value::Array(v.iter().map(|i| Value::Int(*i)).collect());
        // Redisson's own reply to a fresh grant: the lease, one hold.
        let fresh = call.decode(Value::Nil).unwrap();
        assert_eq!(
            fresh,
            Acquired::Granted(Grant {
                ttl: None,
                count: 1,
                token: None
            })
        );
        let Acquired::Granted(grant) = fresh else {
            unreachable!()
        };
        assert_eq!(grant.ttl(second), second);
        assert_eq!(
            call.decode(ints(&[1500, 2, -1])).unwrap(),
            Acquired::Granted(Grant {
                ttl: Some(Duration::from_millis(1500)),
                count: 2,
                token: None
            })
        );
        assert_eq!(
            call.decode(ints(&[1000, 1, 7])).unwrap(),
            Acquired::Granted(Grant {
                ttl: Some(second),
                count: 1,
                token: Some(7)
            })
        );
        assert_eq!(
            call.decode(Value::Int(1500)).unwrap(),
            Acquired::Taken(Some(Duration::from_millis(1500)))
        );
        assert_eq!(call.decode(Value::Int(-1)).unwrap(), Acquired::Taken(None));
        assert_eq!(call.decode(Value::Int(-3)).unwrap(), Acquired::Cancelled);
        assert!(call.decode(ints(&[1, 2])).is_err());
        let release = release(&keys, "f", &keys.unlock_latch("r"), None);
        assert_eq!(release.decode(Value::Nil).unwrap(), Released::NotHeld);
        assert_eq!(release.decode(Value::Int(0)).unwrap(), Released::StillHeld);
        assert_eq!(release.decode(Value::Int(1)).unwrap(), Released::Deleted);
        let raise = raise_token(&keys, 5, Missing::Seed);
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
