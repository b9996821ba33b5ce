//! `inspect` and `find_locks` where the keyspace is not what this crate
//! wrote: counts that are no u32, keys of another type, binary keys and
//! fields, a lock with thousands of readers, a Cluster slot migrating or a
//! shard frozen. Each was an audit's reproduction, failing before its fix.

use multilock::inspect::Verdict;
use multilock::{Lock, Owner};
use multilock_testkit::TestServer;

use crate::common::*;

const UUID: &str = "6f1c0e9a-1111-2222-3333-444455556666";

fn owned(lock: &Lock, owner: &str) -> Lock {
    lock.with_owner(Owner::new(owner).unwrap())
}

async fn cmd(url: &str, cmd: &redis::Cmd) {
    let _: redis::Value = run(url, cmd).await.unwrap();
}

/// A count past u32, or no number at all, still keeps everyone out
/// (Redisson's rule: the key exists, the field is not yours): inspect says
/// held, as `is_locked` and `try_lock` do.
#[tokio::test]
async fn a_field_whatever_its_count_holds_the_lock() {
    let server = server().await;
    let node = node(&server);
    let client = long_lease_client();
    for (name, count, holds) in [
        ("edges:big", "5000000000", 5_000_000_000),
        ("edges:word", "many", 0),
    ] {
        let field = format!("{UUID}:1");
        cmd(
            &server.url(),
            redis::cmd("HSET").arg(name).arg(&field).arg(count),
        )
        .await;
        cmd(&server.url(), redis::cmd("PEXPIRE").arg(name).arg(60_000)).await;
        let lock = client.lock(&node, name).unwrap();
        assert!(
            lock.try_lock().await.unwrap().is_none(),
            "{name}: held by another"
        );
        let inspection = lock.inspect().await.unwrap();
        let state = inspection.nodes[0].state.as_ref().unwrap();
        assert!(state.is_held(), "{name}: {state:?}");
        assert_eq!(state.holders[0].holds, holds, "{name}");
        assert!(
            matches!(inspection.verdict, Verdict::Held(_)),
            "{name}: {:?}",
            inspection.verdict
        );
    }
}

/// The name holds a string (another library's `SET NX` lock): the node's
/// error says WRONGTYPE, and the verdict cannot tell.
#[tokio::test]
async fn a_name_of_another_type_is_that_nodes_error() {
    let server = server().await;
    let node = node(&server);
    cmd(
        &server.url(),
        redis::cmd("SET").arg("edges:string").arg("x"),
    )
    .await;
    let inspection = long_lease_client()
        .lock(&node, "edges:string")
        .unwrap()
        .inspect()
        .await
        .unwrap();
    let err = inspection.nodes[0].state.as_ref().expect_err("WRONGTYPE");
    assert!(matches!(err, multilock::Error::Redis { .. }), "{err:?}");
    assert!(format!("{err:?}").contains("WRONGTYPE"), "{err:?}");
    assert_eq!(
        inspection.verdict,
        Verdict::Unknown {
            unanswered: vec![addr(&server)]
        }
    );
}

/// A stray key under the queue's name hides nothing: the holder shows, and
/// the key is named as unreadable.
#[tokio::test]
async fn a_stray_key_of_the_family_hides_nothing_else() {
    let server = server().await;
    let node = node(&server);
    let client = long_lease_client();
    let lock = owned(&client.lock(&node, "edges:q").unwrap(), "h");
    let _held = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    cmd(
        &server.url(),
        redis::cmd("SET")
            .arg("redisson_lock_queue:{edges:q}")
            .arg("x"),
    )
    .await;
    cmd(
        &server.url(),
        redis::cmd("RPUSH")
            .arg("redisson_lock_token:{edges:q}")
            .arg("x"),
    )
    .await;
    let inspection = lock.inspect().await.unwrap();
    let state = inspection.nodes[0].state.as_ref().unwrap();
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert_eq!(state.unreadable.len(), 2, "{state:?}");
    assert!(
        state.unreadable[0].starts_with("redisson_lock_queue:{edges:q}: WRONGTYPE"),
        "{state:?}"
    );
    assert!(
        state.unreadable[1].starts_with("redisson_lock_token:{edges:q}: WRONGTYPE"),
        "{state:?}"
    );
}

/// 3,000 readers of 1,000 holds each: one inspect reads 1,000 timeout keys
/// in all and says the list was cut short, instead of 3 million that held
/// the server for seconds (past the node's 500 ms timeout here).
#[tokio::test]
async fn a_lock_with_thousands_of_readers_is_read_in_a_bounded_time() {
    let server = server().await;
    let node = node(&server);
    let name = "edges:readers";
    let mut pipe = redis::pipe();
    pipe.hset(name, "mode", "read").ignore();
    for i in 0..3000 {
        pipe.hset(name, format!("{UUID}:{i}"), 1000).ignore();
    }
    let () = pipe
        .query_async(&mut raw(&server.url()).await)
        .await
        .unwrap();
    let inspection = long_lease_client()
        .lock(&node, name)
        .unwrap()
        .inspect()
        .await
        .unwrap();
    let state = inspection.nodes[0]
        .state
        .as_ref()
        .expect("an answer within the timeout");
    assert_eq!(state.holders.len(), 3000);
    assert!(state.truncated);
    let timed: usize = state.holders.iter().map(|h| h.read_holds.len()).sum();
    assert_eq!(timed, 1000);
}

/// Binary keys and fields: a foreign client's bytes are no reason to fail.
#[tokio::test]
async fn binary_keys_and_fields_are_read() {
    let server = server().await;
    let node = node(&server);
    let client = long_lease_client();
    let _held = client
        .lock(&node, "edges:lock")
        .unwrap()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    cmd(
        &server.url(),
        redis::cmd("HSET")
            .arg(&b"edges:\xff\xfe"[..])
            .arg("f")
            .arg("v"),
    )
    .await;
    let found = node.find_locks("edges:*").await.unwrap().locks;
    let names: Vec<&str> = found.iter().map(|lock| lock.name.as_str()).collect();
    assert_eq!(names, ["edges:lock"]);

    let mut field = format!("{UUID}:").into_bytes();
    field.extend_from_slice(b"\xff\xfe");
    cmd(
        &server.url(),
        redis::cmd("HSET").arg("edges:binary").arg(field).arg(1),
    )
    .await;
    let inspection = client
        .lock(&node, "edges:binary")
        .unwrap()
        .inspect()
        .await
        .unwrap();
    let state = inspection.nodes[0].state.as_ref().unwrap();
    assert_eq!(state.holders[0].client_id, UUID);
    assert_eq!(state.holders[0].owner, "\u{fffd}\u{fffd}");
}

#[cfg(feature = "cluster")]
mod cluster {
    use super::*;
    use multilock_testkit::key_slot;

    /// Mid-migration (the key moved to the importing primary, the slot not
    /// handed over): the importing primary lists the key, which is sampled
    /// where the slot's owner redirects (ASK), and inspect reads it there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lock_mid_migration_is_found_and_inspected() {
        let cluster = crate::cluster::cluster().await;
        let node = crate::cluster::cluster_node(&cluster);
        let client = long_lease_client();
        let name = crate::cluster::name_per_shard(&cluster).await.remove(0);
        let lock = owned(&client.lock(&node, &name).unwrap(), "m");
        let _held = lock.lock_with_lease(LONG_LEASE).await.unwrap();
        let migration = cluster
            .begin_slot_migration(key_slot(&name), 1)
            .await
            .unwrap();
        assert!(migration.move_keys(&cluster).await.unwrap() >= 1);
        let found = node.find_locks("orders:*").await.unwrap();
        let inspection = lock.inspect().await.unwrap();
        migration.finish(&cluster).await.unwrap();
        let names: Vec<&str> = found.locks.iter().map(|lock| lock.name.as_str()).collect();
        assert_eq!(names, [name.as_str()], "{found:?}");
        let state = inspection.nodes[0].state.as_ref().unwrap();
        assert_eq!(state.holders[0].owner, "m");
    }

    /// One primary frozen: the other shards' locks are listed, and the
    /// frozen one is named as not scanned.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_frozen_shard_is_named_and_the_others_listed() {
        let mut cluster = crate::cluster::cluster().await;
        let node = crate::cluster::cluster_node(&cluster);
        let client = long_lease_client();
        let names = crate::cluster::name_per_shard(&cluster).await;
        let mut guards = Vec::new();
        for name in &names {
            guards.push(
                client
                    .lock(&node, name)
                    .unwrap()
                    .lock_with_lease(LONG_LEASE)
                    .await
                    .unwrap(),
            );
        }
        cluster.pause(2).await.unwrap();
        let found = node.find_locks("*").await;
        cluster.unpause(2).await.unwrap();
        let found = found.unwrap();
        assert_eq!(found.locks.len(), 2, "{found:?}");
        assert_eq!(found.unscanned.len(), 1, "{found:?}");
        assert!(
            !found
                .locks
                .iter()
                .any(|lock| lock.node == found.unscanned[0].node)
        );
    }
}
