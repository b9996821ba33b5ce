//! The wire contract's own checks: key names, replies, the publish argument.

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
    calls.push(("extend", false, sent(&extend(keys, "f", second, false))));
    calls.push((
        "renew",
        false,
        sent(&renew_batch([("a", "f", false), ("b", "g", true)], second)),
    ));
    calls.push((
        "raise",
        false,
        sent(&raise_token(keys, 5, Missing::Seed, None)),
    ));
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
    calls.push(("bury", false, sent(&bury(&keys.unlock_latch("r"), second))));
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
            (rest[digits..].starts_with(']') && digits > 0).then(|| rest[..digits].parse().unwrap())
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
    let raise = raise_token(&keys, 5, Missing::Seed, None);
    assert_eq!(
        raise.decode(ints(&[-1, 5, 0])).unwrap(),
        Raised {
            before: None,
            after: 5,
            vouched: false
        }
    );
    assert_eq!(
        raise.decode(ints(&[9, 9, 1])).unwrap(),
        Raised {
            before: Some(9),
            after: 9,
            vouched: true
        }
    );
    assert!(
        raise.decode(ints(&[9, 9])).is_err(),
        "a reply without the vouch"
    );
    assert!(
        raise.decode(ints(&[-2, 0, 0])).is_err(),
        "any run was asked for"
    );
    let repair = repair_token(&keys, 5, None, "abc");
    assert_eq!(
        repair.decode(ints(&[-2, 0, 0])).unwrap(),
        None,
        "written on another run: nothing"
    );
    assert_eq!(
        repair.decode(ints(&[3, 5, 1])).unwrap(),
        Some(Raised {
            before: Some(3),
            after: 5,
            vouched: true
        })
    );
    let renew = renew_batch([("a", "f", false), ("b", "g", true)], second);
    assert_eq!(renew.decode(ints(&[1, 0])).unwrap(), vec![true, false]);
}
