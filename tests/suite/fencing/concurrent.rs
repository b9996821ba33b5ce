//! Two settlements of one counter at once. Each client reaches one node at
//! once and another 100 ms late each way, the other way round for the
//! other client; the third node is dead. Each settlement's read raises its
//! fast node to its guess g, then reads its slow node after the rival's
//! read raised it to g: both settle g + 1, and each seal used to count the
//! rival's raise to g + 1 as its own. One token, handed out twice (an
//! adversarial audit reproduced it every time). A seal now counts only the
//! nodes it raised to the token itself: at the node the two quorums share,
//! only one of them can.

use std::time::Duration;

use super::{LEASE, fenced, fenced_grant};
use crate::common::*;
use multilock::RedLock;
use multilock_testkit::{Delay, Direction, RedisProcess, TcpProxy, TestServer};

/// How late the slow node answers, each way.
const LATE: Duration = Duration::from_millis(100);

/// Two fenced RedLocks of `names` on the three `servers`, each client
/// reaching one node [`LATE`] (0 for the first, 1 for the second): after a
/// grant of each with all up, node 2 dies and the delays begin.
async fn crossed(
    servers: &mut [RedisProcess],
    names: [&str; 2],
) -> (RedLock, RedLock, TcpProxy, TcpProxy) {
    let late_1 = TcpProxy::start(servers[1].port()).await.unwrap();
    let late_0 = TcpProxy::start(servers[0].port()).await.unwrap();
    let slow = Duration::from_millis(500);
    let a_nodes = vec![
        node(&servers[0]),
        node_at(&late_1.url(), slow),
        node(&servers[2]),
    ];
    let b_nodes = vec![
        node_at(&late_0.url(), slow),
        node(&servers[1]),
        node(&servers[2]),
    ];
    let a = fenced(&client(), &a_nodes, names[0]);
    let b = fenced(&client(), &b_nodes, names[1]);
    let first = fenced_grant(&a, PATIENCE, "A, all up").await;
    let second = fenced_grant(&b, PATIENCE, "B, all up").await;
    assert!(second > first, "one counter: {second} after {first}");
    servers[2].kill().await.unwrap();
    late_1.set_delay(Direction::Both, Delay::fixed(LATE));
    late_0.set_delay(Direction::Both, Delay::fixed(LATE));
    (a, b, late_1, late_0)
}

/// Locks `shared` and `{shared}` are two locks (two hashes) with one
/// counter (`redisson_lock_token:{shared}`, Redisson's key naming): held
/// at once, legitimately, they settle over one counter. Both are granted,
/// with two tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_locks_sharing_a_counter_hand_out_two_tokens() {
    let mut servers = servers(3).await;
    let (a, b, _late_1, _late_0) = crossed(&mut servers, ["shared", "{shared}"]).await;
    let (a, b) = tokio::join!(
        a.try_lock_for(PATIENCE, Some(LEASE)),
        b.try_lock_for(PATIENCE, Some(LEASE))
    );
    let (a, b) = (
        a.unwrap().expect("A granted"),
        b.unwrap().expect("B granted"),
    );
    let (ta, tb) = (a.fencing_token().unwrap(), b.fencing_token().unwrap());
    assert_ne!(ta, tb, "one token handed out twice");
}

/// Two holders of one name at once: the fast grants of both (A's on node
/// 0, B's on node 1) are lost as soon as they land, as a restart without
/// persistence would lose them, before the slow ones land. Whoever is
/// granted, no token is handed out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_holders_at_once_never_share_a_token() {
    const NAME: &str = "crossed";
    let mut servers = servers(3).await;
    let (a, b, _late_1, _late_0) = crossed(&mut servers, [NAME, NAME]).await;
    let (u0, u1) = (servers[0].url(), servers[1].url());
    let lose_holds = async {
        eventually(
            LATE / 2,
            |_: &()| "the fast grants did not land".into(),
            || async {
                match exists(&u0, NAME).await && exists(&u1, NAME).await {
                    true => Ok(()),
                    false => Err(()),
                }
            },
        )
        .await;
        run::<()>(&u0, redis::cmd("DEL").arg(NAME)).await.unwrap();
        run::<()>(&u1, redis::cmd("DEL").arg(NAME)).await.unwrap();
    };
    let (a, b, ()) = tokio::join!(
        a.try_lock_for(PATIENCE, Some(LEASE)),
        b.try_lock_for(PATIENCE, Some(LEASE)),
        lose_holds
    );
    // Either may also lose the rest of its wait to the other's hold.
    let tokens: Vec<u64> = [a, b]
        .into_iter()
        .filter_map(|outcome| outcome.ok().flatten())
        .map(|guard| guard.fencing_token().unwrap())
        .collect();
    assert!(!tokens.is_empty(), "neither was granted");
    if let [ta, tb] = tokens[..] {
        assert_ne!(ta, tb, "two holders at once, one token");
    }
}
