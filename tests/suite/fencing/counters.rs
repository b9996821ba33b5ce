//! Counters the scripts can raise exactly: Lua numbers are doubles, exact
//! up to 2^53, so a counter past that would round (a token handed out
//! twice, a counter lowered, or rewritten as `1.2e+17`). A counter at the
//! end of that range refuses further grants with a permanent error, and
//! nothing is written.

use super::{LEASE, fenced, fenced_grant, nodes};
use crate::common::*;
use multilock::RedLock;
use multilock_testkit::{RedisProcess, TestServer, protocol};

/// The largest token: 2^53 - 1, the last integer a Lua number holds exactly
/// with its successor's room to compare against.
const LAST_TOKEN: u64 = (1 << 53) - 1;

async fn counter(url: &str, name: &str) -> Option<String> {
    run(url, redis::cmd("GET").arg(protocol::token_key(name)))
        .await
        .unwrap()
}

async fn set_counter(url: &str, name: &str, value: &str) {
    run::<()>(
        url,
        redis::cmd("SET").arg(protocol::token_key(name)).arg(value),
    )
    .await
    .unwrap();
}

/// A single-node fenced lock counts up to the last exact token, each
/// token once, then refuses for good and leaves the counter alone.
#[tokio::test]
async fn a_single_node_counter_stops_at_the_last_exact_token() {
    let server = server().await;
    let url = server.url();
    set_counter(&url, "edge", &(LAST_TOKEN - 2).to_string()).await;
    let lock = client()
        .lock(&node(&server), "edge")
        .unwrap()
        .with_fencing();
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let guard = lock
            .try_lock_for(PATIENCE, Some(LEASE))
            .await
            .unwrap()
            .unwrap();
        tokens.push(guard.fencing_token().unwrap());
        guard.unlock().await.unwrap();
    }
    assert_eq!(tokens, [LAST_TOKEN - 1, LAST_TOKEN]);
    let err = lock
        .try_lock_for(PATIENCE, Some(LEASE))
        .await
        .map(|guard| guard.map(|g| g.fencing_token()))
        .unwrap_err();
    assert!(err.is_permanent(), "{err:?}");
    assert!(
        !exists(&url, "edge").await,
        "refused, yet the lock was taken"
    );
    assert_eq!(counter(&url, "edge").await, Some(LAST_TOKEN.to_string()));
}

/// A RedLock's settlement reaches the last exact token and then refuses,
/// never lowering a counter; counters beyond it (here 18 digits, and
/// 2^53 + 1) are refused as they are, not rewritten.
#[tokio::test]
async fn red_lock_counters_stop_at_the_last_exact_token_and_are_never_rewritten() {
    let servers = servers(3).await;
    let nodes = nodes(&servers);
    let last = LAST_TOKEN.to_string();
    set_counters(&servers, "edge:red", &(LAST_TOKEN - 1).to_string()).await;
    let red = fenced(&client(), &nodes, "edge:red");
    assert_eq!(
        fenced_grant(&red, PATIENCE, "the last token").await,
        LAST_TOKEN
    );
    refused_for_good(&red, "after the last token").await;
    assert_counters(&servers, "edge:red", &last).await;

    for value in ["123456789012345678", "9007199254740993"] {
        let name = format!("beyond:{}", value.len());
        set_counters(&servers, &name, value).await;
        refused_for_good(&fenced(&client(), &nodes, &name), value).await;
        assert_counters(&servers, &name, value).await;
    }
}

async fn set_counters(servers: &[RedisProcess], name: &str, value: &str) {
    for server in servers {
        set_counter(&server.url(), name, value).await;
    }
}

async fn assert_counters(servers: &[RedisProcess], name: &str, value: &str) {
    for server in servers {
        assert_eq!(
            counter(&server.url(), name).await.as_deref(),
            Some(value),
            "{name} on {}",
            server.url()
        );
    }
}

/// `red` ends its wait at once with a permanent error.
async fn refused_for_good(red: &RedLock, why: &str) {
    let refused = red
        .try_lock_for(PATIENCE, Some(LEASE))
        .await
        .map(|g| g.is_some());
    assert!(
        matches!(&refused, Err(err) if err.is_permanent()),
        "{why}: {refused:?}"
    );
}
