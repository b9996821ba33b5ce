//! Counters that went back without a restart: a primary failed over and
//! back (the same process, resynced from a replica that missed its last
//! seal), and a counter rewritten in place. Each is one node of three
//! losing its counter, inside the guarantee's condition; an adversarial
//! audit reproduced a token handed out twice in each, with vouches that
//! named only the `run_id`.

use super::{counter_at, fenced, fenced_grant, node_2_behind_a_proxy, replicaof, wait_synced};
use crate::common::*;
use multilock_testkit::{TestServer, protocol};

/// A failover and a failback (Sentinel/Cluster style, done by hand with
/// REPLICAOF): node 0's replica R is promoted in a partition while missing
/// node 0's last seal; node 0 rejoins as R's replica (full resync: R's
/// stale counter, with the vouch R replicated from node 0, run_id of node
/// 0), and is promoted back. Node 0's process never restarted: its run_id
/// is the vouch's, so the stale counter is vouched. Only node 0 lost its
/// counter; node 1 dies; node 2 (cut off during the last seal) is behind
/// but legitimately vouched.
async fn failback_scenario(newcomer: bool) {
    const NAME: &str = "failback";
    let mut servers = servers(3).await;
    let replica = server().await;
    replicaof(&replica, Some(&servers[0])).await;
    let (proxy, red_nodes) = node_2_behind_a_proxy(&servers).await;
    let first = fenced(&client(), &red_nodes, NAME);
    let before = fenced_grant(&first, PATIENCE, "all up").await;
    wait_synced(&replica, NAME, Some(before)).await;

    // Failover in a partition: R promoted, missing what node 0 gets next.
    replicaof(&replica, None).await;
    proxy.black_hole();
    let sealed = fenced_grant(&first, PATIENCE, "node 2 cut off").await;
    assert!(sealed > before);
    assert_eq!(counter_at(&servers[0], NAME).await, sealed);

    // Node 0 rejoins as R's replica, then is promoted back (failback).
    let run_id_before = info_field(&servers[0].url(), "server", "run_id").await;
    replicaof(&servers[0], Some(&replica)).await;
    wait_synced(&servers[0], NAME, Some(before)).await;
    replicaof(&servers[0], None).await;
    let run_id_after = info_field(&servers[0].url(), "server", "run_id").await;
    assert_eq!(run_id_before, run_id_after, "same process");
    let vouch: String = run(
        &servers[0].url(),
        redis::cmd("GET").arg(protocol::token_vouch_key(NAME)),
    )
    .await
    .unwrap();
    eprintln!(
        "node 0: counter {} vouch {vouch} run_id {run_id_after}",
        before
    );

    servers[1].kill().await.unwrap();
    proxy.restore();
    let token = if newcomer {
        let other = fenced(&client(), &red_nodes, NAME);
        fenced_grant(&other, PATIENCE, "node 1 dead, node 0 failed back").await
    } else {
        fenced_grant(&first, PATIENCE, "node 1 dead, node 0 failed back").await
    };
    assert!(
        token > sealed,
        "token {token} handed out after {sealed}: duplicate/decreasing token"
    );
    drop(first);
}

#[tokio::test]
async fn a_primary_failed_back_is_no_witness_for_a_newcomer() {
    failback_scenario(true).await;
}

#[tokio::test]
async fn a_primary_failed_back_is_no_witness_for_its_client() {
    failback_scenario(false).await;
}

/// How node 0's counter is rewritten outside the scripts.
#[derive(Clone, Copy)]
enum Rewrite {
    /// DEL, then a Redisson-style single-node fenced grant (INCR: 1).
    DelIncr,
    /// SET to the token before (a key restored in place, e.g. RESTORE of a
    /// backup taken between the two grants).
    SetBefore,
}

/// A counter rewritten lower on one node while the vouch of the current
/// run survives: it stays a witness.
async fn rewrite_scenario(newcomer: bool, how: Rewrite) {
    let name = "rewrite";
    let mut servers = servers(3).await;
    let (proxy, red_nodes) = node_2_behind_a_proxy(&servers).await;
    let first = fenced(&client(), &red_nodes, name);
    let before = fenced_grant(&first, PATIENCE, "all up").await;
    proxy.black_hole();
    let sealed = fenced_grant(&first, PATIENCE, "node 2 cut off").await;
    let key = protocol::token_key(name);
    match how {
        Rewrite::DelIncr => {
            run::<()>(&servers[0].url(), redis::cmd("DEL").arg(&key))
                .await
                .unwrap();
            let one: u64 = run(&servers[0].url(), redis::cmd("INCR").arg(&key))
                .await
                .unwrap();
            assert_eq!(one, 1);
        }
        Rewrite::SetBefore => {
            run::<()>(&servers[0].url(), redis::cmd("SET").arg(&key).arg(before))
                .await
                .unwrap();
        }
    }
    servers[1].kill().await.unwrap();
    proxy.restore();
    let token = if newcomer {
        let other = fenced(&client(), &red_nodes, name);
        fenced_grant(&other, PATIENCE, "node 1 dead, node 0 rewritten").await
    } else {
        fenced_grant(&first, PATIENCE, "node 1 dead, node 0 rewritten").await
    };
    assert!(
        token > sealed,
        "token {token} handed out after {sealed} (before {before})"
    );
}

#[tokio::test]
async fn a_counter_deleted_and_incremented_is_no_witness_for_a_newcomer() {
    rewrite_scenario(true, Rewrite::DelIncr).await;
}

#[tokio::test]
async fn a_counter_deleted_and_incremented_is_no_witness_for_its_client() {
    rewrite_scenario(false, Rewrite::DelIncr).await;
}

#[tokio::test]
async fn a_counter_set_back_is_no_witness_for_a_newcomer() {
    rewrite_scenario(true, Rewrite::SetBefore).await;
}

#[tokio::test]
async fn a_counter_set_back_is_no_witness_for_its_client() {
    rewrite_scenario(false, Rewrite::SetBefore).await;
}
