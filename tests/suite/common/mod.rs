//! Shared helpers of the integration tests: real redis-server processes
//! from the test kit, and raw connections to inspect what is on the server.
#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Duration;

use multilock::testkit::{RedisProcess, TestServer};
use multilock::{Client, Node};

pub const WATCHDOG: Duration = Duration::from_secs(1);

pub async fn server() -> RedisProcess {
    RedisProcess::start().await.expect("start redis-server")
}

pub async fn servers(n: usize) -> Vec<RedisProcess> {
    RedisProcess::start_many(n)
        .await
        .expect("start redis-servers")
}

pub fn node(server: &RedisProcess) -> Node {
    Node::builder(server.url())
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

pub fn client() -> Client {
    Client::builder()
        .watchdog_timeout(WATCHDOG)
        .build()
        .unwrap()
}

/// A plain connection for looking at the server directly.
pub async fn raw(server: &RedisProcess) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

pub async fn exists(server: &RedisProcess, key: &str) -> bool {
    let mut conn = raw(server).await;
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<bool>(&mut conn)
        .await
        .unwrap()
}

/// `INFO commandstats` as command -> calls.
pub async fn command_calls(server: &RedisProcess) -> HashMap<String, u64> {
    let mut conn = raw(server).await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// Calls per command between two snapshots, nonzero only.
pub fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> HashMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Read, sleep, write: an increment that loses updates if two holders
/// ever overlap. The counter the contention tests guard with a lock.
pub async fn increment_unsafely(conn: &mut redis::aio::MultiplexedConnection) {
    let value: Option<u64> = redis::cmd("GET")
        .arg("counter")
        .query_async(conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    redis::cmd("SET")
        .arg("counter")
        .arg(value.unwrap_or(0) + 1)
        .query_async::<()>(conn)
        .await
        .unwrap();
}

/// A task that, `rounds` times, takes `lock` (with `lease`, or under the
/// watchdog), bumps the counter on `counter_url` unsafely, and releases.
pub fn spawn_counter_task<L: multilock::DistributedLock>(
    lock: L,
    counter_url: String,
    rounds: usize,
    lease: Option<Duration>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut conn = redis::Client::open(counter_url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        for _ in 0..rounds {
            let guard = match lease {
                Some(lease) => lock.lock_with_lease(lease).await,
                None => lock.lock().await,
            }
            .unwrap();
            increment_unsafely(&mut conn).await;
            guard.unlock().await.unwrap();
        }
    })
}

pub async fn counter(server: &RedisProcess) -> u64 {
    let mut conn = raw(server).await;
    redis::cmd("GET")
        .arg("counter")
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// A raw subscription to `channel`, as a Java client's would be.
pub async fn subscribe_raw(
    server: &RedisProcess,
    channel: &str,
) -> impl futures::Stream<Item = redis::Msg> {
    let mut pubsub = redis::Client::open(server.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    pubsub.subscribe(channel).await.unwrap();
    pubsub.into_on_message()
}

/// Takes `lock` within `wait` (with a short lease) and releases it: proof
/// that nobody else holds it any more. Panics with `why` otherwise.
pub async fn take_and_release<L: multilock::DistributedLock>(lock: &L, wait: Duration, why: &str) {
    lock.try_lock_for(wait, Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("not free: {why}"))
        .unlock()
        .await
        .unwrap();
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

pub async fn server_url_of(server: &RedisProcess) -> String {
    server.url()
}

/// Waits (up to 5 s) until `count` connections listen on the unlock channel
/// of lock `name` on `server`: a waiter has subscribed, or (0) has left.
pub async fn wait_for_listeners(server: &RedisProcess, name: &str, count: u64) {
    let mut conn = raw(server).await;
    let channel = format!("redisson_lock__channel:{{{name}}}");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, listeners): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut conn)
            .await
            .unwrap();
        if listeners == count {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{listeners} listeners on {channel} at {}, expected {count}",
            server.url()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
