//! Fencing counters of multi-node locks (and their vouches) expire after
//! an idle time, renewed by every grant, so names used once do not pile
//! up; a name whose counters expired goes on above its old tokens.

use std::time::Duration;

use super::{fenced, fenced_grant, nodes};
use crate::common::*;
use multilock::{Client, DEFAULT_FENCING_COUNTER_EXPIRY};
use multilock_testkit::{TestServer, protocol};

fn client_expiring_after(expiry: Option<Duration>) -> Client {
    Client::builder()
        .watchdog_timeout(WATCHDOG)
        .fencing_counter_expiry(expiry)
        .build()
        .unwrap()
}

/// The counter's and its vouch's PTTL on each server (-1: no expiry, -2:
/// none), in that order.
async fn counter_ttls(servers: &[multilock_testkit::RedisProcess], name: &str) -> Vec<i64> {
    let mut ttls = Vec::new();
    for key in [protocol::token_key(name), protocol::token_vouch_key(name)] {
        for server in servers {
            ttls.push(pttl(&server.url(), &key).await);
        }
    }
    ttls
}

/// By default a counter lives 30 days past the last grant of its name;
/// `None` keeps it for ever, as Redisson does; a grant renews it.
#[tokio::test]
async fn counters_expire_after_the_configured_idle_time() {
    let servers = servers(3).await;
    let nodes = nodes(&servers);
    let month = DEFAULT_FENCING_COUNTER_EXPIRY.as_millis() as i64;
    fenced_grant(&fenced(&client(), &nodes, "default"), PATIENCE, "default").await;
    for ttl in counter_ttls(&servers, "default").await {
        assert!(
            ttl > month - 60_000 && ttl <= month,
            "PTTL {ttl}, not 30 days"
        );
    }
    let forever = client_expiring_after(None);
    fenced_grant(&fenced(&forever, &nodes, "forever"), PATIENCE, "never").await;
    assert_eq!(counter_ttls(&servers, "forever").await, [-1; 6]);

    let hour = client_expiring_after(Some(Duration::from_secs(3600)));
    let red = fenced(&hour, &nodes, "renewed");
    fenced_grant(&red, PATIENCE, "first").await;
    for server in &servers {
        for key in [
            protocol::token_key("renewed"),
            protocol::token_vouch_key("renewed"),
        ] {
            run::<()>(&server.url(), redis::cmd("PEXPIRE").arg(&key).arg(60_000))
                .await
                .unwrap();
        }
    }
    fenced_grant(&red, PATIENCE, "second").await;
    for ttl in counter_ttls(&servers, "renewed").await {
        assert!(ttl > 3_500_000, "PTTL {ttl}: the grant did not renew it");
    }
}

/// A client that keeps counters for ever clears the expiry another client
/// (with the default) left on them: a counter it uses never expires.
#[tokio::test]
async fn a_client_that_never_expires_counters_clears_an_expiry_left_on_them() {
    let servers = servers(3).await;
    let nodes = nodes(&servers);
    fenced_grant(&fenced(&client(), &nodes, "mixed"), PATIENCE, "default").await;
    let forever = client_expiring_after(None);
    fenced_grant(&fenced(&forever, &nodes, "mixed"), PATIENCE, "never").await;
    assert_eq!(counter_ttls(&servers, "mixed").await, [-1; 6]);
}

/// Counters gone with their expiry: the name's next token is above every
/// token it had (the wall-clock floor), not 1.
#[tokio::test]
async fn a_name_whose_counters_expired_goes_on_above_its_old_tokens() {
    let servers = servers(3).await;
    let nodes = nodes(&servers);
    let client = client_expiring_after(Some(Duration::from_secs(1)));
    let red = fenced(&client, &nodes, "expiring");
    let mut last = 0;
    for _ in 0..3 {
        last = fenced_grant(&red, PATIENCE, "before expiry").await;
    }
    for server in &servers {
        wait_absent(
            &server.url(),
            &protocol::token_key("expiring"),
            PATIENCE,
            "the counter expired",
        )
        .await;
    }
    let token = fenced_grant(&red, PATIENCE, "after expiry").await;
    assert!(token > last, "token {token} after {last}");
}

/// An expiry under a second, or beyond ten years, is refused.
#[test]
fn an_expiry_out_of_bounds_is_refused() {
    for expiry in [Duration::ZERO, Duration::from_millis(999), Duration::MAX] {
        let err = Client::builder()
            .fencing_counter_expiry(Some(expiry))
            .build()
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(&err, multilock::Error::InvalidArgument(msg) if msg.contains("fencing counter expiry")),
            "{expiry:?}: {err:?}"
        );
    }
}
