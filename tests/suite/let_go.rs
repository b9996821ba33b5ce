//! What a client lets go of once its user dropped every `Node` and lock on
//! a server (its connections, its background work there), and what it
//! keeps while a guard lives (the renewal of that guard's hold).

use std::time::Duration;

use crate::common::*;
use multilock::Node;
use multilock_testkit::TestServer;

/// Once every `Node` and lock on them is dropped, a client keeps no
/// connection to their servers and makes none, fenced or not. (The fence
/// book held every node it had seen, and its watch reconnected to a dead
/// one every 250 ms for the client's lifetime.)
#[tokio::test]
async fn dropped_nodes_are_let_go() {
    let mut servers = servers(3).await;
    let client = client();
    let admins = admins(&servers).await;
    for fencing in [false, true] {
        {
            let nodes: Vec<Node> = servers.iter().map(node).collect();
            let mut red = client.red_lock_on(&nodes, "let-go").unwrap();
            if fencing {
                red = red.with_fencing();
            }
            take_and_release(&red, PATIENCE, "all up").await;
        }
        all_closed(&admins, &format!("fencing: {fencing}")).await;
    }
    // The port of a dead server sees no connection attempt.
    let port = servers[0].port();
    servers[0].kill().await.unwrap();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let attempt = tokio::time::timeout(Duration::from_secs(3), listener.accept()).await;
    assert!(
        attempt.is_err(),
        "a connection attempt to a dropped node's port: {attempt:?}"
    );
}

/// After every Node and lock is dropped (the client kept), no connection
/// is left, for the lock kinds other than RedLock too.
#[tokio::test]
async fn every_lock_kind_lets_go_of_its_connections() {
    let servers = servers(3).await;
    let client = client_with_watchdog(Duration::from_secs(1));
    let admins = admins(&servers).await;
    {
        let nodes: Vec<Node> = servers.iter().map(node).collect();
        // Watchdog-renewed holds, released; one dropped unreleased.
        let g = client
            .lock(&nodes[0], "c-single")
            .unwrap()
            .lock()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(800)).await;
        g.unlock().await.unwrap();
        let fair = client.fair_lock(&nodes[1], "c-fair").unwrap();
        let g = fair.lock().await.unwrap();
        // A waiter queued behind the holder (pub/sub), then granted.
        let waiter = {
            let fair = fair.clone();
            tokio::spawn(async move { fair.lock().await.unwrap().unlock().await.unwrap() })
        };
        wait_queued(&servers[1].url(), "c-fair").await;
        g.unlock().await.unwrap();
        waiter.await.unwrap();
        let rw = client.read_write_lock(&nodes[2], "c-rw").unwrap();
        let r = rw.read().lock().await.unwrap();
        let writer = {
            let rw = rw.clone();
            tokio::spawn(async move { rw.write().lock().await.unwrap().unlock().await.unwrap() })
        };
        wait_for_channel_listeners(&servers[2].url(), "redisson_rwlock:{c-rw}", 1).await;
        r.unlock().await.unwrap();
        writer.await.unwrap();
        let multi = client.multi_lock_on(&nodes, "c-multi").unwrap();
        multi.lock().await.unwrap().unlock().await.unwrap();
        let fenced_multi = client
            .multi_lock_on(&nodes, "c-fmulti")
            .unwrap()
            .with_fencing();
        fenced_multi.lock().await.unwrap().unlock().await.unwrap();
        let red = client.red_lock_on(&nodes, "c-red").unwrap();
        drop(red.lock().await.unwrap()); // released in the background
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    all_closed(&admins, "every lock kind").await;
}

/// Whether `guard` still claims its lock (its `lost()` has not resolved).
async fn not_lost(guard: &multilock::Guard) -> bool {
    tokio::time::timeout(Duration::from_millis(50), guard.lost())
        .await
        .is_err()
}

/// Watchdog holds whose user dropped every `Node` and lock: renewal goes on
/// while the guard lives (a 1 s watchdog; checked after 5 s), though the
/// client's watchdogs hold their nodes weakly: the guards hold them.
#[tokio::test]
async fn renewal_goes_on_after_every_node_and_lock_is_dropped() {
    let servers = servers(3).await;
    let client = client_with_watchdog(Duration::from_secs(1));
    // A RedLock and a MultiLock whose nodes the user dropped.
    let (red, multi) = {
        let nodes: Vec<Node> = servers.iter().map(node).collect();
        let red = client
            .red_lock_on(&nodes, "w-red")
            .unwrap()
            .lock()
            .await
            .unwrap();
        let multi = client
            .multi_lock_on(&nodes, "w-multi")
            .unwrap()
            .lock()
            .await
            .unwrap();
        (red, multi)
    };
    // A single lock dropped while its guard lives, the guard moved into a
    // task.
    let single = {
        let n = node(&servers[0]);
        client.lock(&n, "w-single").unwrap().lock().await.unwrap()
    };
    let fair = {
        let n = node(&servers[1]);
        client
            .fair_lock(&n, "w-fair")
            .unwrap()
            .lock()
            .await
            .unwrap()
    };
    let read = {
        let n = node(&servers[2]);
        client
            .read_write_lock(&n, "w-rw")
            .unwrap()
            .read()
            .lock()
            .await
            .unwrap()
    };
    let task = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        single
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    let single = task.await.unwrap();
    for server in &servers {
        for name in ["w-red", "w-multi"] {
            assert!(
                exists(&server.url(), name).await,
                "{name} at {}",
                server.port()
            );
        }
    }
    assert!(
        exists(&servers[0].url(), "w-single").await,
        "w-single expired"
    );
    assert!(exists(&servers[1].url(), "w-fair").await, "w-fair expired");
    assert!(exists(&servers[2].url(), "w-rw").await, "w-rw expired");
    for guard in [&red, &multi, &single, &fair, &read] {
        assert!(not_lost(guard).await, "{} lost", guard.name());
    }
}

/// A connection to each server, for asking it about its clients.
async fn admins(servers: &[impl TestServer]) -> Vec<redis::aio::MultiplexedConnection> {
    let mut admins = Vec::new();
    for server in servers {
        admins.push(raw(&server.url()).await);
    }
    admins
}

/// Polls until the servers `admins` are connected to have no client but
/// them.
async fn all_closed(admins: &[redis::aio::MultiplexedConnection], what: &str) {
    eventually(
        2 * PATIENCE,
        |open: &u64| format!("{open} connections still open ({what})"),
        || async {
            let mut open = 0;
            for admin in admins {
                open += connected_clients(&mut admin.clone()).await - 1;
            }
            if open == 0 { Ok(()) } else { Err(open) }
        },
    )
    .await;
}

/// Polls until a waiter is in fair lock `name`'s queue at `url`.
async fn wait_queued(url: &str, name: &str) {
    let queue = format!("redisson_lock_queue:{{{name}}}");
    eventually(
        PATIENCE,
        |queued: &u64| format!("{queued} waiters in {queue}"),
        || async {
            let queued: u64 = run(url, redis::cmd("LLEN").arg(&queue)).await.unwrap();
            if queued == 1 { Ok(()) } else { Err(queued) }
        },
    )
    .await;
}

/// The `connected_clients` of the server `admin` is connected to (itself
/// included).
async fn connected_clients(admin: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(admin)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}
