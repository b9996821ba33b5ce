//! The watchdog's record of holds and its renewals, without a server
//! (a node that is never connected).

use super::*;

fn grant(sent_at: Instant, ttl_ms: u64, count: u64) -> GrantRecord {
    GrantRecord {
        sent_at,
        replied_at: sent_at + Duration::from_millis(1),
        ttl: Duration::from_millis(ttl_ms),
        count,
        reads: false,
    }
}

#[tokio::test(start_paused = true)]
async fn a_reentry_extends_every_guard_of_its_lock() {
    let watchdogs = Watchdogs::new(Duration::from_secs(30));
    let node = Node::new("redis://127.0.0.1:1").unwrap();
    let field: Arc<str> = "c:o".into();
    let t0 = Instant::now();
    let outer = watchdogs
        .register(
            &node,
            &"k".into(),
            &field,
            grant(t0, 1_000, 1),
            Renewal::None,
        )
        .unwrap();
    let inner = watchdogs
        .register(
            &node,
            &"k".into(),
            &field,
            grant(t0, 20_000, 2),
            Renewal::None,
        )
        .unwrap();
    let extended = timing::trusted_until(t0, Duration::from_secs(20));
    assert_eq!(outer.record().trusted_until(), Some(extended));
    drop(inner);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(
        !outer.record().is_over(),
        "the key lives for the longer lease"
    );
    assert_eq!(outer.record().trusted_until(), Some(extended));
}

/// A rollback that may undo a fresh hold by its count is told the holds
/// on record; a grant of the same field that was in flight when it was
/// sent is then not trusted (it could be the hold the rollback undid),
/// while one sent after it is.
#[tokio::test(start_paused = true)]
async fn a_grant_in_flight_during_a_guessing_rollback_is_not_trusted() {
    let watchdogs = Watchdogs::new(Duration::from_secs(30));
    let node = Node::new("redis://127.0.0.1:1").unwrap();
    let (key, field): (Arc<str>, Arc<str>) = ("k".into(), "c:o".into());
    let outer = watchdogs
        .register(
            &node,
            &key,
            &field,
            grant(Instant::now(), 10_000, 1),
            Renewal::None,
        )
        .unwrap();
    let in_flight = Instant::now();
    tokio::time::advance(Duration::from_millis(5)).await;
    let known = watchdogs.begin_guessing_rollback(&node, &key, &field);
    assert_eq!(known, 1, "the outer hold is on record");
    let other: Arc<str> = "c:other".into();
    assert!(
        watchdogs
            .register(
                &node,
                &key,
                &other,
                grant(in_flight, 10_000, 1),
                Renewal::None
            )
            .is_some(),
        "another owner's grant is not concerned"
    );
    assert!(
        watchdogs
            .register(
                &node,
                &key,
                &field,
                grant(in_flight, 10_000, 2),
                Renewal::None
            )
            .is_none(),
        "a grant sent before the rollback may be the hold it undid"
    );
    tokio::time::advance(Duration::from_millis(5)).await;
    let later = watchdogs.register(
        &node,
        &key,
        &field,
        grant(Instant::now(), 10_000, 2),
        Renewal::None,
    );
    assert!(later.is_some(), "a grant sent after it is trusted");
    drop(outer);
    assert_eq!(
        watchdogs.begin_guessing_rollback(&node, &key, &field),
        1,
        "the re-entry registered last is still held"
    );
    drop(later);
    assert_eq!(
        watchdogs.nodes(),
        1,
        "the records keep the node's watchdog while they matter"
    );
    tokio::time::advance(timing::ROLLBACK_WINDOW).await;
    let last = watchdogs.register(
        &node,
        &key,
        &field,
        grant(Instant::now(), 10_000, 1),
        Renewal::None,
    );
    drop(last);
    assert_eq!(
        watchdogs.nodes(),
        0,
        "past the rollback window they go with the last hold"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fresh_grant_proves_an_older_hold_over() {
    let watchdogs = Watchdogs::new(Duration::from_secs(30));
    let node = Node::new("redis://127.0.0.1:1").unwrap();
    let field: Arc<str> = "c:o".into();
    let old = watchdogs
        .register(
            &node,
            &"k".into(),
            &field,
            grant(Instant::now(), 200, 1),
            Renewal::None,
        )
        .unwrap();
    tokio::time::advance(Duration::from_millis(150)).await;
    // Granted as count 1: the old hold's key expired (or was deleted).
    let new = watchdogs
        .register(
            &node,
            &"k".into(),
            &field,
            grant(Instant::now(), 10_000, 1),
            Renewal::None,
        )
        .unwrap();
    assert!(old.record().is_over());
    assert_eq!(old.record().trusted_until(), None);
    assert!(!new.record().is_over());
    drop(old);
    assert!(
        !new.record().is_over(),
        "the old guard leaving does not touch the new entry"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fresh_grant_that_raced_a_reentry_joins_it() {
    let watchdogs = Watchdogs::new(Duration::from_secs(30));
    let node = Node::new("redis://127.0.0.1:1").unwrap();
    let field: Arc<str> = "c:o".into();
    let sent_together = Instant::now();
    // Two acquires in flight at once: the re-entry's reply (count 2)
    // arrives first, then the fresh grant's (count 1).
    tokio::time::advance(Duration::from_millis(5)).await;
    let second = watchdogs
        .register(
            &node,
            &"k".into(),
            &field,
            grant(Instant::now(), 1_000, 2),
            Renewal::None,
        )
        .unwrap();
    let first = watchdogs
        .register(
            &node,
            &"k".into(),
            &field,
            grant(sent_together, 1_000, 1),
            Renewal::None,
        )
        .unwrap();
    assert!(!second.record().is_over() && !first.record().is_over());
}

/// A hold renewed by the watchdog leaves while its timer runs: the
/// watchdog stays until the timer's next tick finds nothing to renew,
/// and goes with the timer.
#[tokio::test(start_paused = true)]
async fn a_watchdog_whose_timer_ended_idle_is_dropped() {
    let timeout = Duration::from_secs(30);
    let watchdogs = Watchdogs::new(timeout);
    let node = Node::new("redis://127.0.0.1:1").unwrap();
    let field: Arc<str> = "c:o".into();
    let hold = watchdogs
        .register(
            &node,
            &"k".into(),
            &field,
            grant(Instant::now(), 30_000, 1),
            Renewal::Until(None),
        )
        .unwrap();
    drop(hold);
    assert_eq!(watchdogs.nodes(), 1, "kept while its timer runs");
    // Paused clock: the timer ticks (idle: it ends, sending nothing)
    // before this sleep ends.
    tokio::time::sleep(timeout / 3 * 2).await;
    assert_eq!(
        watchdogs.nodes(),
        0,
        "the client keeps no node once its timer ended with nothing to renew"
    );
}

/// A timer whose runtime ended before it ran once (its task dropped
/// unpolled) is started again by the next registration, as one that ran
/// and ended is: the hold is renewed, and the idle timer lets the watchdog
/// go.
#[test]
fn a_timer_dropped_before_it_ran_is_started_again() {
    let timeout = Duration::from_secs(30);
    let watchdogs = Watchdogs::new(timeout);
    let node = Node::new("redis://127.0.0.1:1").unwrap();
    let field: Arc<str> = "c:o".into();
    let register = || {
        let hold = grant(Instant::now(), 30_000, 1);
        let renewal = Renewal::Until(None);
        watchdogs.register(&node, &"k".into(), &field, hold, renewal)
    };
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The timer is spawned, never polled: nothing awaits in this block.
    let hold = first.block_on(async { register().unwrap() });
    drop(first);
    drop(hold);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    second.block_on(async {
        drop(register().unwrap());
        tokio::time::sleep(timeout / 3 * 2).await;
        assert_eq!(
            watchdogs.nodes(),
            0,
            "a new timer ran, found nothing to renew and let the watchdog go"
        );
    });
}

/// A lock keeps its node's watchdog between holds (`KeptWatchdog`); a
/// hold registered through it is on the client's record again: a guessing
/// rollback counts it, and another lock's hold on that node shares it.
#[tokio::test(start_paused = true)]
async fn a_kept_watchdog_rejoins_the_client() {
    let watchdogs = Watchdogs::new(Duration::from_secs(30));
    let node = Node::new("redis://127.0.0.1:1").unwrap();
    let (key, field): (Arc<str>, Arc<str>) = ("k".into(), "c:o".into());
    let kept = KeptWatchdog::default();
    let register = |key: &Arc<str>, kept: &KeptWatchdog| {
        let hold = grant(Instant::now(), 10_000, 1);
        watchdogs
            .register_kept(&node, key, &field, hold, Renewal::None, kept)
            .unwrap()
    };
    drop(register(&key, &kept));
    assert_eq!(watchdogs.nodes(), 0, "the client lets it go between holds");
    let hold = register(&key, &kept);
    assert_eq!(watchdogs.nodes(), 1, "back on the client's record");
    assert_eq!(
        watchdogs.begin_guessing_rollback(&node, &key, &field),
        1,
        "a rollback counts the hold registered through the kept watchdog"
    );
    let other = register(&"other".into(), &KeptWatchdog::default());
    assert!(
        Arc::ptr_eq(&hold.record().dog, &other.record().dog),
        "one watchdog per node: the other lock's hold joins it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_watchdog_with_nothing_left_is_dropped() {
    let watchdogs = Watchdogs::new(Duration::from_secs(30));
    let node = Node::new("redis://127.0.0.1:1").unwrap();
    let field: Arc<str> = "c:o".into();
    let hold = watchdogs
        .register(
            &node,
            &"k".into(),
            &field,
            grant(Instant::now(), 1_000, 1),
            Renewal::None,
        )
        .unwrap();
    assert_eq!(watchdogs.nodes(), 1);
    drop(hold);
    assert_eq!(
        watchdogs.nodes(),
        0,
        "the client keeps no node it holds nothing on"
    );
}

/// The entry of `registration`, as a renewal's reply finds it.
fn with_entry(registration: &Registration, change: impl FnOnce(&Entry)) {
    let record = registration.record();
    let entries = record.dog.entries.lock().unwrap();
    change(
        entries
            .by_lock
            .get(&record.key)
            .expect("the entry is there"),
    );
}

/// A hold whose proof broke stays broken, whether anyone looked or not: a
/// renewal answered after the trusted TTL ran out, or after a renewal that
/// failed, proves the key for holds joining from then on, never for the
/// holds already in the entry (their guards were lost meanwhile).
#[tokio::test(start_paused = true)]
async fn a_broken_proof_stays_broken_for_the_holds_it_broke() {
    let watchdogs = Watchdogs::new(Duration::from_secs(3));
    let node = Node::new("redis://127.0.0.1:1").unwrap();
    let (key, field): (Arc<str>, Arc<str>) = ("k".into(), "c:o".into());
    let register = |count| {
        watchdogs
            .register(
                &node,
                &key,
                &field,
                grant(Instant::now(), 3_000, count),
                Renewal::None,
            )
            .unwrap()
    };
    let first = register(1);
    assert!(first.record().proven_until().is_some());

    // A renewal sent at 1 s, answered at 3.5 s: after the trust (3 s less
    // drift) ran out. Nobody looked at the hold in between.
    let sent = Instant::now() + Duration::from_secs(1);
    tokio::time::advance(Duration::from_millis(3_500)).await;
    with_entry(&first, |entry| {
        entry.record_ttl(sent, Instant::now(), Duration::from_secs(3), true)
    });
    assert_eq!(
        first.record().proven_until(),
        None,
        "revived by a late reply"
    );
    assert!(
        !first.record().is_over(),
        "its key is renewed: it still releases"
    );

    // A re-entry joining now is proven by its own grant.
    let second = register(2);
    assert!(
        second
            .record()
            .proven_until()
            .is_some_and(|t| t > Instant::now())
    );

    // A renewal that failed breaks every hold in the entry; the next one
    // that succeeds proves the key again for holds joining after it only.
    with_entry(&second, Entry::mark_unproven);
    assert_eq!(second.record().proven_until(), None);
    with_entry(&second, |entry| {
        entry.record_ttl(Instant::now(), Instant::now(), Duration::from_secs(3), true)
    });
    assert_eq!(second.record().proven_until(), None, "revived by a renewal");
    let third = register(3);
    assert!(third.record().proven_until().is_some());
    assert_eq!(first.record().proven_until(), None);
}
