//! Hostile input and cancellation storms: a tiny lease ends with a guard or
//! a typed error (never a hang), a script that fails changes nothing, and a
//! caller that drops its own future never makes a healthy node look down.

use std::time::Duration;

use multilock::{Client, DistributedLock, Error, Guard, Health, Node};
use multilock_testkit::{TestServer, protocol};
use redis::aio::MultiplexedConnection;

use crate::common::*;

// ---------------------------------------------------------------------------
// Tiny leases

/// What one acquire with a tiny lease ended with, within its own bound.
fn ended_well<T: std::fmt::Debug>(
    what: &str,
    outcome: Result<multilock::Result<T>, impl std::fmt::Debug>,
) {
    match outcome {
        Err(elapsed) => panic!("{what}: still pending at the end of its bound ({elapsed:?})"),
        Ok(Ok(_) | Err(Error::InvalidArgument(_))) => {}
        Ok(Err(err)) => panic!("{what}: an error other than bad input: {err:?}"),
    }
}

/// Every acquire method of `lock` with `lease` ends with a guard, a typed
/// error, or (a bounded wait) the end of its bound.
async fn tiny_lease_ends<L: DistributedLock + std::fmt::Debug>(
    lock: &L,
    lease: Duration,
    kind: &str,
) {
    // Waiting as long as it takes: a hang is the defect; 10 s is far more
    // than a grant takes on a healthy local server.
    let outcome = tokio::time::timeout(PATIENCE * 2, lock.lock_with_lease(lease)).await;
    let release = |guard: Option<Guard>| async {
        if let Some(guard) = guard {
            let _ = guard.unlock().await;
        }
    };
    let guard = match &outcome {
        Ok(Ok(_)) => outcome.map(|o| o.ok()).unwrap(),
        _ => {
            ended_well(&format!("{kind}.lock_with_lease({lease:?})"), outcome);
            None
        }
    };
    release(guard).await;
    let wait = Duration::from_millis(500);
    let outcome = tokio::time::timeout(wait + PATIENCE, lock.try_lock_for(wait, Some(lease))).await;
    let guard = match &outcome {
        Ok(Ok(_)) => outcome.map(|o| o.ok().flatten()).unwrap(),
        _ => {
            ended_well(&format!("{kind}.try_lock_for(500 ms, {lease:?})"), outcome);
            None
        }
    };
    release(guard).await;
}

/// A lease from 1 to 5 ms, on every lock type and every acquire method,
/// ends with a guard or a typed error; so does `lock()` under a watchdog
/// that short (the client refuses it, or the lock is granted). It used to
/// hang: every grant was read after its 1 ms could have run out, and the
/// single-node lock retried such grants for ever.
#[tokio::test]
async fn a_tiny_lease_ends_with_a_guard_or_a_typed_error() {
    let servers = servers(3).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    let client = client();
    for ms in 1..=5 {
        let lease = Duration::from_millis(ms);
        let name = format!("tiny-{ms}");
        tiny_lease_ends(&client.lock(&nodes[0], &name).unwrap(), lease, "Lock").await;
        let parts = nodes
            .iter()
            .map(|n| client.lock(n, &name).unwrap())
            .collect();
        tiny_lease_ends(&client.multi_lock(parts).unwrap(), lease, "MultiLock").await;
        tiny_lease_ends(
            &client.red_lock_on(&nodes, &name).unwrap(),
            lease,
            "RedLock",
        )
        .await;
        // `lock()` renews with the watchdog's lease: a tiny one is refused
        // when the client is built, or works.
        if let Ok(tiny) = Client::builder().watchdog_timeout(lease).build() {
            let lock = tiny.lock(&nodes[0], &name).unwrap();
            let outcome = tokio::time::timeout(PATIENCE * 2, lock.lock()).await;
            ended_well(&format!("lock() under a {lease:?} watchdog"), outcome);
        }
    }
    // Leases from the smallest accepted one up are granted.
    let smallest = multilock::MIN_LEASE;
    let lock = client.lock(&nodes[0], "smallest").unwrap();
    lock.lock_with_lease(smallest)
        .await
        .unwrap()
        .unlock()
        .await
        .ok();
}

// ---------------------------------------------------------------------------
// Scripts that fail change nothing

/// A value of the wrong type for a key: what a hostile or mistaken writer
/// may have left there.
#[derive(Debug, Clone, Copy)]
enum Planted {
    /// A string that is no integer.
    Text,
    List,
    Set,
    SortedSet,
    Stream,
    /// A hash (for a key that is a string).
    Hash,
    /// The lock's hash with this hold's field set to a non-integer.
    FieldNotACount,
}

impl Planted {
    /// Writes it at `key`, with a long expiry (PTTL is compared too).
    async fn plant(self, conn: &mut MultiplexedConnection, key: &str, field: &str) {
        let mut pipe = redis::pipe();
        pipe.del(key).ignore();
        match self {
            Planted::Text => pipe.set(key, "not-a-number").ignore(),
            Planted::List => pipe.rpush(key, "x").ignore(),
            Planted::Set => pipe.sadd(key, "x").ignore(),
            Planted::SortedSet => pipe.zadd(key, "x", 1).ignore(),
            Planted::Stream => pipe
                .cmd("XADD")
                .arg(key)
                .arg("*")
                .arg("f")
                .arg("v")
                .ignore(),
            Planted::Hash => pipe.hset(key, "f", "v").ignore(),
            Planted::FieldNotACount => pipe.hset(key, field, "not-a-count").ignore(),
        };
        pipe.pexpire(key, 600_000).ignore();
        pipe.query_async::<()>(conn).await.unwrap();
    }
}

/// Every key's `DUMP` (its type and value, byte for byte) and its expiry.
#[derive(Debug)]
struct Snapshot(Vec<(Option<Vec<u8>>, i64)>);

impl Snapshot {
    async fn take(conn: &mut MultiplexedConnection, keys: &[String]) -> Snapshot {
        let mut seen = Vec::new();
        for key in keys {
            let dump: Option<Vec<u8>> =
                redis::cmd("DUMP").arg(key).query_async(conn).await.unwrap();
            let pttl: i64 = redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap();
            seen.push((dump, pttl));
        }
        Snapshot(seen)
    }

    /// The same values, and expiries that only ran on (by less than a
    /// second: the time between the two snapshots).
    fn unchanged_since(&self, before: &Snapshot) -> bool {
        self.0
            .iter()
            .zip(&before.0)
            .all(|((dump, pttl), (dump0, pttl0))| {
                dump == dump0
                    && if *pttl < 0 || *pttl0 < 0 {
                        pttl == pttl0
                    } else {
                        pttl <= pttl0 && pttl0 - pttl < 1_000
                    }
            })
    }
}

/// One script under test: its call, the keys it touches (as values a
/// hostile writer can plant) and the state that makes it write.
struct Case {
    script: &'static str,
    /// The call, built afresh for each run.
    call: fn(&Fixture) -> redis::ScriptInvocation<'static>,
    /// Keys the script reads or writes, with the wrong types to plant there.
    keys: fn(&Fixture) -> Vec<Target>,
    /// What the server holds before the call, so the script would write
    /// if nothing were wrong.
    setup: fn(&Fixture) -> redis::Pipeline,
}

/// A key a script touches, and the wrong types to plant there.
type Target = (String, Vec<Planted>);

struct Fixture {
    name: String,
    field: String,
    hold: String,
}

const NOT_A_HASH: [Planted; 5] = [
    Planted::Text,
    Planted::List,
    Planted::Set,
    Planted::SortedSet,
    Planted::Stream,
];
const NOT_A_STRING: [Planted; 5] = [
    Planted::List,
    Planted::Set,
    Planted::SortedSet,
    Planted::Stream,
    Planted::Hash,
];

fn lock_key(f: &Fixture, with_field: bool) -> Target {
    let mut planted = NOT_A_HASH.to_vec();
    if with_field {
        planted.push(Planted::FieldNotACount);
    }
    (f.name.clone(), planted)
}

fn counter_key(f: &Fixture) -> Target {
    let mut planted = vec![Planted::Text];
    planted.extend(NOT_A_STRING);
    (protocol::token_key(&f.name), planted)
}

fn latch_key(f: &Fixture) -> Target {
    (
        protocol::unlock_latch(&f.name, &f.hold),
        NOT_A_STRING.to_vec(),
    )
}

/// The lock held by this fixture's field (count 1, a minute left).
fn held(f: &Fixture) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.hset(&f.name, &f.field, 1).ignore();
    pipe.pexpire(&f.name, 60_000).ignore();
    pipe
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            script: "acquire (fresh)",
            call: |f| protocol::acquire(&f.name, &f.field, Duration::from_secs(30), &f.hold),
            keys: |f| vec![lock_key(f, false), latch_key(f)],
            setup: |_| redis::pipe(),
        },
        Case {
            script: "acquire (re-entry)",
            call: |f| protocol::acquire(&f.name, &f.field, Duration::from_secs(30), &f.hold),
            keys: |f| vec![lock_key(f, true), latch_key(f)],
            setup: held,
        },
        Case {
            script: "acquire (fenced, one node)",
            call: |f| protocol::acquire_fenced(&f.name, &f.field, Duration::from_secs(30), &f.hold),
            keys: |f| vec![lock_key(f, false), latch_key(f), counter_key(f)],
            setup: |_| redis::pipe(),
        },
        Case {
            script: "acquire (fenced, a quorum's part)",
            call: |f| {
                protocol::acquire_quorum_fenced(&f.name, &f.field, Duration::from_secs(30), &f.hold)
            },
            keys: |f| vec![lock_key(f, false), latch_key(f), counter_key(f)],
            setup: |f| {
                let mut pipe = redis::pipe();
                pipe.set(protocol::token_key(&f.name), 7).ignore();
                pipe
            },
        },
        Case {
            script: "release",
            call: |f| protocol::release(&f.name, &f.field, &f.hold),
            keys: |f| vec![lock_key(f, true), latch_key(f)],
            setup: held,
        },
        Case {
            script: "rollback",
            call: |f| protocol::rollback(&f.name, &f.field, &f.hold, 0),
            keys: |f| vec![lock_key(f, true), latch_key(f)],
            setup: |f| {
                let mut pipe = held(f);
                pipe.set(protocol::unlock_latch(&f.name, &f.hold), "granted")
                    .ignore();
                pipe
            },
        },
        Case {
            script: "extend",
            call: |f| protocol::extend(&f.name, &f.field, Duration::from_secs(90)),
            keys: |f| vec![lock_key(f, false)],
            setup: held,
        },
        Case {
            script: "force_unlock",
            call: |f| protocol::force_unlock(&f.name),
            keys: |f| vec![lock_key(f, false)],
            setup: held,
        },
        Case {
            script: "raise_token",
            call: |f| protocol::raise_token(&f.name, 1_000),
            keys: |f| vec![counter_key(f)],
            setup: |_| redis::pipe(),
        },
    ]
}

/// Every script, with every key it touches pre-set to every wrong type,
/// replies with an error and changes nothing, byte for byte: Redis does not
/// undo a script's writes when it fails half-way, so each script reads and
/// checks everything before its first write. (A fenced acquire used to
/// write the lock's hash before its INCR failed on a counter that was no
/// integer, leaving the lock held by nobody for its lease.)
#[tokio::test]
async fn a_script_that_fails_changes_nothing() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let mut failures = Vec::new();
    for case in cases() {
        let fixture = Fixture {
            name: format!("hostile:{}", case.script.replace(' ', "-")),
            field: protocol::field("11111111-2222-3333-4444-555555555555", "owner"),
            hold: protocol::new_hold_id(),
        };
        let keys = (case.keys)(&fixture);
        let all_keys: Vec<String> = keys.iter().map(|(k, _)| k.clone()).collect();
        for (key, planted) in &keys {
            for plant in planted {
                redis::cmd("FLUSHALL")
                    .query_async::<()>(&mut conn)
                    .await
                    .unwrap();
                let setup = (case.setup)(&fixture);
                if setup.cmd_iter().next().is_some() {
                    setup.query_async::<()>(&mut conn).await.unwrap();
                }
                plant.plant(&mut conn, key, &fixture.field).await;
                let before = Snapshot::take(&mut conn, &all_keys).await;
                let reply: redis::RedisResult<redis::Value> =
                    (case.call)(&fixture).invoke_async(&mut conn).await;
                let after = Snapshot::take(&mut conn, &all_keys).await;
                let what = format!("{} with {key} = {plant:?}", case.script);
                if reply.is_ok() {
                    failures.push(format!("{what}: replied {reply:?}, not an error"));
                }
                if !after.unchanged_since(&before) {
                    failures.push(format!("{what}: changed the keys ({reply:?})"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The batched renewal is the one exception to "an error": one bad key never
/// spoils the batch. A key of the wrong type is reported as not renewed,
/// the other holds of the batch are renewed, and the bad key is untouched.
#[tokio::test]
async fn a_bad_key_in_a_renewal_batch_changes_nothing() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let field = protocol::field("11111111-2222-3333-4444-555555555555", "owner");
    for plant in NOT_A_HASH.iter().chain([&Planted::FieldNotACount]) {
        redis::cmd("FLUSHALL")
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        let mut good = redis::pipe();
        good.hset("good", &field, 1)
            .ignore()
            .pexpire("good", 1_000)
            .ignore();
        good.query_async::<()>(&mut conn).await.unwrap();
        plant.plant(&mut conn, "bad", &field).await;
        let before = Snapshot::take(&mut conn, &["bad".to_owned()]).await;
        let renewed: Vec<i64> = protocol::renew_batch(
            [
                ("good", field.as_str(), false),
                ("bad", field.as_str(), false),
            ],
            Duration::from_secs(30),
        )
        .invoke_async(&mut conn)
        .await
        .unwrap();
        let after = Snapshot::take(&mut conn, &["bad".to_owned()]).await;
        let good_ttl: i64 = redis::cmd("PTTL")
            .arg("good")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(renewed, vec![1, 0], "{plant:?}");
        assert!(
            after.unchanged_since(&before),
            "{plant:?}: the bad key changed"
        );
        assert!(
            good_ttl > 20_000,
            "{plant:?}: the good hold was not renewed"
        );
    }
}

/// The reported repro: a fenced single-node `try_lock` on a name whose
/// counter holds a non-integer fails with a Redis error, and leaves no
/// lock behind (it used to leave the hash held by nobody for the lease).
#[tokio::test]
async fn a_failed_fenced_acquire_leaves_no_lock() {
    let server = server().await;
    let node = node(&server);
    let lock = long_lease_client()
        .lock(&node, "fenced-broken")
        .unwrap()
        .with_fencing();
    run::<()>(
        &server.url(),
        redis::cmd("SET")
            .arg(protocol::token_key("fenced-broken"))
            .arg("garbage"),
    )
    .await
    .unwrap();
    let err = lock.try_lock().await.unwrap_err();
    assert!(matches!(err, Error::Redis { .. }), "{err:?}");
    assert!(
        !exists(&server.url(), "fenced-broken").await,
        "a failed acquire left the lock written"
    );
}

// ---------------------------------------------------------------------------
// Cancellation storms

/// How a caller gives up on an acquire.
#[derive(Debug, Clone, Copy)]
enum Cancel {
    /// `tokio::time::timeout` of 0 to 3 ms.
    Timeout(u64),
    /// `select!` against a sleep of 0 to 3 ms.
    Select(u64),
    /// Polled a few times by hand, then dropped.
    AfterPolls(usize),
}

impl Cancel {
    fn random() -> Option<Cancel> {
        match rand::random_range(0..9) {
            0 => Some(Cancel::Timeout(rand::random_range(0..=3))),
            1 => Some(Cancel::Select(rand::random_range(0..=3))),
            2 => Some(Cancel::AfterPolls(rand::random_range(1..=4))),
            _ => None,
        }
    }

    /// Runs `acquire` until this cancellation cuts it off; `Some` if it
    /// finished first.
    async fn run<T>(self, acquire: impl Future<Output = T>) -> Option<T> {
        match self {
            Cancel::Timeout(ms) => tokio::time::timeout(Duration::from_millis(ms), acquire)
                .await
                .ok(),
            Cancel::Select(ms) => tokio::select! {
                out = acquire => Some(out),
                _ = tokio::time::sleep(Duration::from_millis(ms)) => None,
            },
            Cancel::AfterPolls(polls) => {
                let mut acquire = std::pin::pin!(acquire);
                for _ in 0..polls {
                    if let std::task::Poll::Ready(out) = futures::poll!(acquire.as_mut()) {
                        return Some(out);
                    }
                    tokio::task::yield_now().await;
                }
                None
            }
        }
    }
}

/// 2,000 acquires of one name by 4 tasks, about a third of them cancelled
/// at random points: every acquire that was not cancelled ends with a
/// guard or `None`, never an error, and the node is never reported down. A
/// caller dropping its own future is not a node failure. (1 to 7 of them
/// used to fail with `NodeUnavailable(Timeout)` on a local server.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_callers_never_make_a_healthy_node_look_down() {
    let server = server().await;
    let node = node_at(&server.url(), Duration::from_secs(3));
    let client = long_lease_client();
    let lock = client.lock(&node, "storm").unwrap();
    let watch = {
        let node = node.clone();
        tokio::spawn(async move {
            loop {
                if let Health::Suspect { .. } = node.health() {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let tasks: Vec<_> = (0..4)
        .map(|task| {
            let lock = lock.clone();
            tokio::spawn(async move {
                let mut errors = Vec::new();
                let (mut cancelled, mut finished) = (0, 0);
                for i in 0..500 {
                    let lease = Duration::from_secs(10);
                    let wait = Duration::from_millis(rand::random_range(0..50));
                    let acquire = async {
                        match i % 3 {
                            0 => lock.lock().await.map(Some),
                            1 => lock.lock_with_lease(lease).await.map(Some),
                            _ => lock.try_lock_for(wait, Some(lease)).await,
                        }
                    };
                    let outcome = match Cancel::random() {
                        Some(cancel) => match cancel.run(acquire).await {
                            Some(outcome) => outcome,
                            None => {
                                cancelled += 1;
                                continue;
                            }
                        },
                        None => acquire.await,
                    };
                    finished += 1;
                    match outcome {
                        Ok(Some(guard)) => {
                            if let Err(err) = guard.unlock().await {
                                errors.push(format!("task {task}, acquire {i}: unlock: {err:?}"));
                            }
                        }
                        Ok(None) => {}
                        Err(err) => errors.push(format!("task {task}, acquire {i}: {err:?}")),
                    }
                }
                (errors, cancelled, finished)
            })
        })
        .collect();
    let mut errors = Vec::new();
    let (mut cancelled, mut finished) = (0, 0);
    for task in tasks {
        let (e, c, f) = task.await.unwrap();
        errors.extend(e);
        cancelled += c;
        finished += f;
    }
    let went_suspect = watch.is_finished();
    watch.abort();
    assert!(
        cancelled > 300,
        "too few cancelled ({cancelled}) to test anything"
    );
    assert!(
        errors.is_empty(),
        "{} of {finished} acquires failed:\n{}",
        errors.len(),
        errors.join("\n")
    );
    assert!(!went_suspect, "the node was reported suspect");
    assert_eq!(node.health(), Health::Healthy);
    // Nothing is left held by a cancelled acquire.
    take_and_release(&lock, PATIENCE, "a cancelled acquire left the lock held").await;
}
