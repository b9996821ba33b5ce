//! `multilock inspect --json`: what each kind of holder and waiter looks
//! like, ours and Redisson's, and the verdict over several nodes.

use std::time::Duration;

use multilock::{Client, Node, Owner};
use multilock_testkit::{RedisProcess, TestServer, redisson, redisson_fair};
use serde_json::Value;

use crate::common::{LONG_LEASE, addr, args, node_args, raw, run_expecting};

async fn inspect_json(name: &str, flags: &[&str], nodes: &[String]) -> Value {
    let mut words = vec!["inspect", name, "--json"];
    words.extend_from_slice(flags);
    run_expecting(&args(&words, nodes), 0).await.json()
}

#[tokio::test]
async fn our_holder_with_its_client_id_owner_and_holds() {
    let server = RedisProcess::start().await.unwrap();
    let node = Node::new(&server.url()).unwrap();
    let client = Client::new();
    let lock = client
        .lock(&node, "orders:42")
        .unwrap()
        .with_owner(Owner::new("job-7").unwrap());
    let _outer = lock.lock_with_lease(LONG_LEASE).await.unwrap();
    let _inner = lock.lock_with_lease(LONG_LEASE).await.unwrap();

    let json = inspect_json("orders:42", &[], &node_args(&server.url())).await;
    assert_eq!(json["name"], "orders:42");
    assert_eq!(json["quorum"], 1);
    assert_eq!(json["verdict"]["state"], "held");
    let field = format!("{}:job-7", client.id());
    assert_eq!(json["verdict"]["claims"][0]["field"], field.as_str());
    let answer = &json["nodes"][0];
    assert_eq!(answer["node"], addr(&server.url()).as_str());
    assert_eq!(answer["ok"], true);
    let ttl = answer["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 30_000 && ttl <= 60_000, "{answer}");
    let holder = &answer["holders"][0];
    assert_eq!(holder["client_id"], client.id());
    assert_eq!(holder["owner"], "job-7");
    assert_eq!(holder["holds"], 2);
    assert_eq!(holder["writer"], false);
    assert_eq!(answer["holders"].as_array().unwrap().len(), 1);

    // The table says the same.
    let table = run_expecting(
        &args(&["inspect", "orders:42"], &node_args(&server.url())),
        0,
    )
    .await;
    assert!(table.stdout.contains(client.id()), "{}", table.stdout);
    assert!(table.stdout.contains("job-7"), "{}", table.stdout);
    assert!(
        table.stdout.contains("verdict: held by"),
        "{}",
        table.stdout
    );
}

#[tokio::test]
async fn a_redisson_holder_and_a_free_lock() {
    let server = RedisProcess::start().await.unwrap();
    let java = "6f0c9a5e-1b2c-4d3e-8f90-a1b2c3d4e5f6:57";
    let granted: Option<i64> = redisson::acquire("invoices", java, LONG_LEASE)
        .invoke_async(&mut raw(&server.url()).await)
        .await
        .unwrap();
    assert_eq!(granted, None);

    let json = inspect_json("invoices", &[], &node_args(&server.url())).await;
    let holder = &json["nodes"][0]["holders"][0];
    assert_eq!(holder["field"], java);
    assert_eq!(holder["client_id"], "6f0c9a5e-1b2c-4d3e-8f90-a1b2c3d4e5f6");
    assert_eq!(holder["owner"], "57");
    assert_eq!(holder["holds"], 1);
    assert_eq!(json["verdict"]["state"], "held");

    let free = inspect_json("nobody-holds-this", &[], &node_args(&server.url())).await;
    assert_eq!(free["verdict"]["state"], "free");
    assert_eq!(free["nodes"][0]["holders"], serde_json::json!([]));
    assert_eq!(free["nodes"][0]["ttl_ms"], Value::Null);
}

#[tokio::test]
async fn a_fair_queue_of_three_in_order_with_deadlines_ahead() {
    let server = RedisProcess::start().await.unwrap();
    let mut conn = raw(&server.url()).await;
    let wait = Duration::from_secs(30);
    let fields = [
        "11111111-0000-0000-0000-000000000000:1",
        "22222222-0000-0000-0000-000000000000:2",
        "33333333-0000-0000-0000-000000000000:3",
        "44444444-0000-0000-0000-000000000000:4",
    ];
    for (i, field) in fields.iter().enumerate() {
        let reply: Option<i64> =
            redisson_fair::acquire("tickets", field, LONG_LEASE, wait, redisson_fair::now_ms())
                .invoke_async(&mut conn)
                .await
                .unwrap();
        assert_eq!(reply.is_none(), i == 0, "only the first is granted");
    }

    let json = inspect_json("tickets", &["--kind", "fair"], &node_args(&server.url())).await;
    let answer = &json["nodes"][0];
    assert_eq!(answer["holders"][0]["field"], fields[0]);
    let queue = answer["queue"].as_array().unwrap();
    let queued: Vec<&str> = queue.iter().map(|w| w["field"].as_str().unwrap()).collect();
    assert_eq!(queued, fields[1..]);
    assert_eq!(
        queue[1]["client_id"],
        "33333333-0000-0000-0000-000000000000"
    );
    assert_eq!(queue[1]["owner"], "3");
    // Each deadline is ahead of the server's clock, each after the one before.
    let ahead: Vec<i64> = queue
        .iter()
        .map(|w| w["deadline_in_ms"].as_i64().unwrap())
        .collect();
    assert!(
        ahead[0] > 0 && ahead[0] < ahead[1] && ahead[1] < ahead[2],
        "{ahead:?}"
    );
    let table = run_expecting(&args(&["inspect", "tickets"], &node_args(&server.url())), 0).await;
    assert!(
        table.stdout.contains("queue (head first)"),
        "{}",
        table.stdout
    );
    assert!(table.stdout.contains("3. 44444444"), "{}", table.stdout);
}

#[tokio::test]
async fn a_read_write_lock_with_two_readers() {
    let server = RedisProcess::start().await.unwrap();
    let node = Node::new(&server.url()).unwrap();
    let client = Client::new();
    let rw = client.read_write_lock(&node, "catalog").unwrap();
    let _a = rw
        .read()
        .with_owner(Owner::new("reader-a").unwrap())
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let _b = rw
        .read()
        .with_owner(Owner::new("reader-b").unwrap())
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();

    let json = inspect_json("catalog", &["--kind", "rw"], &node_args(&server.url())).await;
    let answer = &json["nodes"][0];
    assert_eq!(answer["mode"], "read");
    let mut owners = Vec::new();
    for holder in answer["holders"].as_array().unwrap() {
        assert_eq!(holder["writer"], false);
        assert_eq!(holder["holds"], 1);
        let reads = holder["read_holds_ttl_ms"].as_array().unwrap();
        assert_eq!(reads.len(), 1, "{holder}");
        assert!(reads[0].as_u64().unwrap() > 30_000, "{holder}");
        owners.push(holder["owner"].as_str().unwrap().to_owned());
    }
    owners.sort();
    assert_eq!(owners, ["reader-a", "reader-b"]);
    // Two readers on a quorum of one: both hold.
    assert_eq!(json["verdict"]["state"], "held");
    assert_eq!(json["verdict"]["claims"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn a_redlock_held_on_one_node_of_three_is_split_naming_that_node() {
    let servers = RedisProcess::start_many(3).await.unwrap();
    let urls: Vec<String> = servers.iter().map(|server| server.url()).collect();
    let node = Node::new(&urls[1]).unwrap();
    let _guard = Client::new()
        .lock(&node, "orders:7")
        .unwrap()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();

    let nodes: Vec<String> = urls.iter().flat_map(|url| node_args(url)).collect();
    let json = inspect_json("orders:7", &[], &nodes).await;
    assert_eq!(json["quorum"], 2);
    assert_eq!(json["verdict"]["state"], "split");
    let claims = json["verdict"]["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0]["nodes"], serde_json::json!([addr(&urls[1])]));
    assert_eq!(json["nodes"].as_array().unwrap().len(), 3);

    // With --all (a MultiLock) every node must hold: still not held.
    let all = inspect_json("orders:7", &["--all"], &nodes).await;
    assert_eq!(all["quorum"], 3);
    assert_eq!(all["verdict"]["state"], "split");
}
