//! A node restarted from a stale dump brings back a counter below the last
//! token, under a new `run_id`. A client new to that node cannot tell from
//! the counter; the vouch read with it (the run the counter was last
//! sealed or repaired under) tells every client.

use super::{counter, counter_at, fenced, fenced_grant, node_2_behind_a_proxy, nodes, vouched};
use crate::common::*;
use multilock_testkit::{RedisProcess, TestServer, protocol};

const NAME: &str = "restored";

/// The model checker's counterexample, on real servers: token T is sealed
/// on nodes 0 and 1 while node 2 is cut off (it keeps T - 1, intact);
/// node 0 restarts from a dump taken before T; node 1 dies. Only node 0
/// lost its counter (the guarantee's condition: at most one of three),
/// yet a client new to the nodes read two counters at T - 1 and, trusting
/// both, proved T again: a token handed out twice. (With the vouch, node
/// 0's counter is no witness; too few remain for a proof, and the token
/// comes from the floor, above T.)
#[tokio::test]
async fn a_client_new_to_a_node_restored_from_a_stale_dump_hands_out_a_higher_token() {
    let mut servers = servers(3).await;
    // The first client reaches node 2 through a proxy that can cut it off.
    let (proxy, first_nodes) = node_2_behind_a_proxy(&servers).await;
    let first = fenced(&client(), &first_nodes, NAME);
    let before = fenced_grant(&first, PATIENCE, "all up").await;
    save(&servers[0]).await;

    proxy.black_hole();
    let sealed = fenced_grant(&first, PATIENCE, "node 2 cut off").await;
    assert!(sealed > before, "token {sealed} after {before}");
    assert_eq!(counter_at(&servers[2], NAME).await, before, "node 2 kept");
    assert!(counter_at(&servers[1], NAME).await >= sealed);

    servers[1].kill().await.unwrap();
    servers[0].restart().await.unwrap();
    assert_eq!(
        counter_at(&servers[0], NAME).await,
        before,
        "node 0 came back from its dump"
    );

    let newcomer = fenced(&client(), &nodes(&servers), NAME);
    let token = fenced_grant(&newcomer, PATIENCE, "node 1 dead, node 0 stale").await;
    assert!(
        token > sealed,
        "token {token} handed out after {sealed}: the stale counter counted as a witness"
    );
    drop(first);
}

/// Writes `server`'s dump now: its next restart comes back to this.
async fn save(server: &RedisProcess) {
    run::<()>(&server.url(), &redis::cmd("SAVE")).await.unwrap();
}

/// Clients accept each other's seals and repairs: a client new to the
/// nodes proves the next token from counters another client sealed, and
/// from a node another client repaired after it restarted empty (with one
/// node dead, that node is one of the two witnesses needed). A seal or a
/// repair that did not vouch would leave the newcomer no proof: its token
/// would jump to the wall-clock floor.
#[tokio::test]
async fn a_client_new_to_the_nodes_proves_its_token_from_another_clients_seal_and_repair() {
    let mut servers = servers(3).await;
    let nodes = nodes(&servers);
    let first = fenced(&client(), &nodes, NAME);
    let sealed = fenced_grant(&first, PATIENCE, "all up").await;
    let next = fenced_grant(&fenced(&client(), &nodes, NAME), PATIENCE, "a newcomer").await;
    assert_eq!(next, sealed + 1, "the newcomer's token is proven");

    servers[0].restart().await.unwrap();
    super::wait_counter(&servers[0], NAME, next, "the first client's repair").await;
    servers[1].kill().await.unwrap();
    let newcomer = fenced(&client(), &nodes, NAME);
    let token = fenced_grant(&newcomer, PATIENCE, "node 0 repaired, node 1 dead").await;
    assert_eq!(token, next + 1, "the newcomer's token is proven");
    drop(first);
}

/// The vouch on the wire: a seal vouches for the counter under the
/// server's mark (`run_id` and replication ID), which the next read
/// reports; a restart from a dump brings the counter and its vouch back,
/// no longer vouched; a repair's write meant for the run before the
/// restart writes nothing.
#[tokio::test]
async fn a_vouch_holds_for_one_run_of_the_server() {
    let mut server = RedisProcess::start().await.unwrap();
    let url = server.url();
    let (before, after, vouched): (i64, i64, u8) =
        eval(&url, protocol::raise_token("wire", 7)).await;
    assert_eq!(
        (before, after, vouched),
        (-1, 7, 0),
        "a new counter, sealed"
    );
    let (_, _, vouched): (i64, i64, u8) = eval(&url, protocol::raise_token("wire", 7)).await;
    assert_eq!(vouched, 1, "the seal vouched for it");
    let old_mark: String = eval(&url, protocol::server_mark("wire")).await;
    save(&server).await;

    server.restart().await.unwrap();
    assert!(exists(&url, &protocol::token_vouch_key("wire")).await);
    let (before, _, vouched): (i64, i64, u8) =
        eval(&url, protocol::repair_token("wire", 9, &old_mark)).await;
    assert_eq!((before, vouched), (-2, 0), "meant for the run before");
    assert_eq!(counter_at(&server, "wire").await, 7, "nothing written");
    let mark: String = eval(&url, protocol::server_mark("wire")).await;
    let (before, after, vouched): (i64, i64, u8) =
        eval(&url, protocol::repair_token("wire", 9, &mark)).await;
    assert_eq!(
        (before, after, vouched),
        (7, 9, 0),
        "restored from the dump, not vouched for on this run"
    );
    let (_, _, vouched): (i64, i64, u8) = eval(&url, protocol::raise_token("wire", 0)).await;
    assert_eq!(vouched, 1, "the repair vouched for it");
}

/// Two clients race on one name while nodes restart from stale dumps, one
/// at a time, each repaired (its counter vouched again, at or above every
/// token handed out before) before the next: no token is handed out twice,
/// each client's tokens increase, and a client new to the nodes goes on
/// above them all with a node dead. (Grant order across the clients is
/// not asserted: a restart that loses a hold lets the other client in
/// while it is still held, as any RedLock restarted without persistence.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_racing_clients_and_stale_dumps_hand_out_increasing_tokens() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    const NAME: &str = "race";
    let mut servers = servers(3).await;
    let nodes = nodes(&servers);
    let tokens: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut racers = Vec::new();
    for racer in 0..2 {
        let red = fenced(&client(), &nodes, NAME);
        let (tokens, stop) = (tokens.clone(), stop.clone());
        racers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let wait = std::time::Duration::from_millis(500);
                // Short leases: a hold a stale dump brings back soon goes.
                let lease = std::time::Duration::from_secs(2);
                if let Ok(Some(guard)) = red.try_lock_for(wait, Some(lease)).await {
                    let token = guard.fencing_token().unwrap();
                    tokens.lock().unwrap().push((racer, token));
                    let _ = guard.unlock().await;
                }
            }
        }));
    }
    let granted = |at_least: usize| {
        let tokens = tokens.clone();
        async move {
            eventually(
                PATIENCE,
                |n: &usize| format!("{n} grants, waiting for {at_least}"),
                || async {
                    let n = tokens.lock().unwrap().len();
                    if n >= at_least { Ok(()) } else { Err(n) }
                },
            )
            .await;
        }
    };
    for round in 0..6 {
        let i = round % 3;
        let seen = tokens.lock().unwrap().len();
        granted(seen + 3).await;
        save(&servers[i]).await;
        // Grants after the dump: the restart brings back a stale counter.
        granted(seen + 6).await;
        let high = tokens.lock().unwrap().iter().map(|t| t.1).max().unwrap();
        servers[i].restart().await.unwrap();
        let url = servers[i].url();
        eventually(
            2 * PATIENCE,
            |seen: &(Option<u64>, bool)| format!("node {i} not repaired above {high}: {seen:?}"),
            || async {
                let seen = (counter(&servers[i], NAME).await, vouched(&url, NAME).await);
                match seen {
                    (Some(c), true) if c >= high => Ok(()),
                    _ => Err(seen),
                }
            },
        )
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    for racer in racers {
        racer.await.unwrap();
    }
    let tokens = tokens.lock().unwrap().clone();
    let mut distinct: Vec<u64> = tokens.iter().map(|t| t.1).collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        tokens.len(),
        "a token handed out twice: {tokens:?}"
    );
    for racer in 0..2 {
        let own: Vec<u64> = tokens
            .iter()
            .filter(|t| t.0 == racer)
            .map(|t| t.1)
            .collect();
        for pair in own.windows(2) {
            assert!(pair[1] > pair[0], "racer {racer}: {pair:?} in {own:?}");
        }
    }
    let last = *distinct.last().unwrap();
    servers[2].kill().await.unwrap();
    let newcomer = fenced(&client(), &nodes, NAME);
    let token = fenced_grant(&newcomer, PATIENCE, "a newcomer, node 2 dead").await;
    assert!(token > last, "{token} after {last}");
}
