//! (e) a holder cut off from the majority learns it lost the lock first;
//! (f) a holder that stalled past its lease is fenced off.

use super::*;
use multilock_testkit::poll_until;

/// Five two-sided masters; the holder reaches them through side A, the
/// other client through side B.
struct CutOff {
    servers: Vec<RedisContainer>,
}

impl CutOff {
    async fn start() -> CutOff {
        init_tracing();
        let servers = RedisContainer::start_many_two_sided(5)
            .await
            .unwrap_or_else(|err| panic!("cannot start 5 Redis containers: {err}"));
        CutOff { servers }
    }

    fn nodes(&self, side: Side) -> Vec<Node> {
        self.servers
            .iter()
            .map(|s| node_at(&s.url_from(side), NODE_TIMEOUT))
            .collect()
    }

    /// Cuts the holder's side of the first three servers; returns the
    /// latest instant their copies of `key` expire (read from the other
    /// side). A renewal the holder sent before the cut was delivered or
    /// dropped by the time the cut is made; one that still landed after
    /// the read would only make the key live longer than the value
    /// returned, which the callers take as a lower bound.
    async fn cut_holder_from_majority(&mut self, key: &str) -> Instant {
        // At once: one after another, three network disconnects on a loaded
        // machine took longer than the 1.5 s watchdog's keys live.
        futures::future::try_join_all(
            self.servers[..3]
                .iter_mut()
                .map(|server| server.partition_side(Side::A)),
        )
        .await
        .unwrap();
        let mut latest = Instant::now();
        for server in &self.servers[..3] {
            let read_at = Instant::now();
            let pttl: i64 = run(&server.url_from(Side::B), redis::cmd("PTTL").arg(key))
                .await
                .unwrap();
            assert!(pttl > 0, "the holder's key must be there, with a TTL");
            latest = latest.max(read_at + Duration::from_millis(pttl as u64));
        }
        latest
    }

    /// Tries from side B until acquired; the instant it was.
    async fn acquire_from_other_side(&self, limit: Duration) -> Instant {
        let other = client();
        let red = other.red_lock_on(&self.nodes(Side::B), "ledger").unwrap();
        let started = Instant::now();
        loop {
            match red
                .try_lock_for(Duration::from_millis(500), Some(LONG_LEASE))
                .await
            {
                Ok(Some(guard)) => {
                    let at = Instant::now();
                    guard.unlock().await.unwrap();
                    return at;
                }
                Ok(None) | Err(Error::NoQuorum(_)) => {}
                Err(err) => panic!("{err}"),
            }
            assert!(started.elapsed() < limit, "the other side never acquired");
        }
    }

    async fn rm(self) {
        for server in self.servers {
            server.rm().await.unwrap();
        }
    }
}

/// A guard of `red` that holds on all of its five nodes, for a cut that
/// must take a majority of its holds. A round wins with three: on a loaded
/// machine a node may answer after the round's grace and its request be
/// overdue, so the guard holds fewer (a node slower than the others is
/// adopted late). Such a guard is released and the lock taken again.
async fn lock_on_every_node(red: &multilock::RedLock) -> multilock::Guard {
    let mut held = Vec::new();
    for _ in 0..5 {
        let guard = red.lock().await.unwrap();
        let everywhere = poll_until(Duration::from_secs(2), String::new, || async {
            (guard.nodes().len() == 5).then_some(())
        })
        .await;
        if everywhere.is_ok() {
            return guard;
        }
        held = guard.nodes();
        // A release left to the background (a suspect node) still frees
        // the lock for the next `lock()`, which waits for it.
        if let Err(err) = guard.unlock().await {
            assert!(!err.is_permanent(), "{err}");
        }
    }
    panic!("five locks in a row held on only some nodes; the last on {held:?}");
}

/// Spawns a watcher that owns `guard` and records when `lost()` fired.
fn watch_lost(guard: multilock::Guard) -> tokio::task::JoinHandle<(Instant, multilock::Guard)> {
    tokio::spawn(async move {
        guard.lost().await;
        (Instant::now(), guard)
    })
}

/// (e) with a fixed lease: cut off three of five masters, the holder's
/// `lost()` fires when its lease is over, and the other side acquires
/// only after the holder's keys expired there.
#[tokio::test]
async fn red_lock_holder_cut_from_the_majority_with_a_lease_is_told_first() {
    const LEASE: Duration = Duration::from_secs(3);
    let mut cut = CutOff::start().await;
    let holder = client();
    let guard = holder
        .red_lock_on(&cut.nodes(Side::A), "ledger")
        .unwrap()
        .try_lock_for(Duration::from_secs(2), Some(LEASE))
        .await
        .unwrap()
        .expect("free");
    let valid_until = guard.valid_until().unwrap();
    let lost = watch_lost(guard);

    let expiry = cut.cut_holder_from_majority("ledger").await;
    let acquired_at = cut.acquire_from_other_side(LEASE * 4).await;
    let (lost_at, guard) = tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("lost() never fired")
        .unwrap();

    assert!(
        acquired_at >= valid_until,
        "acquired before the validity ended"
    );
    assert!(
        acquired_at + Duration::from_millis(50) >= expiry,
        "acquired before the holder's keys expired"
    );
    assert!(
        lost_at <= acquired_at,
        "the holder was told {:?} after the other client acquired",
        lost_at - acquired_at
    );
    drop(guard);
    cut.rm().await;
}

/// (e) under the watchdog: cut off three of five masters, renewal there
/// fails; the holder's `lost()` must fire before another client can hold
/// the lock, that is, no later than its keys expire on the cut-off
/// masters.
#[tokio::test]
async fn red_lock_holder_cut_from_the_majority_under_the_watchdog_is_told_first() {
    const WATCHDOG: Duration = Duration::from_millis(1500);
    let mut cut = CutOff::start().await;
    let holder = client_with_watchdog(WATCHDOG);
    let red = holder.red_lock_on(&cut.nodes(Side::A), "ledger").unwrap();
    // Connections made first: the per-node timeout is a tenth of the 1.5 s
    // watchdog, less than a first connection to a container may take.
    red.lock().await.unwrap().unlock().await.unwrap();
    let guard = lock_on_every_node(&red).await;
    let lost = watch_lost(guard);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let partitioned_at = Instant::now();
    let expiry = cut.cut_holder_from_majority("ledger").await;
    let acquired_at = cut.acquire_from_other_side(WATCHDOG * 6).await;
    assert!(
        acquired_at + Duration::from_millis(50) >= expiry,
        "acquired before the holder's keys expired"
    );
    assert!(
        acquired_at - partitioned_at < WATCHDOG + Duration::from_secs(3),
        "the majority side should get the lock once the keys expired"
    );
    // Give a late lost() a moment, to say how late it was.
    let told = tokio::time::timeout(Duration::from_secs(3), lost).await;
    let (lost_at, guard) = match told {
        Ok(joined) => joined.unwrap(),
        Err(_) => panic!(
            "two holders: the other client acquired {:?} after the partition, and the \
             cut-off holder's lost() had still not fired 3 s later",
            acquired_at - partitioned_at
        ),
    };
    assert!(
        lost_at <= acquired_at,
        "two holders for {:?}: the cut-off holder was told after the other client acquired",
        lost_at - acquired_at
    );
    drop(guard);
    cut.rm().await;
}

/// (f) A holder stalls (GC, swap) past its lease; meanwhile another client
/// takes the lock and writes. The stale holder's late write carries an
/// older fencing token and the store rejects it.
#[tokio::test]
async fn fencing_rejects_the_late_write_of_a_holder_that_stalled_past_its_lease() {
    const LEASE: Duration = Duration::from_secs(1);
    let servers = containers(4).await;
    let (lock_servers, store) = servers.split_at(3);
    let store = FencedStore::new(store[0].url(), "doc");

    let first = client();
    let stale = first
        .red_lock_on(&nodes_of(lock_servers), "doc")
        .unwrap()
        .with_fencing()
        .try_lock_for(Duration::from_secs(2), Some(LEASE))
        .await
        .unwrap()
        .expect("free");
    let stale_token = stale.fencing_token().expect("fenced");

    // The stall: the holder does nothing for longer than its lease.
    tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
    // Its lease ran out unrenewed: the guard proves no hold any more, and
    // says so for good (no validity at all, not one in the past).
    assert_eq!(
        stale.valid_until(),
        None,
        "the stalled holder's lease is over"
    );

    let second = client();
    let current = second
        .red_lock_on(&nodes_of(lock_servers), "doc")
        .unwrap()
        .with_fencing()
        .try_lock_for(Duration::from_secs(2), Some(LONG_LEASE))
        .await
        .unwrap()
        .expect("the stalled holder's lease is over");
    let current_token = current.fencing_token().unwrap();
    assert!(current_token > stale_token);
    assert!(
        store
            .write(current_token, "written by the current holder")
            .await
            .unwrap()
    );

    // The stalled holder wakes up, believes it still holds, and writes.
    assert!(
        !store
            .write(stale_token, "written by the stale holder")
            .await
            .unwrap(),
        "the store must reject the older token"
    );
    assert_eq!(
        store.read().await.unwrap().as_deref(),
        Some("written by the current holder")
    );

    current.unlock().await.unwrap();
    drop(stale);
    for server in servers {
        server.rm().await.unwrap();
    }
}
