//! A node that is a Redis Cluster reached over TLS (`Node::cluster` seeded
//! with a `rediss://` URL): every shard connection and the sharded
//! subscription speak TLS. Each of the 3 primaries (no replicas) listens on a
//! plain port, which the test uses to look at it, and on a TLS port, which
//! the node uses; the cluster bus is TLS too.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use multilock::Node;
use multilock_testkit::{RedisProcess, key_slot};

use crate::common::*;

/// The node's connect and reply timeouts.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the 3 nodes may take to form a cluster.
const READY: Duration = Duration::from_secs(30);

/// The slots of the three primaries, split as `redis-cli --cluster create` does.
const SHARDS: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// One cluster node: its process (on its plain port), its TLS port and its
/// cluster bus port.
struct TlsNode {
    process: RedisProcess,
    tls_port: u16,
    bus_port: u16,
}

impl TlsNode {
    fn plain_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.process.port())
    }

    fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/#insecure", self.tls_port)
    }
}

/// Starts a cluster node on a plain port (the kit's), with TLS on a second
/// free port, for clients and for the cluster bus.
async fn start_node(cert: &Path, key: &Path) -> TlsNode {
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    // The ports of the last attempt: the closure runs again for each port.
    let chosen = Mutex::new((0u16, 0u16));
    let process = RedisProcess::start_with_args(|port| {
        let mut others = (0..10).map(|_| free_port()).filter(|&p| p != port);
        let tls_port = others.next().unwrap();
        let bus_port = others.find(|&p| p != tls_port).unwrap();
        *chosen.lock().unwrap() = (tls_port, bus_port);
        let args = [
            ["--port", &port.to_string()],
            ["--tls-port", &tls_port.to_string()],
            ["--tls-cert-file", &cert],
            ["--tls-key-file", &key],
            ["--tls-ca-cert-file", &cert],
            ["--tls-auth-clients", "no"],
            ["--tls-cluster", "yes"],
            ["--tls-replication", "yes"],
            ["--cluster-enabled", "yes"],
            ["--cluster-node-timeout", "1000"],
            // Relative to the node's own `--dir`.
            ["--cluster-config-file", "nodes.conf"],
            ["--cluster-port", &bus_port.to_string()],
        ];
        args.iter().flatten().map(|&a| a.to_owned()).collect()
    })
    .await
    .unwrap_or_else(|err| panic!("cannot start a TLS cluster node: {err}"));
    let (tls_port, bus_port) = *chosen.lock().unwrap();
    TlsNode {
        process,
        tls_port,
        bus_port,
    }
}

/// Joins the nodes over their plain ports, as the kit's `RedisCluster`
/// does (one slot range each, no replicas), and waits until each reports
/// `cluster_state:ok` and knows all 3 nodes.
async fn join(nodes: &[TlsNode]) {
    let first = nodes[0].plain_url();
    for (i, node) in nodes.iter().enumerate() {
        let url = node.plain_url();
        let epoch = (i + 1).to_string();
        let () = run(
            &url,
            redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(&epoch),
        )
        .await
        .unwrap();
        let (from, to) = SHARDS[i];
        let () = run(
            &url,
            redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(from).arg(to),
        )
        .await
        .unwrap();
        if i > 0 {
            let mut meet = redis::cmd("CLUSTER");
            meet.arg("MEET")
                .arg("127.0.0.1")
                .arg(node.process.port())
                .arg(node.bus_port);
            let () = run(&first, &meet).await.unwrap();
        }
    }
    eventually(
        READY,
        |seen: &String| format!("the TLS cluster did not become ready: {seen}"),
        || async {
            for node in nodes {
                let url = node.plain_url();
                let info: String = run(&url, redis::cmd("CLUSTER").arg("INFO"))
                    .await
                    .map_err(|err| format!("{url}: {err}"))?;
                let field = |name: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                        .map(str::trim)
                        .map(str::to_owned)
                };
                let (state, known) = (field("cluster_state"), field("cluster_known_nodes"));
                if state.as_deref() != Some("ok") || known.as_deref() != Some("3") {
                    return Err(format!("{url}: state {state:?}, {known:?} nodes known"));
                }
            }
            Ok(())
        },
    )
    .await;
}

/// `CLUSTER SLOTS` at `url`, as (first slot, last slot, primary port),
/// sorted.
async fn slots(url: &str) -> Vec<(u16, u16, u16)> {
    let reply: Vec<Vec<redis::Value>> = run(url, redis::cmd("CLUSTER").arg("SLOTS"))
        .await
        .unwrap_or_else(|err| panic!("CLUSTER SLOTS at {url}: {err}"));
    let mut ranges: Vec<(u16, u16, u16)> = reply
        .into_iter()
        .map(|range| {
            let int = |v: &redis::Value| redis::from_redis_value::<u16>(v.clone()).unwrap();
            let redis::Value::Array(primary) = &range[2] else {
                panic!("CLUSTER SLOTS at {url}: {range:?}");
            };
            (int(&range[0]), int(&range[1]), int(&primary[1]))
        })
        .collect();
    ranges.sort_unstable();
    ranges
}

/// A lock name whose slot lies in `first..=last`.
fn name_in((first, last): (u16, u16)) -> String {
    (0..)
        .map(|i| format!("tls-orders:{i}"))
        .find(|n| (first..=last).contains(&key_slot(n)))
        .unwrap()
}

/// Until a client holds a shard subscription to `name`'s channel at `url`.
async fn wait_for_shard_subscriber(url: &str, name: &str) {
    let channel = format!("redisson_lock__channel:{{{name}}}");
    eventually(
        PATIENCE,
        |n: &i64| format!("{n} shard subscribers on {channel} at {url}"),
        || async {
            let reply: Vec<redis::Value> =
                run(url, redis::cmd("PUBSUB").arg("SHARDNUMSUB").arg(&channel))
                    .await
                    .map_err(|_| 0)?;
            match reply.get(1) {
                Some(redis::Value::Int(n)) if *n > 0 => Ok(()),
                Some(redis::Value::Int(n)) => Err(*n),
                _ => Err(-1),
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_locks_and_wakes_waiters() {
    init_tracing();
    let dir = std::env::temp_dir().join(format!("multilock-cluster-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = self_signed_cert(&dir);

    let nodes = futures::future::join_all((0..3).map(|_| start_node(&cert, &key))).await;
    join(&nodes).await;

    // Which ports the cluster gives out: over TLS, the TLS ports.
    let over_tls = slots(&nodes[0].tls_url()).await;
    let over_plain = slots(&nodes[0].plain_url()).await;
    tracing::info!("CLUSTER SLOTS over TLS: {over_tls:?}; over plain TCP: {over_plain:?}");
    let tls_ports: Vec<u16> = nodes.iter().map(|n| n.tls_port).collect();
    let expected: Vec<(u16, u16, u16)> = SHARDS
        .iter()
        .zip(&tls_ports)
        .map(|(&(first, last), &port)| (first, last, port))
        .collect();
    assert_eq!(over_tls, expected, "CLUSTER SLOTS over TLS names TLS ports");
    let plain_ports = nodes.iter().map(|n| n.process.port());
    let expected: Vec<(u16, u16, u16)> = SHARDS
        .iter()
        .zip(plain_ports)
        .map(|(&(first, last), port)| (first, last, port))
        .collect();
    assert_eq!(
        over_plain, expected,
        "CLUSTER SLOTS over plain TCP names plain ports"
    );

    let node = Node::cluster([nodes[0].tls_url()])
        .connect_timeout(NODE_TIMEOUT)
        .response_timeout(NODE_TIMEOUT)
        .build()
        .unwrap();
    let client = client();
    for (shard, admin) in SHARDS.into_iter().zip(&nodes) {
        let name = name_in(shard);
        let url = admin.plain_url();
        let lock = client.lock(&node, &name).unwrap();
        let guard = lock.lock_with_lease(LONG_LEASE).await.unwrap();
        assert!(exists(&url, &name).await, "{name} on its primary {url}");
        // A waiter of another owner is woken by the release, long before
        // the lease would free it.
        let rival = client.lock(&node, &name).unwrap();
        let waiter = tokio::spawn(async move { rival.lock_with_lease(LONG_LEASE).await });
        wait_for_shard_subscriber(&url, &name).await;
        // The subscription is the node's, over TLS.
        let clients: String = run(&url, redis::cmd("CLIENT").arg("LIST")).await.unwrap();
        let tls_addr = format!("laddr=127.0.0.1:{}", admin.tls_port);
        let subscribers: Vec<&str> = clients
            .lines()
            .filter(|c| {
                c.split(' ')
                    .any(|f| f.starts_with("ssub=") && f != "ssub=0")
            })
            .collect();
        assert!(
            !subscribers.is_empty() && subscribers.iter().all(|c| c.contains(&tls_addr)),
            "shard subscribers of {url} not on its TLS port: {clients}"
        );
        guard.unlock().await.unwrap();
        let granted = tokio::time::timeout(PATIENCE, waiter).await;
        let rival_guard = granted
            .unwrap_or_else(|_| panic!("the waiter on {name} was not woken"))
            .unwrap()
            .unwrap();
        assert!(exists(&url, &name).await, "{name} held by the rival");
        rival_guard.unlock().await.unwrap();
        assert!(!exists(&url, &name).await, "{name} released");
    }

    drop(node);
    // Dropping each `RedisProcess` kills it and removes its directory.
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
}
