//! Fenced RedLocks stay available while a quorum of masters answers: new
//! names with a minority dead, and names whose counters survive on fewer
//! nodes than a proof needs (the fencing-availability issue's two repros).

use std::time::Duration;

use super::{counter_at, fenced, fenced_grant, nodes};
use crate::common::*;
use multilock_testkit::TestServer;

/// More than a round's budget and a settlement's node timeouts, far less
/// than "for as long as the node stays dead".
const WAIT: Duration = Duration::from_secs(5);

/// Grants `name` three times through `client`, each token above the last
/// (and the first above `after`): the tokens.
async fn grants_increase(
    client: &multilock::Client,
    nodes: &[multilock::Node],
    name: &str,
    after: u64,
    why: &str,
) -> Vec<u64> {
    let red = fenced(client, nodes, name);
    let mut tokens = vec![after];
    for i in 0..3 {
        let token = fenced_grant(&red, WAIT, &format!("{why}, grant {i}")).await;
        let last = *tokens.last().unwrap();
        assert!(token > last, "{why}: token {token} after {last}");
        tokens.push(token);
    }
    tokens.split_off(1)
}

/// Repro 1: one of five masters is dead before the client starts. A new
/// name is granted within the wait (it used to get `Ok(None)` every time:
/// its first token waited for every node to answer), and so is a new name
/// of a client that fenced another one with all five up.
#[tokio::test]
async fn a_new_name_is_granted_with_one_master_dead() {
    let mut servers = servers(5).await;
    let earlier = client();
    let all_nodes = nodes(&servers);
    grants_increase(&earlier, &all_nodes, "before-the-death", 0, "all five up").await;
    servers[4].kill().await.unwrap();
    let fresh = client();
    let nodes = nodes(&servers);
    grants_increase(
        &fresh,
        &nodes,
        "fresh-name",
        0,
        "a fresh client, 1 of 5 dead",
    )
    .await;
    grants_increase(
        &earlier,
        &all_nodes,
        "new-after-the-death",
        0,
        "1 of 5 dead",
    )
    .await;
}

/// Two of five masters dead, from a client that never saw them.
#[tokio::test]
async fn a_new_name_is_granted_with_two_masters_dead_by_a_client_that_never_saw_them() {
    let mut servers = servers(5).await;
    servers[0].kill().await.unwrap();
    servers[3].kill().await.unwrap();
    let nodes = nodes(&servers);
    grants_increase(&client(), &nodes, "two-dead", 0, "2 of 5 dead").await;
}

/// Repro 2, made deterministic: the name's counter survives on one node
/// only (four restarted empty one after another, beyond what a proof
/// survives), and then one of those four dies. Three masters answer, one
/// of them intact: no repair can complete and nothing can be proven. The
/// name is granted from the wall-clock floor taken from the quorum (it used
/// to wait for all five), above every earlier token, and the tokens go on
/// increasing.
#[tokio::test]
async fn a_name_whose_counter_survives_on_one_node_is_granted_with_a_quorum_up() {
    let mut servers = servers(5).await;
    let client = client();
    let nodes = nodes(&servers);
    let tokens = grants_increase(&client, &nodes, "storm", 0, "all five up").await;
    let last = *tokens.last().unwrap();
    for server in &mut servers[1..] {
        server.restart().await.unwrap();
    }
    servers[4].kill().await.unwrap();
    assert_eq!(counter_at(&servers[0], "storm").await, last);
    grants_increase(
        &client,
        &nodes,
        "storm",
        last,
        "one counter left, 4 of 5 up",
    )
    .await;
}
