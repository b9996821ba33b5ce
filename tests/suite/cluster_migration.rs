//! A Cluster node (`Node::cluster`) while a slot of its locks migrates
//! (held midway, so the source answers `ASK` and the target `TRYAGAIN`):
//! a lock the watchdog renews stays held while its key moves (`ASK`
//! followed), and a free lock of a migrating slot is granted once the
//! migration ends.

use std::time::Duration;

use multilock::testkit::key_slot;

use crate::cluster::{cluster, cluster_node};
use crate::cluster_failover::owned;
use crate::common::*;

/// `cmd` right after `ASKING`, on one connection to `url`: what the target
/// of a slot migration holds of the slot.
async fn asking<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> T {
    let mut conn = raw(url).await;
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").ignore().add_command(cmd.clone());
    let (value,): (T,) = pipe
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|err| panic!("{cmd:?} after ASKING on {url}: {err}"));
    value
}

/// How long the migration test's watchdog leases are: renewals every
/// third of it.
const RENEWED: Duration = Duration::from_secs(2);

/// A lock the watchdog renews stays held while its slot migrates (its key
/// moved to the target, renewals following `ASK`) and after the slot
/// changed hands (`MOVED`), then releases on the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_while_a_lock_is_held_and_renewed() {
    let cluster = cluster().await;
    let node = cluster_node(&cluster);
    let client = client_with_watchdog(RENEWED);
    let held = "{migrating}.held";
    let slot = key_slot(held);
    let from = cluster.primary_for_slot(slot).await.unwrap();
    let to = (from + 1) % 3;
    let (source, target) = (cluster.nodes()[from].url(), cluster.nodes()[to].url());
    // An explicit owner: its hold count is read back below.
    let lock = owned(&client, &node, held, "holder");
    let guard = lock.lock().await.unwrap();
    assert!(exists(&source, held).await);

    let migration = cluster.begin_slot_migration(slot, to).await.unwrap();
    let moved = migration.move_keys(&cluster).await.unwrap();
    assert!(moved >= 1, "the held key moved");
    let on_source = run::<u64>(&source, redis::cmd("EXISTS").arg(held)).await;
    let redirected = on_source.expect_err("the source sends the held key on");
    assert_eq!(redirected.code(), Some("ASK"), "{redirected}");
    // Through more than three leases: renewals reach the key on the
    // target, or it would expire and `lost()` fire.
    let kept = tokio::time::timeout(3 * RENEWED + RENEWED / 2, guard.lost()).await;
    assert!(kept.is_err(), "the hold was lost while its slot migrated");
    let left: i64 = asking(&target, redis::cmd("PTTL").arg(held)).await;
    assert!(left > 0, "renewed on the target: PTTL {left}");
    assert_eq!(lock.hold_count().await.unwrap(), 1);

    migration.finish(&cluster).await.unwrap();
    assert_eq!(cluster.primary_for_slot(slot).await.unwrap(), to);
    let kept = tokio::time::timeout(3 * RENEWED + RENEWED / 2, guard.lost()).await;
    assert!(kept.is_err(), "the hold was lost after its slot moved");
    assert!(pttl(&target, held).await > 0, "renewed on the target");
    guard.unlock().await.unwrap();
    assert!(!exists(&target, held).await, "released on the target");
}

/// A free lock of a slot under migration: its acquire declares the lock
/// and the request's hold latch, both absent, so the source answers `ASK`
/// and the target `TRYAGAIN` (a multi-key request missing a key) for as
/// long as the migration lasts. Nothing runs, and a waiting acquire asks
/// again until the migration ends, then is granted on the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_lock_of_a_migrating_slot_is_granted_once_the_migration_ends() {
    let cluster = cluster().await;
    let node = cluster_node(&cluster);
    let client = long_lease_client();
    let free = "{migrating}.free";
    let slot = key_slot(free);
    let from = cluster.primary_for_slot(slot).await.unwrap();
    let to = (from + 2) % 3;
    let target = cluster.nodes()[to].url();
    let lock = client.lock(&node, free).unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap(); // the map is loaded

    let migration = cluster.begin_slot_migration(slot, to).await.unwrap();
    let waiting = lock.clone();
    let acquire = tokio::spawn(async move { waiting.try_lock_for(LONG_LEASE, None).await });
    // The acquire reached the target, which refused it untried.
    eventually(
        PATIENCE,
        |n: &u64| format!("{n} scripts refused by the target"),
        || async {
            match rejected_scripts(&target).await {
                0 => Err(0),
                _ => Ok(()),
            }
        },
    )
    .await;
    // The migration outlasts one request's response timeout: the waiting
    // acquire must ask again, not give up with its request.
    let refused_since = std::time::Instant::now();
    let outlasted = crate::cluster::NODE_TIMEOUT * 2;
    let first = rejected_scripts(&target).await;
    eventually(
        outlasted + PATIENCE,
        |n: &u64| format!("{n} scripts refused by the target"),
        || async {
            let now = rejected_scripts(&target).await;
            match now > first && refused_since.elapsed() > outlasted {
                true => Ok(()),
                false => Err(now),
            }
        },
    )
    .await;
    assert!(
        !acquire.is_finished(),
        "the acquire waits out the migration"
    );
    migration.finish(&cluster).await.unwrap();
    let granted = tokio::time::timeout(PATIENCE, acquire)
        .await
        .expect("granted soon after the migration ended")
        .unwrap()
        .expect("no error")
        .expect("the free lock is granted");
    assert!(exists(&target, free).await, "granted on the target");
    granted.unlock().await.unwrap();
    assert!(!exists(&target, free).await, "released on the target");
}

/// Script calls (`EVALSHA`) the server at `url` rejected before running
/// them (`TRYAGAIN` counts there).
async fn rejected_scripts(url: &str) -> u64 {
    let info: String = run(url, redis::cmd("INFO").arg("commandstats"))
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:"))
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("rejected_calls="))
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}
