//! The test kit's foreign clients for the rest of Redisson's lock family,
//! against a real server: the fair lock (`redisson_fair`: queue, deadlines,
//! the head's private channel) and the read-write lock (`redisson_rwlock`:
//! mode, per-hold timeout keys, the shared channel). These scripts are the
//! reference the interop tests and benchmarks lean on.

use std::time::Duration;

use futures::{Stream, StreamExt};
use multilock_testkit::redisson_fair as fair;
use multilock_testkit::redisson_rwlock as rwlock;
use multilock_testkit::{TestServer, poll_until, redisson};
use redis::ScriptInvocation;
use redis::aio::MultiplexedConnection;

use crate::common::{PATIENCE, raw, server};

/// The lease of every hold here: outlives every test.
const LEASE: Duration = Duration::from_secs(30);

/// The hold field of owner `n` of one Redisson client.
fn owner(n: u32) -> String {
    format!("6f1c0e9a-1111-2222-3333-444455556666:{n}")
}

/// One raw command's reply.
async fn query<T: redis::FromRedisValue>(conn: &mut MultiplexedConnection, cmd: &redis::Cmd) -> T {
    cmd.query_async(conn).await.unwrap()
}

/// A pub/sub connection to `url` subscribed to the pattern `pattern`;
/// returns once the server confirmed the subscription.
async fn listen(url: &str, pattern: &str) -> impl Stream<Item = redis::Msg> + Unpin + use<> {
    let mut pubsub = redis::Client::open(url)
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    pubsub.psubscribe(pattern).await.unwrap();
    Box::pin(pubsub.into_on_message())
}

/// The next message of `stream` as (channel, payload), within [`PATIENCE`].
async fn next_message(stream: &mut (impl Stream<Item = redis::Msg> + Unpin)) -> (String, String) {
    let message = tokio::time::timeout(PATIENCE, stream.next())
        .await
        .expect("a message within PATIENCE")
        .expect("the subscription is open");
    (
        message.get_channel_name().to_owned(),
        message.get_payload().unwrap(),
    )
}

/// Publishes a sentinel on `channel` and expects it to be the next message
/// of `stream`: proof that nothing else was published before it.
async fn expect_nothing_before_sentinel(
    conn: &mut MultiplexedConnection,
    stream: &mut (impl Stream<Item = redis::Msg> + Unpin),
    channel: &str,
) {
    let _: i64 = query(conn, redis::cmd("PUBLISH").arg(channel).arg("sentinel")).await;
    assert_eq!(
        next_message(stream).await,
        (channel.to_owned(), "sentinel".to_owned()),
        "something was published before the sentinel"
    );
}

/// A script call's reply: nil (granted, or not held) or a number.
async fn eval(conn: &mut MultiplexedConnection, call: ScriptInvocation<'static>) -> Option<i64> {
    call.invoke_async(conn).await.unwrap()
}

/// One logical release: the script `call` makes for a fresh request id,
/// then the latch's DEL.
async fn released(
    conn: &mut MultiplexedConnection,
    name: &str,
    call: impl FnOnce(&str) -> ScriptInvocation<'static>,
) -> Option<i64> {
    let request = redisson::new_request_id();
    let reply = eval(conn, call(&request)).await;
    let delete = redisson::delete_latch(name, &request);
    delete.exec_async(conn).await.unwrap();
    reply
}

/// Fair try-acquire of `field` with the default wait, now.
async fn fair_acquire(conn: &mut MultiplexedConnection, name: &str, field: &str) -> Option<i64> {
    let now = fair::now_ms();
    eval(
        conn,
        fair::acquire(name, field, LEASE, fair::DEFAULT_WAIT, now),
    )
    .await
}

/// Fair release of `field` as unlock request `request`, now.
async fn fair_release_as(
    conn: &mut MultiplexedConnection,
    name: &str,
    field: &str,
    request: &str,
) -> Option<i64> {
    eval(
        conn,
        fair::release(name, field, request, LEASE, fair::now_ms()),
    )
    .await
}

/// One logical fair release of `field`.
async fn fair_release(conn: &mut MultiplexedConnection, name: &str, field: &str) -> Option<i64> {
    released(conn, name, |request| {
        fair::release(name, field, request, LEASE, fair::now_ms())
    })
    .await
}

/// The fair lock's queue, head first.
async fn queued(conn: &mut MultiplexedConnection, name: &str) -> Vec<String> {
    query(
        conn,
        redis::cmd("LRANGE").arg(fair::queue(name)).arg(0).arg(-1),
    )
    .await
}

/// The deadline of waiter `field` of fair lock `name`, if queued.
async fn deadline(conn: &mut MultiplexedConnection, name: &str, field: &str) -> Option<i64> {
    query(
        conn,
        redis::cmd("ZSCORE").arg(fair::timeouts(name)).arg(field),
    )
    .await
}

/// HGET of `field` in hash `name`.
async fn hget(conn: &mut MultiplexedConnection, name: &str, field: &str) -> Option<String> {
    query(conn, redis::cmd("HGET").arg(name).arg(field)).await
}

/// PTTL of `key` (-2: no such key).
async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    query(conn, redis::cmd("PTTL").arg(key)).await
}

/// Queued fair waiters are granted in the order they queued; a grant lowers the remaining deadlines by the wait.
#[tokio::test]
async fn fair_lock_grants_three_waiters_in_fifo_order() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "fair:fifo";
    let holder = owner(0);
    let waiters = [owner(1), owner(2), owner(3)];

    assert_eq!(fair_acquire(&mut conn, name, &holder).await, None);
    for waiter in &waiters {
        let ttl = fair_acquire(&mut conn, name, waiter).await;
        assert!(ttl.is_some_and(|ttl| ttl > 0), "{waiter} queued: {ttl:?}");
    }
    assert_eq!(queued(&mut conn, name).await, waiters);
    assert_eq!(fair_release(&mut conn, name, &holder).await, Some(1));

    for (i, next) in waiters.iter().enumerate() {
        // The waiters behind the head try first: the lock is free, yet not theirs.
        for later in &waiters[i + 1..] {
            let refused = fair_acquire(&mut conn, name, later).await;
            assert!(
                refused.is_some(),
                "{later} jumped the queue ahead of {next}"
            );
        }
        let mut behind = Vec::new();
        for later in &waiters[i + 1..] {
            behind.push(deadline(&mut conn, name, later).await);
        }
        assert_eq!(
            fair_acquire(&mut conn, name, next).await,
            None,
            "{next}'s turn"
        );
        for (later, before) in waiters[i + 1..].iter().zip(behind) {
            let after = deadline(&mut conn, name, later).await;
            let wait = fair::DEFAULT_WAIT.as_millis() as i64;
            assert_eq!(after, before.map(|d| d - wait), "{later}'s deadline");
        }
        assert_eq!(fair_release(&mut conn, name, next).await, Some(1));
    }
    let left: i64 = query(
        &mut conn,
        redis::cmd("EXISTS")
            .arg(fair::queue(name))
            .arg(fair::timeouts(name))
            .arg(name),
    )
    .await;
    assert_eq!(left, 0, "queue, deadlines and hash all gone");
}

/// A fair release publishes `0` on the head's private channel only, not on the lock's channel nor the others'.
#[tokio::test]
async fn fair_release_publishes_only_on_the_head_channel() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "fair:head";
    let (holder, head, second) = (owner(0), owner(1), owner(2));
    // Every channel of the lock: its own and each waiter's.
    let mut messages = listen(&server.url(), &format!("{}*", redisson::channel(name))).await;

    assert_eq!(fair_acquire(&mut conn, name, &holder).await, None);
    assert!(fair_acquire(&mut conn, name, &head).await.is_some());
    assert!(fair_acquire(&mut conn, name, &second).await.is_some());
    assert_eq!(fair_release(&mut conn, name, &holder).await, Some(1));

    assert_eq!(
        next_message(&mut messages).await,
        (fair::waiter_channel(name, &head), "0".to_owned())
    );
    let sentinel = format!("{}:sentinel", redisson::channel(name));
    expect_nothing_before_sentinel(&mut conn, &mut messages, &sentinel).await;
}

/// A release when the hash is already gone (an expired holder) still wakes the head, and replies 1 as Redisson does.
#[tokio::test]
async fn fair_release_of_a_gone_hash_still_notifies_the_head() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "fair:gone";
    let (holder, head) = (owner(0), owner(1));
    let mut messages = listen(&server.url(), &format!("{}*", redisson::channel(name))).await;

    assert_eq!(fair_acquire(&mut conn, name, &holder).await, None);
    assert!(fair_acquire(&mut conn, name, &head).await.is_some());
    let _: i64 = query(&mut conn, redis::cmd("DEL").arg(name)).await; // the lease ran out
    assert_eq!(fair_release(&mut conn, name, &holder).await, Some(1));
    assert_eq!(
        next_message(&mut messages).await,
        (fair::waiter_channel(name, &head), "0".to_owned())
    );
    assert_eq!(
        queued(&mut conn, name).await,
        [head.as_str()],
        "the head stays queued"
    );
}

/// A head whose deadline has passed is dropped by the next acquire, which then grants the waiter behind it.
#[tokio::test]
async fn fair_acquire_drops_a_stale_head() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "fair:stale";
    let (holder, stale, next) = (owner(0), owner(1), owner(2));
    let now = fair::now_ms();
    let short = Duration::from_secs(1);

    assert_eq!(
        eval(&mut conn, fair::acquire(name, &holder, LEASE, short, now)).await,
        None
    );
    // Deadlines: stale ~ now + 31 s, next ~ now + 31 s + 5 min.
    let queued_at = eval(&mut conn, fair::acquire(name, &stale, LEASE, short, now)).await;
    assert!(queued_at.is_some());
    let wait = fair::DEFAULT_WAIT;
    let queued_at = eval(&mut conn, fair::acquire(name, &next, LEASE, wait, now)).await;
    assert!(queued_at.is_some());
    assert_eq!(fair_release(&mut conn, name, &holder).await, Some(1));
    assert_eq!(
        queued(&mut conn, name).await,
        [stale.as_str(), next.as_str()]
    );

    // Two minutes later on the client's clock: the head's deadline is past.
    let later = now + 120_000;
    assert_eq!(
        eval(&mut conn, fair::acquire(name, &next, LEASE, wait, later)).await,
        None
    );
    assert_eq!(queued(&mut conn, name).await, Vec::<String>::new());
    assert_eq!(deadline(&mut conn, name, &stale).await, None);
    assert_eq!(hget(&mut conn, name, &next).await.as_deref(), Some("1"));
}

/// A waiter that gives up leaves the queue and the deadlines behind it drop by its wait; those ahead keep theirs.
#[tokio::test]
async fn fair_give_up_removes_the_waiter_and_lowers_the_deadlines_behind_it() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "fair:give-up";
    let holder = owner(0);
    let (ahead, quitter, behind) = (owner(1), owner(2), owner(3));
    let wait = fair::DEFAULT_WAIT;

    assert_eq!(fair_acquire(&mut conn, name, &holder).await, None);
    for waiter in [&ahead, &quitter, &behind] {
        assert!(fair_acquire(&mut conn, name, waiter).await.is_some());
    }
    let ahead_before = deadline(&mut conn, name, &ahead).await.unwrap();
    let behind_before = deadline(&mut conn, name, &behind).await.unwrap();

    let () = fair::give_up(name, &quitter, wait, fair::now_ms())
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        queued(&mut conn, name).await,
        [ahead.as_str(), behind.as_str()]
    );
    assert_eq!(deadline(&mut conn, name, &quitter).await, None);
    assert_eq!(deadline(&mut conn, name, &ahead).await, Some(ahead_before));
    assert_eq!(
        deadline(&mut conn, name, &behind).await,
        Some(behind_before - wait.as_millis() as i64)
    );
}

/// The holder re-enters a fair lock with waiters queued, without queueing; the inner release publishes nothing.
#[tokio::test]
async fn fair_reentry_by_the_holder_skips_the_queue() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "fair:reentry";
    let (holder, waiter) = (owner(0), owner(1));
    let mut messages = listen(&server.url(), &format!("{}*", redisson::channel(name))).await;

    assert_eq!(fair_acquire(&mut conn, name, &holder).await, None);
    assert!(fair_acquire(&mut conn, name, &waiter).await.is_some());
    assert_eq!(fair_acquire(&mut conn, name, &holder).await, None);
    assert_eq!(hget(&mut conn, name, &holder).await.as_deref(), Some("2"));
    assert_eq!(queued(&mut conn, name).await, [waiter.as_str()]);

    assert_eq!(fair_release(&mut conn, name, &holder).await, Some(0));
    assert_eq!(hget(&mut conn, name, &holder).await.as_deref(), Some("1"));
    let sentinel = format!("{}:sentinel", redisson::channel(name));
    expect_nothing_before_sentinel(&mut conn, &mut messages, &sentinel).await;
}

/// A fair release resent with the same request id returns the first result, without releasing or notifying again.
#[tokio::test]
async fn fair_retried_release_returns_the_first_result() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "fair:retry";
    let (holder, waiter) = (owner(0), owner(1));
    let mut messages = listen(&server.url(), &format!("{}*", redisson::channel(name))).await;

    assert_eq!(fair_acquire(&mut conn, name, &holder).await, None);
    assert_eq!(fair_acquire(&mut conn, name, &holder).await, None);
    assert!(fair_acquire(&mut conn, name, &waiter).await.is_some());

    let first = redisson::new_request_id();
    assert_eq!(
        fair_release_as(&mut conn, name, &holder, &first).await,
        Some(0)
    );
    assert_eq!(
        fair_release_as(&mut conn, name, &holder, &first).await,
        Some(0)
    );
    assert_eq!(
        hget(&mut conn, name, &holder).await.as_deref(),
        Some("1"),
        "released once"
    );

    let last = redisson::new_request_id();
    assert_eq!(
        fair_release_as(&mut conn, name, &holder, &last).await,
        Some(1)
    );
    assert_eq!(
        next_message(&mut messages).await,
        (fair::waiter_channel(name, &waiter), "0".to_owned())
    );
    assert_eq!(
        fair_release_as(&mut conn, name, &holder, &last).await,
        Some(1)
    );
    let sentinel = format!("{}:sentinel", redisson::channel(name));
    expect_nothing_before_sentinel(&mut conn, &mut messages, &sentinel).await;

    let latch = redisson::unlock_latch(name, &last);
    let ttl = pttl(&mut conn, &latch).await;
    assert!(
        ttl > 0 && ttl <= redisson::UNLOCK_LATCH_TTL.as_millis() as i64,
        "latch PTTL {ttl}"
    );
    for request in [&first, &last] {
        redisson::delete_latch(name, request)
            .exec_async(&mut conn)
            .await
            .unwrap();
    }
    assert_eq!(pttl(&mut conn, &latch).await, -2);
}

/// Read acquire of `field` with `lease`.
async fn read(
    conn: &mut MultiplexedConnection,
    name: &str,
    field: &str,
    lease: Duration,
) -> Option<i64> {
    eval(conn, rwlock::read_acquire(name, field, lease)).await
}

/// Write acquire of `field`.
async fn write(conn: &mut MultiplexedConnection, name: &str, field: &str) -> Option<i64> {
    eval(conn, rwlock::write_acquire(name, field, LEASE)).await
}

/// One logical read release of `field`.
async fn read_release(conn: &mut MultiplexedConnection, name: &str, field: &str) -> Option<i64> {
    released(conn, name, |request| {
        rwlock::read_release(name, field, request)
    })
    .await
}

/// One logical write release of `field`.
async fn write_release(conn: &mut MultiplexedConnection, name: &str, field: &str) -> Option<i64> {
    released(conn, name, |request| {
        rwlock::write_release(name, field, request, LEASE)
    })
    .await
}

/// Two owners hold the read lock at once, each with its count and timeout key.
#[tokio::test]
async fn rwlock_two_owners_read_at_once() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "rw:readers";
    let (a, b) = (owner(1), owner(2));

    assert_eq!(read(&mut conn, name, &a, LEASE).await, None);
    assert_eq!(read(&mut conn, name, &b, LEASE).await, None);
    assert_eq!(hget(&mut conn, name, "mode").await.as_deref(), Some("read"));
    for reader in [&a, &b] {
        assert_eq!(hget(&mut conn, name, reader).await.as_deref(), Some("1"));
        let key = rwlock::read_timeout(name, reader, 1);
        let value: Option<String> = query(&mut conn, redis::cmd("GET").arg(&key)).await;
        assert_eq!(value.as_deref(), Some("1"), "{key}");
    }
}

/// A writer is refused while any read hold exists, and granted after the last read release.
#[tokio::test]
async fn rwlock_writer_waits_for_the_last_read_release() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "rw:writer";
    let (a, b, writer) = (owner(1), owner(2), owner(3));

    assert_eq!(read(&mut conn, name, &a, LEASE).await, None);
    assert_eq!(read(&mut conn, name, &b, LEASE).await, None);
    assert!(
        write(&mut conn, name, &writer)
            .await
            .is_some_and(|ttl| ttl > 0)
    );
    assert_eq!(read_release(&mut conn, name, &a).await, Some(0));
    assert!(
        write(&mut conn, name, &writer)
            .await
            .is_some_and(|ttl| ttl > 0)
    );
    assert_eq!(read_release(&mut conn, name, &b).await, Some(1));
    assert_eq!(write(&mut conn, name, &writer).await, None);
    assert_eq!(
        hget(&mut conn, name, "mode").await.as_deref(),
        Some("write")
    );
    let field = rwlock::write_field(&writer);
    assert_eq!(hget(&mut conn, name, &field).await.as_deref(), Some("1"));
}

/// A reader's own write attempt is refused (no upgrade) and leaves the hash as it was.
#[tokio::test]
async fn rwlock_reader_cannot_upgrade() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "rw:upgrade";
    let reader = owner(1);

    assert_eq!(read(&mut conn, name, &reader, LEASE).await, None);
    assert!(
        write(&mut conn, name, &reader)
            .await
            .is_some_and(|ttl| ttl > 0)
    );
    assert_eq!(hget(&mut conn, name, "mode").await.as_deref(), Some("read"));
    let field = rwlock::write_field(&reader);
    assert_eq!(hget(&mut conn, name, &field).await, None);
    assert_eq!(read_release(&mut conn, name, &reader).await, Some(1));
    assert_eq!(write(&mut conn, name, &reader).await, None, "free again");
}

/// A writer that also reads, then releases the write, downgrades the lock to `mode=read` and publishes nothing.
#[tokio::test]
async fn rwlock_write_release_with_own_reads_downgrades_without_publish() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "rw:downgrade";
    let writer = owner(1);
    let channel = rwlock::channel(name);
    let mut messages = listen(&server.url(), &channel).await;

    assert_eq!(write(&mut conn, name, &writer).await, None);
    assert_eq!(read(&mut conn, name, &writer, LEASE).await, None);
    assert_eq!(
        hget(&mut conn, name, "mode").await.as_deref(),
        Some("write")
    );
    assert_eq!(write_release(&mut conn, name, &writer).await, Some(1));
    assert_eq!(hget(&mut conn, name, "mode").await.as_deref(), Some("read"));
    let field = rwlock::write_field(&writer);
    assert_eq!(hget(&mut conn, name, &field).await, None);
    assert_eq!(hget(&mut conn, name, &writer).await.as_deref(), Some("1"));
    expect_nothing_before_sentinel(&mut conn, &mut messages, &channel).await;
}

/// A write release publishes `1`; a read release with reads left publishes nothing; the last one publishes `0`.
#[tokio::test]
async fn rwlock_write_release_publishes_1_and_last_read_release_publishes_0() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "rw:messages";
    let (a, b, writer) = (owner(1), owner(2), owner(3));
    let channel = rwlock::channel(name);
    let mut messages = listen(&server.url(), &channel).await;

    assert_eq!(write(&mut conn, name, &writer).await, None);
    assert_eq!(write_release(&mut conn, name, &writer).await, Some(1));
    assert_eq!(
        next_message(&mut messages).await,
        (channel.clone(), "1".to_owned())
    );

    assert_eq!(read(&mut conn, name, &a, LEASE).await, None);
    assert_eq!(read(&mut conn, name, &b, LEASE).await, None);
    assert_eq!(read_release(&mut conn, name, &a).await, Some(0));
    expect_nothing_before_sentinel(&mut conn, &mut messages, &channel).await;
    assert_eq!(read_release(&mut conn, name, &b).await, Some(1));
    assert_eq!(
        next_message(&mut messages).await,
        (channel.clone(), "0".to_owned())
    );
    assert_eq!(pttl(&mut conn, name).await, -2, "the hash is gone");
}

/// Each read hold has its own timeout key with its own lease; a release deletes the highest-numbered one and the hash's TTL follows the longest left.
#[tokio::test]
async fn rwlock_each_read_hold_has_its_own_timeout_key() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "rw:timeouts";
    let reader = owner(1);
    let leases = [10, 20, 30].map(Duration::from_secs);

    for lease in leases {
        assert_eq!(read(&mut conn, name, &reader, lease).await, None);
    }
    assert_eq!(hget(&mut conn, name, &reader).await.as_deref(), Some("3"));
    for (n, lease) in (1..).zip(leases) {
        let key = rwlock::read_timeout(name, &reader, n);
        let ttl = pttl(&mut conn, &key).await;
        let lease = lease.as_millis() as i64;
        assert!(
            ttl > lease - 5_000 && ttl <= lease,
            "{key}: PTTL {ttl}, lease {lease}"
        );
    }
    assert!(
        pttl(&mut conn, name).await > 25_000,
        "the hash lives as long as the longest hold"
    );

    assert_eq!(read_release(&mut conn, name, &reader).await, Some(0));
    assert_eq!(hget(&mut conn, name, &reader).await.as_deref(), Some("2"));
    let third = rwlock::read_timeout(name, &reader, 3);
    assert_eq!(pttl(&mut conn, &third).await, -2, "hold 3's key deleted");
    for n in [1, 2] {
        let key = rwlock::read_timeout(name, &reader, n);
        assert!(pttl(&mut conn, &key).await > 0, "{key} kept");
    }
    let ttl = pttl(&mut conn, name).await;
    assert!(ttl > 15_000 && ttl <= 20_000, "hash PTTL {ttl}: hold 2's");
}

/// `renew_reads` renews the hash and the caller's own timeout keys only: a crashed reader's keys still expire.
#[tokio::test]
async fn rwlock_renew_reads_leaves_other_owners_timeout_keys_alone() {
    let server = server().await;
    let mut conn = raw(&server.url()).await;
    let name = "rw:renew";
    let (alive, crashed) = (owner(1), owner(2));
    let short = Duration::from_millis(500);

    assert_eq!(read(&mut conn, name, &alive, short).await, None);
    assert_eq!(read(&mut conn, name, &alive, short).await, None);
    assert_eq!(read(&mut conn, name, &crashed, short).await, None);
    let renewed: i64 = rwlock::renew_reads(name, &alive, LEASE)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(renewed, 1);
    for n in [1, 2] {
        let key = rwlock::read_timeout(name, &alive, n);
        assert!(pttl(&mut conn, &key).await > 25_000, "{key} renewed");
    }
    assert!(pttl(&mut conn, name).await > 25_000, "the hash renewed");

    let crashed_key = rwlock::read_timeout(name, &crashed, 1);
    let crashed_ttl = pttl(&mut conn, &crashed_key).await;
    assert!(
        crashed_ttl <= 500,
        "{crashed_key} renewed: PTTL {crashed_ttl}"
    );
    poll_until(
        PATIENCE,
        || format!("{crashed_key} never expired"),
        || {
            let mut conn = conn.clone();
            let key = crashed_key.clone();
            async move { (pttl(&mut conn, &key).await == -2).then_some(()) }
        },
    )
    .await
    .unwrap();
    let key = rwlock::read_timeout(name, &alive, 1);
    assert!(pttl(&mut conn, &key).await > 20_000, "{key} still alive");

    let stranger: i64 = rwlock::renew_reads(name, &owner(3), LEASE)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(stranger, 0, "no read hold to renew");
}
