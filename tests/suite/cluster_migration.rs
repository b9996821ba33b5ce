//! A Cluster node (`Node::cluster`) while a slot of its locks migrates
//! (held midway, so the source answers `ASK` and the target `TRYAGAIN`):
//! a lock the watchdog renews stays held while its key moves (`ASK`
//! followed), a free lock of a migrating slot is granted once the
//! migration ends, and a hold of any kind let go of meanwhile (unlocked,
//! or its guard dropped) is released once it ends.

use std::time::Duration;

use futures::future::join_all;
use multilock::{Client, Lock, Node};
use multilock_testkit::key_slot;

use crate::cluster::{NODE_TIMEOUT, cluster, cluster_node};
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

/// How long the rivals of the release tests wait for the lock: long
/// enough for a release retried once the migration ended, far shorter
/// than the holds' lease ([`LONG_LEASE`]), which would free it too.
const RIVAL_WAIT: Duration = Duration::from_secs(10);

/// How a holder lets go of its holds in the release tests.
#[derive(Debug, Clone, Copy)]
enum LetGo {
    Unlock,
    Drop,
}

/// An unlock of a hold of each kind while its slot migrates for longer
/// than the node's response timeout is applied once the migration ended:
/// a rival is granted long before the holds' lease would free the locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_during_a_slot_migration_is_applied() {
    a_release_during_a_slot_migration("{unlocked}", LetGo::Unlock).await;
}

/// The same for guards dropped while the slot migrates: their releases,
/// which go on in the background, are applied once the migration ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_during_a_slot_migration_is_released() {
    a_release_during_a_slot_migration("{dropped}", LetGo::Drop).await;
}

/// Holds of every kind in the slot of `tag`, taken with a long lease, are
/// let go of once their keys moved to the target of a migration of that
/// slot, which lasts longer than the node's response timeout. Each release
/// declares keys that do not exist (the lock's channel, its latch), so the
/// source answers `ASK` and the target `TRYAGAIN` until the migration
/// ends: not applied, whoever waits for it. Once the slot has moved, a
/// rival of each lock is granted within [`RIVAL_WAIT`].
async fn a_release_during_a_slot_migration(tag: &str, let_go: LetGo) {
    let cluster = cluster().await;
    let (node, rival_node) = (cluster_node(&cluster), cluster_node(&cluster));
    let (client, rival_client) = (long_lease_client(), long_lease_client());
    let slot = key_slot(tag);
    let to = (cluster.primary_for_slot(slot).await.unwrap() + 1) % 3;
    let target = cluster.nodes()[to].url();
    let mut guards = Vec::new();
    for (_, lock) in every_kind(&client, &node, tag, false) {
        guards.push(lock.lock_with_lease(LONG_LEASE).await.unwrap());
    }

    let migration = cluster.begin_slot_migration(slot, to).await.unwrap();
    let moved = migration.move_keys(&cluster).await.unwrap();
    assert!(moved >= guards.len(), "the holds moved: {moved} keys");
    let refused_before = rejected_scripts(&target).await;
    let let_go_at = std::time::Instant::now();
    let unlocks = match let_go {
        LetGo::Unlock => Some(tokio::spawn(join_all(
            guards.into_iter().map(|g| g.unlock()),
        ))),
        LetGo::Drop => {
            drop(guards);
            None
        }
    };
    // The releases reached the target, which refused them untried, and
    // the migration outlasts their response timeout.
    let outlasted = 2 * NODE_TIMEOUT;
    eventually(
        outlasted + PATIENCE,
        |n: &u64| format!("{let_go:?}: {n} scripts refused by the target"),
        || async {
            let refused = rejected_scripts(&target).await - refused_before;
            match refused > 0 && let_go_at.elapsed() > outlasted {
                true => Ok(()),
                false => Err(refused),
            }
        },
    )
    .await;
    if let Some(unlocks) = unlocks {
        let unlocked = tokio::time::timeout(PATIENCE, unlocks).await;
        let unlocked = unlocked.expect("the unlocks returned").unwrap();
        tracing::info!(?unlocked, "unlocked while the slot migrated");
    }
    migration.finish(&cluster).await.unwrap();

    let rivals = every_kind(&rival_client, &rival_node, tag, true);
    let granted = join_all(rivals.iter().map(|(kind, lock)| async move {
        (*kind, lock.try_lock_for(RIVAL_WAIT, Some(LONG_LEASE)).await)
    }))
    .await;
    let mut lost = Vec::new();
    for (kind, outcome) in granted {
        match outcome {
            Ok(Some(guard)) => guard.unlock().await.unwrap(),
            other => lost.push(format!("{kind}: {other:?}")),
        }
    }
    assert!(
        lost.is_empty(),
        "{let_go:?}: rivals not granted within {RIVAL_WAIT:?}, the releases during the \
         migration lost, the holds left to their lease: {lost:?}"
    );
}

/// A lock of each kind in the slot of `tag`, as a holder takes it, or
/// (`rival`) as one that the holder's hold keeps out: a reader's rival is
/// a writer.
fn every_kind(client: &Client, node: &Node, tag: &str, rival: bool) -> Vec<(&'static str, Lock)> {
    let rw = |kind: &str| {
        client
            .read_write_lock(node, format!("{tag}.{kind}"))
            .unwrap()
    };
    let reader = rw("read");
    let reader = if rival { reader.write() } else { reader.read() };
    vec![
        (
            "reentrant",
            client.lock(node, format!("{tag}.reentrant")).unwrap(),
        ),
        (
            "fair",
            client.fair_lock(node, format!("{tag}.fair")).unwrap(),
        ),
        ("read", reader.clone()),
        ("write", rw("write").write().clone()),
    ]
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
