//! What an operator sees: `inspect` on every lock kind (ours and
//! Redisson's holders, a fair queue in order, readers with their holds, a
//! RedLock split or missing a node), that it never writes (MONITOR), and
//! `find_locks` telling lock keys from 10,000 others. Holds take long
//! leases: nothing here expires while it is looked at.

use futures::StreamExt;
use multilock::inspect::{LockState, Mode, Verdict};
use multilock::{Lock, Owner};
use multilock_testkit::{TestServer, redisson, redisson_rwlock};

use crate::common::*;

/// A Redisson client's hold field: its UUID, then its thread id.
const REDISSON: &str = "6f1c0e9a-1111-2222-3333-444455556666";

/// The state a node answered with; panics with its error when it did not.
fn answered(inspection: &multilock::inspect::Inspection, node: usize) -> &LockState {
    inspection.nodes[node]
        .state
        .as_ref()
        .unwrap_or_else(|err| panic!("node {node} did not answer: {err}"))
}

/// A held verdict's claims as (field, nodes); panics on another verdict.
fn held(verdict: &Verdict) -> Vec<(String, Vec<String>)> {
    match verdict {
        Verdict::Held(claims) => claims
            .iter()
            .map(|c| (c.field.clone(), c.nodes.clone()))
            .collect(),
        other => panic!("not held: {other:?}"),
    }
}

fn owned(lock: &Lock, owner: &str) -> Lock {
    lock.with_owner(Owner::new(owner).unwrap())
}

#[tokio::test]
async fn inspect_shows_our_holder_with_its_count_and_a_redisson_holder() {
    let server = server().await;
    let node = node(&server);
    let client = long_lease_client();
    let lock = owned(
        &client.lock(&node, "inspect:ours").unwrap().with_fencing(),
        "job-7",
    );
    let _outer = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let _inner = lock.lock_with_lease(LONG_LEASE).await.unwrap();

    let inspection = lock.inspect().await.unwrap();
    assert_eq!(inspection.nodes[0].node, addr(&server));
    assert_eq!(inspection.nodes[0].name, "inspect:ours");
    let state = answered(&inspection, 0);
    assert_eq!(state.holders.len(), 1, "{state:?}");
    let holder = &state.holders[0];
    assert_eq!(holder.client_id, client.id());
    assert_eq!(holder.owner, "job-7");
    assert_eq!(holder.holds, 2);
    assert!(!holder.writer && holder.read_holds.is_empty());
    let ttl = state.ttl.expect("a held lock has a TTL");
    assert!(ttl <= LONG_LEASE && ttl > LONG_LEASE - PATIENCE, "{ttl:?}");
    assert!(
        state.fencing_counter.is_some_and(|counter| counter >= 1),
        "{state:?}"
    );
    assert_eq!(state.mode, None);
    assert!(state.queue.is_empty());
    assert_eq!(
        held(&inspection.verdict),
        [(format!("{}:job-7", client.id()), vec![addr(&server)])]
    );

    // A Redisson client's hold, written with Redisson's own script.
    let field = format!("{REDISSON}:1");
    let taken: Option<i64> = redisson::acquire("inspect:theirs", &field, LONG_LEASE)
        .invoke_async(&mut raw(&server.url()).await)
        .await
        .unwrap();
    assert_eq!(taken, None);
    let theirs = client
        .lock(&node, "inspect:theirs")
        .unwrap()
        .inspect()
        .await
        .unwrap();
    let holder = &answered(&theirs, 0).holders[0];
    assert_eq!(
        (
            holder.client_id.as_str(),
            holder.owner.as_str(),
            holder.holds
        ),
        (REDISSON, "1", 1)
    );

    let free = client
        .lock(&node, "inspect:nobody")
        .unwrap()
        .inspect()
        .await
        .unwrap();
    let state = answered(&free, 0);
    assert!(
        state.holders.is_empty() && state.queue.is_empty(),
        "{state:?}"
    );
    assert_eq!(
        (state.ttl, state.mode, state.fencing_counter),
        (None, None, None)
    );
    assert_eq!(free.verdict, Verdict::Free);
}

#[tokio::test]
async fn a_fair_queue_of_three_shows_in_order_with_rising_deadlines() {
    let server = server().await;
    let node = node(&server);
    let client = long_lease_client();
    let fair = client.fair_lock(&node, "inspect:fair").unwrap();
    let _held = owned(&fair, "holder")
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for n in 1..=3 {
        let waiter = owned(&fair, &format!("waiter-{n}"));
        waiters.push(tokio::spawn(async move { waiter.lock().await }));
        eventually(
            PATIENCE,
            |queued| format!("{queued} queued, not {n}"),
            || {
                let fair = fair.clone();
                async move {
                    let queued = answered(&fair.inspect().await.unwrap(), 0).queue.len();
                    if queued == n { Ok(()) } else { Err(queued) }
                }
            },
        )
        .await;
    }

    let inspection = fair.inspect().await.unwrap();
    let state = answered(&inspection, 0);
    let owners: Vec<&str> = state.queue.iter().map(|w| w.owner.as_str()).collect();
    assert_eq!(owners, ["waiter-1", "waiter-2", "waiter-3"]);
    assert!(state.queue.iter().all(|w| w.client_id == client.id()));
    let deadlines: Vec<_> = state
        .queue
        .iter()
        .map(|w| w.deadline.expect("a deadline"))
        .collect();
    assert!(
        deadlines.windows(2).all(|pair| pair[0] < pair[1]),
        "{deadlines:?}"
    );
    assert!(
        deadlines[0] > state.server_time,
        "{deadlines:?} {:?}",
        state.server_time
    );
    assert_eq!(state.holders[0].owner, "holder");
    for waiter in waiters {
        waiter.abort();
    }
}

#[tokio::test]
async fn readers_show_each_read_hold_and_a_writer_shows_as_such() {
    let server = server().await;
    let node = node(&server);
    let client = long_lease_client();
    let rw = client.read_write_lock(&node, "inspect:rw").unwrap();
    let first = owned(rw.read(), "reader-1");
    let _a = first.lock_with_lease(LONG_LEASE).await.unwrap();
    let _b = first.lock_with_lease(LONG_LEASE).await.unwrap();
    let _c = owned(rw.read(), "reader-2")
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();

    let inspection = rw.write().inspect().await.unwrap();
    let state = answered(&inspection, 0);
    assert_eq!(state.mode, Some(Mode::Read));
    let mut readers: Vec<(&str, u64, usize)> = state
        .holders
        .iter()
        .map(|h| (h.owner.as_str(), h.holds, h.read_holds.len()))
        .collect();
    readers.sort();
    assert_eq!(readers, [("reader-1", 2, 2), ("reader-2", 1, 1)]);
    for holder in &state.holders {
        assert!(!holder.writer);
        for ttl in &holder.read_holds {
            let ttl = ttl.expect("a live read hold has a TTL");
            assert!(ttl > LONG_LEASE - PATIENCE, "{ttl:?}");
        }
    }
    assert!(matches!(&inspection.verdict, Verdict::Held(claims) if claims.len() == 2));

    let writes = client.read_write_lock(&node, "inspect:rw-written").unwrap();
    let _w = owned(writes.write(), "writer")
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let written = writes.read().inspect().await.unwrap();
    let state = answered(&written, 0);
    assert_eq!(state.mode, Some(Mode::Write));
    assert_eq!(state.holders.len(), 1);
    let writer = &state.holders[0];
    assert!(writer.writer && writer.read_holds.is_empty());
    assert_eq!(writer.owner, "writer");
    assert!(writer.field.ends_with(":writer:write"), "{}", writer.field);

    // Redisson's own readers read the same.
    let field = format!("{REDISSON}:9");
    let _: Option<i64> = redisson_rwlock::read_acquire("inspect:rw-theirs", &field, LONG_LEASE)
        .invoke_async(&mut raw(&server.url()).await)
        .await
        .unwrap();
    let theirs = client
        .read_write_lock(&node, "inspect:rw-theirs")
        .unwrap()
        .read()
        .inspect()
        .await
        .unwrap();
    let holder = &answered(&theirs, 0).holders[0];
    assert_eq!((holder.owner.as_str(), holder.read_holds.len()), ("9", 1));
    assert!(holder.read_holds[0].is_some());
}

#[tokio::test]
async fn a_red_lock_split_across_nodes_names_them_and_a_dead_node_is_reported() {
    let mut servers = servers(3).await;
    let nodes: Vec<_> = servers.iter().map(node).collect();
    let client = long_lease_client();
    let red = client.red_lock_on(&nodes, "inspect:red").unwrap();

    // One owner on one node only, another on a second: no quorum.
    let _a = owned(&client.lock(&nodes[0], "inspect:red").unwrap(), "a")
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let _b = owned(&client.lock(&nodes[1], "inspect:red").unwrap(), "b")
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let split = red.inspect().await.unwrap();
    assert_eq!(split.quorum, 2);
    let Verdict::Split(claims) = &split.verdict else {
        panic!("not split: {:?}", split.verdict);
    };
    let claims: Vec<_> = claims
        .iter()
        .map(|c| (c.field.clone(), c.nodes.clone()))
        .collect();
    assert_eq!(
        claims,
        [
            (format!("{}:a", client.id()), vec![addr(&servers[0])]),
            (format!("{}:b", client.id()), vec![addr(&servers[1])]),
        ]
    );
    drop((_a, _b));
    eventually(
        PATIENCE,
        |verdict| format!("still {verdict:?}"),
        || async {
            match red.inspect().await.unwrap().verdict {
                Verdict::Free => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;

    let job = red.with_owner(Owner::new("job").unwrap());
    let _held = job.lock_with_lease(LONG_LEASE).await.unwrap();
    let field = format!("{}:job", client.id());
    servers[2].kill().await.unwrap();
    let inspection = red.inspect().await.unwrap();
    assert!(
        inspection.nodes[2].state.is_err(),
        "{:?}",
        inspection.nodes[2]
    );
    assert_eq!(inspection.nodes[2].node, addr(&servers[2]));
    assert_eq!(
        held(&inspection.verdict),
        [(field, vec![addr(&servers[0]), addr(&servers[1])])]
    );

    // With two of three silent, nobody can tell.
    servers[1].kill().await.unwrap();
    let unknown = red.inspect().await.unwrap();
    assert!(matches!(unknown.verdict, Verdict::Unknown { unanswered } if unanswered.len() == 2));
}

#[tokio::test]
async fn inspect_never_writes() {
    let server = server().await;
    let node = node(&server);
    let client = long_lease_client();
    let rw = client.read_write_lock(&node, "inspect:watched").unwrap();
    let _r = owned(rw.read(), "r")
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let fair = client.fair_lock(&node, "inspect:watched-fair").unwrap();
    let _f = owned(&fair, "f").lock_with_lease(LONG_LEASE).await.unwrap();
    let inspector = client.lock(&node, "inspect:watched").unwrap();
    inspector.inspect().await.unwrap(); // the connection is made (and its scripts loaded) before MONITOR

    let mut lines = monitor(&server.url()).await;
    inspector.inspect().await.unwrap();
    client
        .lock(&node, "inspect:watched-fair")
        .unwrap()
        .inspect()
        .await
        .unwrap();
    let _: String = run(&server.url(), redis::cmd("ECHO").arg("inspect:done"))
        .await
        .unwrap();
    let (_, sha) = script("inspect");
    let mut seen = Vec::new();
    while let Some(line) = tokio::time::timeout(PATIENCE, lines.next()).await.unwrap() {
        if line.command() == "echo" && line.has_arg("inspect:done") {
            break;
        }
        seen.push(line);
    }
    let calls = seen
        .iter()
        .filter(|line| line.command() == "evalsha")
        .count();
    assert_eq!(calls, 2, "{seen:?}");
    for line in &seen {
        let read = match line.command() {
            "evalsha" => line.args[1] == sha,
            "hlen" | "hscan" | "hgetall" | "hexists" | "pttl" | "lrange" | "llen" | "zscore"
            | "get" | "time" => line.from_script,
            "ping" | "client" | "hello" | "echo" => !line.from_script,
            _ => false,
        };
        assert!(read, "inspect ran {line:?}");
    }
    assert!(
        seen.iter()
            .any(|line| line.command() == "pttl" && line.args[1].contains("rwlock_timeout"))
    );
}

#[tokio::test]
async fn find_locks_finds_only_the_locks_among_ten_thousand_keys() {
    let server = server().await;
    let node = node(&server);
    let client = long_lease_client();
    let mut conn = raw(&server.url()).await;
    let mut pipe = redis::pipe();
    for i in 0..10_000 {
        match i % 4 {
            0 => pipe.set(format!("orders:s:{i}"), i),
            1 => pipe.rpush(format!("orders:l:{i}"), i),
            // Hashes that are not locks, some of them lock-like.
            2 => pipe.hset(format!("orders:h:{i}"), "page:views", i),
            _ => pipe.hset(
                format!("other:h:{i}"),
                format!("{REDISSON}:x"),
                "not a count",
            ),
        };
    }
    let () = pipe.query_async(&mut conn).await.unwrap();
    let _ours = client
        .lock(&node, "orders:1")
        .unwrap()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let field = format!("{REDISSON}:1");
    let _: Option<i64> = redisson::acquire("orders:2", &field, LONG_LEASE)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    let _rw = client
        .read_write_lock(&node, "orders:3")
        .unwrap()
        .read()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let _other = client
        .lock(&node, "elsewhere:1")
        .unwrap()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();

    let found = node.find_locks("orders:*").await.unwrap().locks;
    let names: Vec<(&str, bool)> = found
        .iter()
        .map(|lock| (lock.name.as_str(), lock.read_write))
        .collect();
    assert_eq!(
        names,
        [("orders:1", false), ("orders:2", false), ("orders:3", true)]
    );
    assert!(found.iter().all(|lock| lock.node == addr(&server)));
    let all = node.find_locks("*").await.unwrap().locks;
    assert_eq!(all.len(), 4, "{all:?}");
}

#[cfg(feature = "cluster")]
#[tokio::test]
async fn on_a_cluster_inspect_routes_by_slot_and_find_locks_scans_every_primary() {
    let cluster = crate::cluster::cluster().await;
    let node = crate::cluster::cluster_node(&cluster);
    let client = long_lease_client();
    let names = crate::cluster::name_per_shard(&cluster).await;
    let mut guards = Vec::new();
    for name in &names {
        guards.push(
            owned(&client.lock(&node, name).unwrap(), "c")
                .lock_with_lease(LONG_LEASE)
                .await
                .unwrap(),
        );
    }
    let rw = client.read_write_lock(&node, &names[0]).unwrap();
    let inspection = rw.read().inspect().await.unwrap();
    let holder = &answered(&inspection, 0).holders[0];
    assert_eq!((holder.owner.as_str(), holder.holds), ("c", 1));

    let found = node.find_locks("*").await.unwrap().locks;
    let mut found_names: Vec<&str> = found.iter().map(|lock| lock.name.as_str()).collect();
    found_names.sort();
    let mut expected: Vec<&str> = names.iter().map(String::as_str).collect();
    expected.sort();
    assert_eq!(found_names, expected);
    let shards: std::collections::HashSet<&str> =
        found.iter().map(|lock| lock.node.as_str()).collect();
    assert_eq!(shards.len(), 3, "{found:?}");
}

#[cfg(feature = "sentinel")]
#[tokio::test]
async fn on_a_sentinel_primary_inspect_and_find_locks_read_the_primary() {
    let group = crate::sentinel::group().await;
    let node = crate::sentinel::sentinel_node(&group);
    let client = long_lease_client();
    let _held = owned(&client.lock(&node, "inspect:s").unwrap(), "s")
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let inspection = client
        .lock(&node, "inspect:s")
        .unwrap()
        .inspect()
        .await
        .unwrap();
    assert_eq!(answered(&inspection, 0).holders[0].owner, "s");
    let found = node.find_locks("inspect:*").await.unwrap().locks;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].name, "inspect:s");
}
