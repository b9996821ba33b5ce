//! The wire contract: Redisson's data layout and messages, retried and
//! overtaken requests, and the scripts' hashes (the connections requests
//! share are in `connections.rs`).

use std::time::Duration;

use crate::common::*;
use futures::StreamExt;
use multilock::Owner;
use multilock_testkit::RedisProcess;
use multilock_testkit::TestServer;
use multilock_testkit::protocol::{self, AcquireReply, scripts};
use multilock_testkit::redisson;

/// HGETALL shows `<uuid>:<owner>` -> count; PTTL matches the lease; a raw
/// SUBSCRIBE on `redisson_lock__channel:{name}` receives `0` on release.
#[tokio::test]
async fn layout_matches_redisson() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    // An explicit owner: the lock is re-entered below (count 2).
    let lock = client
        .lock(&node, "orders:42")
        .unwrap()
        .with_owner(Owner::new("job").unwrap());

    let url = server.url();
    // Redisson's channel, written out: the name is the contract.
    let mut stream = Box::pin(subscribe_raw(&url, "redisson_lock__channel:{orders:42}").await);

    let guard = lock.lock_with_lease(Duration::from_secs(20)).await.unwrap();
    let _again = lock.lock_with_lease(Duration::from_secs(20)).await.unwrap();
    let mut conn = raw(&url).await;
    let fields: Vec<(String, i64)> = redis::cmd("HGETALL")
        .arg("orders:42")
        .query_async(&mut conn)
        .await
        .unwrap();
    let owner = guard.owner().to_string();
    assert_eq!(fields, vec![(format!("{}:{}", client.id(), owner), 2)]);
    let kind: String = redis::cmd("TYPE")
        .arg("orders:42")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "hash");
    let pttl: i64 = redis::cmd("PTTL")
        .arg("orders:42")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        (19_000..=20_000).contains(&pttl),
        "PTTL {pttl} should match the 20 s lease"
    );
    let remaining = lock.remaining_ttl().await.unwrap().unwrap();
    assert!(remaining > Duration::from_secs(18));

    drop(_again); // released in the background: count 2 -> 1, nothing published
    eventually(
        PATIENCE,
        |count| format!("the dropped re-entry was not released: hold count {count}"),
        || async {
            match lock.hold_count().await.unwrap() {
                1 => Ok(()),
                count => Err(count),
            }
        },
    )
    .await;
    guard.unlock().await.unwrap();

    let message = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        message.get_channel_name(),
        "redisson_lock__channel:{orders:42}"
    );
    assert_eq!(message.get_payload::<String>().unwrap(), "0");
    assert!(!exists(&url, "orders:42").await);
}

/// A name that carries its own hash tag keeps it: no extra braces.
#[tokio::test]
async fn hash_tagged_names_keep_their_braces() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "{user:1}:cart").unwrap();
    // Redisson's channel for a hash-tagged name, written out.
    let mut stream =
        Box::pin(subscribe_raw(&server.url(), "redisson_lock__channel:{user:1}:cart").await);
    lock.lock().await.unwrap().unlock().await.unwrap();
    let message = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(message.get_payload::<String>().unwrap(), "0");
}

/// A Redisson-style holder (a field written by another process) excludes us,
/// and its release wakes our waiter: we interoperate through the wire format.
#[tokio::test]
async fn shares_a_lock_with_a_foreign_redisson_client() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "shared").unwrap();
    let mut conn = raw(&server.url()).await;
    redis::cmd("HSET")
        .arg("shared")
        .arg("b9f8c4e2-java-client:1")
        .arg(1)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    redis::cmd("PEXPIRE")
        .arg("shared")
        .arg(30_000)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    assert!(lock.try_lock().await.unwrap().is_none());
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move {
            lock.try_lock_for(Duration::from_secs(10), None)
                .await
                .unwrap()
                .is_some()
        }
    });
    wait_for_listeners(&server.url(), "shared", 1).await;
    // The Java side unlocks: DEL + PUBLISH 0, as Redisson's unlock script does.
    redis::cmd("DEL")
        .arg("shared")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    redis::cmd("PUBLISH")
        .arg(protocol::channel("shared"))
        .arg("0")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    assert!(waiter.await.unwrap());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken by the message, not the 30 s TTL"
    );
}

/// The test kit's Redisson 3.24+ client (the benchmark's limit) and our
/// locks exclude each other both ways, and its unlock wakes our waiter.
#[tokio::test]
async fn the_redisson_client_of_the_test_kit_interoperates() {
    let server = server().await;
    let node = node(&server);
    let lock = client().lock(&node, "both-ways").unwrap();
    let mut conn = raw(&server.url()).await;
    let java = "b9f8c4e2-0000-4000-8000-000000000001:1";
    let lease = Duration::from_secs(30);

    let ours = lock.lock_with_lease(lease).await.unwrap();
    let refused: Option<i64> = redisson::acquire("both-ways", java, lease)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert!(refused.is_some_and(|pttl| pttl > 0), "{refused:?}");
    ours.unlock().await.unwrap();

    let granted: Option<i64> = redisson::acquire("both-ways", java, lease)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(granted, None, "granted to the Redisson client");
    assert!(lock.try_lock().await.unwrap().is_none());
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_lock_for(Duration::from_secs(10), None).await }
    });
    wait_for_listeners(&server.url(), "both-ways", 1).await;
    let request = redisson::new_request_id();
    let released: Option<i64> = redisson::release("both-ways", java, &request, lease)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(released, Some(1));
    redisson::delete_latch("both-ways", &request)
        .exec_async(&mut conn)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let guard = waiter.await.unwrap().unwrap();
    assert!(guard.is_some(), "our waiter got the lock");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken by the message, not the 30 s TTL"
    );
}

/// timeout) is retried with the same request id, so the unlock reports the
/// release that happened, not a false "not held".
#[tokio::test]
async fn an_unlock_retried_after_a_timeout_reports_the_first_result() {
    let mut server = server().await;
    let node = node(&server); // response timeout 500 ms
    let lock = client().lock(&node, "retried").unwrap();
    // Scripts loaded, so the counts below are the release's alone.
    lock.lock().await.unwrap().unlock().await.unwrap();
    let guard = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
    let before = command_calls(&server.url()).await;

    server.pause().await.unwrap();
    let unlocking = tokio::spawn(guard.unlock());
    // Past the response timeout: the first release timed out and the retry
    // waits behind it.
    tokio::time::sleep(Duration::from_millis(800)).await;
    server.unpause().await.unwrap();

    let outcome = unlocking.await.unwrap();
    assert!(
        outcome.is_ok(),
        "the retry reports the first release: {outcome:?}"
    );
    assert!(!exists(&server.url(), "retried").await);
    let sent = delta(&before, &command_calls(&server.url()).await);
    assert_eq!(sent.get("evalsha"), Some(&2), "sent twice: {sent:?}");
    assert_eq!(sent.get("publish"), Some(&1), "applied once: {sent:?}");
}

/// Each script's hash is what `SCRIPT LOAD` returns for its source.
#[tokio::test]
async fn script_hashes_match_script_load() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    for (name, source, hash) in scripts() {
        let loaded: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(source)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(loaded, hash, "{name}");
    }
}

/// A release retried with the same request id (its reply was lost) returns
/// the first result, not a false "not held": the unlock latch.
#[tokio::test]
async fn a_retried_release_returns_its_first_result() {
    let server = server().await;
    let node = node(&server);
    let client = client();
    let lock = client.lock(&node, "latched").unwrap();
    let guard = lock.lock_with_lease(Duration::from_secs(10)).await.unwrap();
    let field = protocol::field(client.id(), guard.owner().as_str());
    let mut conn = raw(&server.url()).await;
    let first: Option<i64> = protocol::release("latched", &field, "request-1")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    let retried: Option<i64> = protocol::release("latched", &field, "request-1")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(first, Some(1), "deleted");
    assert_eq!(retried, Some(1), "the retry sees the first result");
    let latch_ttl: i64 = redis::cmd("PTTL")
        .arg(protocol::unlock_latch("latched", "request-1"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        latch_ttl > 0 && latch_ttl <= 10_000,
        "the latch expires: {latch_ttl}"
    );
    // A different request of a non-holder is refused.
    let other = protocol::release("latched", &field, "request-2");
    let refused: Option<i64> = other.invoke_async(&mut conn).await.unwrap();
    assert_eq!(refused, None);
    assert!(
        matches!(guard.unlock().await, Err(multilock::Error::NotHeld { .. })),
        "released underneath"
    );
}

/// A release's first send can reach the server after its retry went
/// through on another connection (a partition healed, and TCP delivered
/// the old segment late), and after the owner took the lock again: it must
/// answer with the retry's result from the latch and leave the new hold,
/// not release once more.
#[tokio::test]
async fn a_late_first_send_of_a_release_leaves_a_new_hold() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let field = protocol::field("late-client", "owner");
    let lease = Duration::from_secs(60);
    let granted: AcquireReply = protocol::acquire("late", &field, lease, "hold-1")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert!(matches!(granted, AcquireReply::Granted { count: 1, .. }));
    // The retry, on a fresh connection, goes through first.
    let retried: Option<i64> = protocol::release("late", &field, "hold-1")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(retried, Some(1));
    let again: AcquireReply = protocol::acquire("late", &field, lease, "hold-2")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert!(matches!(again, AcquireReply::Granted { count: 1, .. }));
    // The first send, late.
    let late: Option<i64> = protocol::release("late", &field, "hold-1")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(late, Some(1), "the retry's result");
    assert_eq!(
        hold_count(&server, "late", &field).await,
        1,
        "the new hold is left"
    );
}

/// The rollback of an acquire whose reply was lost can reach the server
/// before the acquire itself (the rollback goes on a fresh connection once
/// the acquire's own is broken): its tombstone refuses the acquire when it
/// comes, so no hold is left that nobody owns. A rollback of an applied
/// re-entry undoes it once, however often it is retried.
#[tokio::test]
async fn a_rollback_that_overtakes_its_acquire_refuses_it() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let field = protocol::field("rolled-back-client", "owner");
    let lease = Duration::from_secs(60);
    let acquire = |hold_id: &str| protocol::acquire("overtaken", &field, lease, hold_id);
    // The client has the outer hold on record once it is granted.
    let rollback =
        |hold_id: &str, known: u64| protocol::rollback("overtaken", &field, hold_id, known);

    let undone: Option<i64> = rollback("hold-1", 0).invoke_async(&mut conn).await.unwrap();
    assert_eq!(undone, None, "nothing applied yet, nothing undone");
    let late: AcquireReply = acquire("hold-1").invoke_async(&mut conn).await.unwrap();
    assert_eq!(
        late,
        AcquireReply::Cancelled,
        "the acquire that came after its rollback is refused"
    );
    assert!(!exists(&server.url(), "overtaken").await);

    let outer: AcquireReply = acquire("hold-2").invoke_async(&mut conn).await.unwrap();
    assert!(
        matches!(outer, AcquireReply::Granted { count: 1, .. }),
        "{outer:?}"
    );
    let inner: AcquireReply = acquire("hold-3").invoke_async(&mut conn).await.unwrap();
    assert!(
        matches!(inner, AcquireReply::Granted { count: 2, .. }),
        "re-entered: {inner:?}"
    );
    for attempt in ["first", "retried"] {
        let _: Option<i64> = rollback("hold-3", 1).invoke_async(&mut conn).await.unwrap();
        assert_eq!(
            hold_count(&server, "overtaken", &field).await,
            1,
            "after the {attempt} rollback: the outer hold is left"
        );
    }
}

/// A fresh hold writes the hash and its TTL, nothing else (Redisson's
/// acquire), so its rollback knows it by the count: the field holds more
/// than the client has on record. A re-entry that never ran is not
/// mistaken for one: the outer hold is on record.
#[tokio::test]
async fn a_fresh_hold_is_rolled_back_by_its_count() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let field = protocol::field("counted-client", "owner");
    let lease = Duration::from_secs(60);
    let fresh: AcquireReply = protocol::acquire("counted", &field, lease, "hold-1")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        fresh,
        AcquireReply::Granted {
            ttl: None,
            count: 1,
            token: None
        }
    );
    let keys: Vec<String> = run(&server.url(), redis::cmd("KEYS").arg("*"))
        .await
        .unwrap();
    assert_eq!(keys, ["counted"], "a fresh hold writes its hash only");

    // Applied, and on record: an unapplied re-entry's rollback spares it.
    let spared: Option<i64> = protocol::rollback("counted", &field, "hold-2", 1)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(spared, None);
    assert_eq!(hold_count(&server, "counted", &field).await, 1);
    // Applied, and not on record (its reply was lost): undone, once.
    for attempt in ["first", "retried"] {
        let _: Option<i64> = protocol::rollback("counted", &field, "hold-1", 0)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert!(
            !exists(&server.url(), "counted").await,
            "after the {attempt} rollback: the fresh hold is still there"
        );
    }
}

/// A release or rollback given up after its window is buried before its
/// owner's next request (`bury`): copies of the given-up request and of
/// its acquire that land after the owner's next grant change nothing. A
/// late release answers from the latch; a late rollback undoes nothing,
/// and the latch it rewrites stays as long as the burial; a late acquire
/// is refused. Unburied, each of them would take the new hold.
#[tokio::test]
async fn copies_of_a_buried_request_leave_the_next_hold() {
    let server = server().await;
    let url = server.url();
    let mut conn = raw(&url).await;
    let field = protocol::field("buried-client", "owner");
    let lease = Duration::from_secs(60);
    let burial = Duration::from_secs(30 * 60);
    let acquire = |hold_id: &str| protocol::acquire("buried", &field, lease, hold_id);
    for given_up in ["release", "rollback"] {
        // The hold whose release (or the acquire whose rollback) was given
        // up; then its lease ran out.
        let old: AcquireReply = acquire("old").invoke_async(&mut conn).await.unwrap();
        assert!(matches!(old, AcquireReply::Granted { count: 1, .. }));
        let _: i64 = run(&url, redis::cmd("DEL").arg("buried")).await.unwrap();
        let _: i64 = protocol::bury("buried", "old", burial)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        let new: AcquireReply = acquire("new").invoke_async(&mut conn).await.unwrap();
        assert!(matches!(new, AcquireReply::Granted { count: 1, .. }));

        if given_up == "release" {
            let late: Option<i64> = protocol::release("buried", &field, "old")
                .invoke_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(late, Some(0), "answered from the latch");
        } else {
            // Known holds as counted before the new grant: none.
            for copy in ["first", "second"] {
                let late: Option<i64> = protocol::rollback("buried", &field, "old", 0)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(late, None, "{copy} late rollback undid nothing");
                let latch = protocol::unlock_latch("buried", "old");
                assert!(
                    pttl(&url, &latch).await > lease.as_millis() as i64,
                    "the {copy} late rollback shortened the burial"
                );
            }
            let late: AcquireReply = acquire("old").invoke_async(&mut conn).await.unwrap();
            assert_eq!(late, AcquireReply::Cancelled);
        }
        assert_eq!(
            hold_count(&server, "buried", &field).await,
            1,
            "a late {given_up} took the new hold"
        );
        let _: String = run(&url, &redis::cmd("FLUSHALL")).await.unwrap();
    }
}

/// Every release's latch is deleted by a later release on the node (the
/// work Redisson's client does with a DEL of its own after each unlock):
/// a thousand lock+unlock cycles leave no more than a few latches, where
/// each would otherwise live its 10 s.
#[tokio::test]
async fn releases_leave_no_latches_behind() {
    let server = server().await;
    let node = node(&server);
    let lock = client().lock(&node, "tidy").unwrap();
    for _ in 0..1_000 {
        let guard = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
        guard.unlock().await.unwrap();
    }
    let latches: Vec<String> = run(
        &server.url(),
        redis::cmd("KEYS").arg("redisson_unlock_latch:*"),
    )
    .await
    .unwrap();
    assert!(latches.len() <= 8, "{} latches left", latches.len());
}

async fn hold_count(server: &RedisProcess, name: &str, field: &str) -> u32 {
    run::<Option<u32>>(&server.url(), redis::cmd("HGET").arg(name).arg(field))
        .await
        .unwrap()
        .unwrap_or(0)
}

/// Single-node fencing is Redisson's fenced lock: the counter
/// `redisson_lock_token:{name}` is INCRed by every grant (re-entries
/// included), and each guard carries the value it got. One difference: a
/// missing counter starts at the wall-clock floor (µs), not at 0, so a node
/// that lost its data does not hand out tokens from 1 again; a counter a
/// Redisson client already has is INCRed as it is.
#[tokio::test]
async fn single_node_fencing_tokens_follow_redisson() {
    let server = server().await;
    let node = node(&server);
    // An explicit owner: `first` is re-entered below.
    let first = client()
        .lock(&node, "fenced")
        .unwrap()
        .with_fencing()
        .with_owner(Owner::new("first").unwrap());
    let second = client().lock(&node, "fenced").unwrap().with_fencing();
    // Redisson's counter, written out: the name is part of the contract.
    let counter = || async {
        run::<u64>(
            &server.url(),
            redis::cmd("GET").arg("redisson_lock_token:{fenced}"),
        )
        .await
        .unwrap()
    };
    let g1 = first.lock().await.unwrap();
    let t1 = g1.fencing_token().unwrap();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(
        t1.abs_diff(now_us) < 60_000_000,
        "the first token {t1} is not the wall-clock floor (about {now_us})"
    );
    let reentered = first.lock().await.unwrap();
    assert_eq!(
        reentered.fencing_token(),
        Some(t1 + 1),
        "a re-entry INCRs too"
    );
    assert_eq!(counter().await, t1 + 1);
    reentered.unlock().await.unwrap();
    g1.unlock().await.unwrap();
    let g2 = second.lock().await.unwrap();
    assert_eq!(
        g2.fencing_token(),
        Some(t1 + 2),
        "the next holder's is higher"
    );
    assert_eq!(counter().await, t1 + 2);
    g2.unlock().await.unwrap();
    // A counter a Redisson client left is INCRed as it is.
    run::<()>(
        &server.url(),
        redis::cmd("SET")
            .arg("redisson_lock_token:{fenced}")
            .arg(41),
    )
    .await
    .unwrap();
    let g3 = second.lock().await.unwrap();
    assert_eq!(g3.fencing_token(), Some(42));
    g3.unlock().await.unwrap();
    // Unfenced locks carry no token and leave the counter alone.
    let plain = client().lock(&node, "fenced").unwrap();
    assert_eq!(plain.lock().await.unwrap().fencing_token(), None);
    assert_eq!(counter().await, 42);
}
