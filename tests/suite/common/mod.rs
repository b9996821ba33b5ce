//! The suite's toolbox: servers and clients to test with, raw looks at a
//! server by its URL, and polls with a deadline (the kit's `poll_until`)
//! for what the tests wait on instead of sleeping.
//!
//! Two clients, one per purpose: [`client`] renews every second, for tests
//! about renewal; [`long_lease_client`] sets leases of a minute, for tests
//! whose oracle waits (at most [`PATIENCE`]) for a key to disappear: such a
//! key can only go in time through the mechanism under test, never by
//! expiring on its own.

mod monitor;

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use multilock::{Client, Guard, Lock, Node};
use multilock_testkit::{RedisProcess, TestServer, poll_until, protocol};

pub use monitor::monitor;

/// The watchdog timeout of [`client`]: renewals every third of it.
pub const WATCHDOG: Duration = Duration::from_secs(1);

/// The lease of [`long_lease_client`], and the lease of a holder whose
/// waiters must be woken by pub/sub: a key with it outlives every oracle.
pub const LONG_LEASE: Duration = Duration::from_secs(60);

/// How long an oracle waits for a mechanism (a rollback, a background
/// release, a wake-up) to show: generous on a loaded machine, and far below
/// [`LONG_LEASE`], the time the key would need to expire on its own.
pub const PATIENCE: Duration = Duration::from_secs(5);

pub async fn server() -> RedisProcess {
    RedisProcess::start().await.expect("start redis-server")
}

pub async fn servers(n: usize) -> Vec<RedisProcess> {
    RedisProcess::start_many(n)
        .await
        .expect("start redis-servers")
}

/// A node at `url` with `timeout` for connecting and for each reply.
pub fn node_at(url: &str, timeout: Duration) -> Node {
    Node::builder(url)
        .connect_timeout(timeout)
        .response_timeout(timeout)
        .build()
        .unwrap()
}

/// The node of a test server, with 500 ms timeouts.
pub fn node(server: &impl TestServer) -> Node {
    node_at(&server.url(), Duration::from_millis(500))
}

/// `host:port` of a test server, as errors and guards name a node.
pub fn addr(server: &impl TestServer) -> String {
    server.url().trim_start_matches("redis://").to_owned()
}

pub fn client_with_watchdog(timeout: Duration) -> Client {
    Client::builder().watchdog_timeout(timeout).build().unwrap()
}

/// Renews every third of [`WATCHDOG`]: for tests of renewal and `lost()`.
pub fn client() -> Client {
    client_with_watchdog(WATCHDOG)
}

/// Its watchdog sets [`LONG_LEASE`]: a hold it leaves behind outlives every
/// oracle, so only a release or a rollback frees the lock in time.
pub fn long_lease_client() -> Client {
    client_with_watchdog(LONG_LEASE)
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// The formatted log lines of one thread, collected while the guard that
/// [`Captured::install`] returns lives. Spawned tasks log on the thread
/// that runs them: run the test on a [`current_thread_runtime`] built
/// there.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Captured {
    /// Collects the events `filter` lets through (`multilock=info`, say)
    /// on this thread, until the returned guard is dropped.
    pub fn install(filter: &str) -> (Captured, tracing::subscriber::DefaultGuard) {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(captured.clone())
            .with_ansi(false)
            .finish();
        (
            captured.clone(),
            tracing::subscriber::set_default(subscriber),
        )
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The lines that contain `needle`.
    pub fn lines(&self, needle: &str) -> Vec<String> {
        let text = self.text();
        text.lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    pub fn count(&self, needle: &str) -> usize {
        self.lines(needle).len()
    }
}

/// A plain connection to `url`, for looking at the server directly.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|err| panic!("cannot connect to {url}: {err}"))
}

/// One command on a fresh connection to `url`, bounded by 2 s: a paused or
/// partitioned server makes it fail instead of hang.
pub async fn run<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let attempt = async {
        let mut conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        cmd.query_async::<T>(&mut conn).await
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .unwrap_or_else(|_| {
            Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no reply within 2 s",
            )))
        })
}

/// Seals lock `name`'s fencing counter at `url` at `value` (a missing one
/// is created): vouched for, as a seal leaves it, so a settlement takes it
/// as a witness. (A counter set by hand alone proves nothing.)
pub async fn set_sealed_counter(url: &str, name: &str, value: u64) {
    let _: (i64, i64, u8) = eval(url, protocol::raise_token(name, value)).await;
}

/// One script call on a fresh connection to `url`.
pub async fn eval<T: redis::FromRedisValue>(
    url: &str,
    call: redis::ScriptInvocation<'static>,
) -> T {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    call.invoke_async(&mut conn).await.unwrap()
}

/// The `run_id` of the server at `url` now.
pub async fn run_id(url: &str) -> String {
    info_field(url, "server", "run_id").await
}

/// Field `field` of section `section` of `INFO` on the server at `url`
/// (empty when it does not report it).
pub async fn info_field(url: &str, section: &str, field: &str) -> String {
    try_info_field(url, section, field).await.unwrap()
}

/// [`info_field`], or why `INFO` got no answer: for a server that may cut
/// its clients meanwhile (a Sentinel demoting a primary kills them).
pub async fn try_info_field(url: &str, section: &str, field: &str) -> redis::RedisResult<String> {
    let info: String = run(url, redis::cmd("INFO").arg(section)).await?;
    let value = info
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .unwrap_or_default();
    Ok(value.trim().to_owned())
}

/// Whether the server at `url` has sharded pub/sub (Redis 7+; Valkey says
/// `redis_version:7.2.4`): on Redis 6.2 (`MULTILOCK_REDIS_SERVER`) a
/// Cluster's `Auto` mode publishes and subscribes the classic way.
pub async fn has_sharded_pubsub(url: &str) -> bool {
    let version = info_field(url, "server", "redis_version").await;
    version
        .split('.')
        .next()
        .and_then(|major| major.parse::<u32>().ok())
        >= Some(7)
}

pub async fn exists(url: &str, key: &str) -> bool {
    run(url, redis::cmd("EXISTS").arg(key))
        .await
        .unwrap_or_else(|err| panic!("EXISTS {key} on {url}: {err}"))
}

/// Checks `check` every 20 ms until it yields a value, for at most
/// `limit`; panics saying `what` (called with what `check` saw last)
/// otherwise.
pub async fn eventually<S, T, F, Fut>(
    limit: Duration,
    what: impl Fn(&S) -> String,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, S>>,
{
    let last: &RefCell<Option<S>> = &RefCell::new(None);
    poll_until(
        limit,
        // Called only after a check failed: `last` is set.
        || what(last.borrow().as_ref().expect("checked at least once")),
        || {
            let attempt = check();
            async move {
                match attempt.await {
                    Ok(value) => Some(value),
                    Err(seen) => {
                        *last.borrow_mut() = Some(seen);
                        None
                    }
                }
            }
        },
    )
    .await
    .unwrap_or_else(|err| panic!("{err}"))
}

/// The PTTL of `key` on `url` (-2: no such key, -1: no expiry).
pub async fn pttl(url: &str, key: &str) -> i64 {
    run(url, redis::cmd("PTTL").arg(key)).await.unwrap()
}

/// Waits (at most `limit`) until `key` is gone from `url`.
pub async fn wait_absent(url: &str, key: &str, limit: Duration, why: &str) {
    eventually(
        limit,
        |_: &()| format!("{why}: {key} still on {url}"),
        || async {
            if exists(url, key).await {
                Err(())
            } else {
                Ok(())
            }
        },
    )
    .await
}

/// Waits (at most [`PATIENCE`]) until `count` connections listen on the
/// unlock channel of lock `name` at `url`: a waiter has subscribed (all
/// waiters of a node share one connection), or (0) every one has left.
pub async fn wait_for_listeners(url: &str, name: &str, count: u64) {
    wait_for_channel_listeners(url, &protocol::channel(name), count).await;
}

/// Waits (at most [`PATIENCE`]) until `count` connections listen on
/// `channel` at `url`.
pub async fn wait_for_channel_listeners(url: &str, channel: &str, count: u64) {
    let conn = raw(url).await;
    eventually(
        PATIENCE,
        |seen| format!("{seen} listeners on {channel} at {url}, expected {count}"),
        || async {
            let (_, listeners): (String, u64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(channel)
                .query_async(&mut conn.clone())
                .await
                .unwrap();
            if listeners == count {
                Ok(())
            } else {
                Err(listeners)
            }
        },
    )
    .await
}

/// The Lua source and the SHA of the crate's script `name` (one of
/// `protocol::scripts`), to recognize its calls on MONITOR.
pub fn script(name: &str) -> (&'static str, String) {
    protocol::scripts()
        .into_iter()
        .find(|(script, _, _)| *script == name)
        .map(|(_, source, sha)| (source, sha))
        .unwrap_or_else(|| panic!("no script {name}"))
}

/// Takes `lock` (nobody else holds it) with [`LONG_LEASE`] once its node
/// answers again after a restart, within [`PATIENCE`]; until then every
/// attempt must fail as the node being unavailable.
pub async fn lock_once_back(lock: &Lock, what: &str) -> Guard {
    eventually(
        PATIENCE,
        |err| format!("{what}: still failing after the restart: {err}"),
        || async {
            match lock.try_lock_for(Duration::ZERO, Some(LONG_LEASE)).await {
                Ok(Some(guard)) => Ok(guard),
                Ok(None) => panic!("{what}: nobody else holds it"),
                Err(err) => {
                    assert!(err.is_node_unavailable(), "{err:?}");
                    Err(err)
                }
            }
        },
    )
    .await
}

/// Waits until `node` reports [`Health::Healthy`], within [`PATIENCE`]: its
/// probe (or a request) got an answer.
pub async fn wait_healthy(node: &Node) {
    eventually(
        PATIENCE,
        |health: &multilock::Health| format!("{} still {health:?}", node.addr()),
        || async {
            match node.health() {
                multilock::Health::Healthy => Ok(()),
                health => Err(health),
            }
        },
    )
    .await;
}

/// `INFO commandstats` of `url` as command -> calls.
pub async fn command_calls(url: &str) -> HashMap<String, u64> {
    let info: String = run(url, redis::cmd("INFO").arg("commandstats"))
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
async fn increment_unsafely(conn: &mut redis::aio::MultiplexedConnection) {
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
///
/// On a loaded machine an unlock may be left unconfirmed, as documented: a
/// node that timed out once is suspect for a moment, so its release is
/// not sent at once but in the background, once the node is back, and
/// the unlock reports `NoQuorum` or `NodeUnavailable`. The lock stays
/// taken there meanwhile, so the counter still proves exclusion; the task
/// then waits (at most [`PATIENCE`]) until its hold is gone from every
/// server of `holds.urls`. Give `lock` a lease longer than that (a
/// `long_lease_client`'s watchdog), or the TTL would do the work.
/// `NotHeld` or a permanent error fails the task.
pub fn spawn_counter_task<L: multilock::DistributedLock>(
    lock: L,
    counter_url: String,
    rounds: usize,
    lease: Option<Duration>,
    holds: Holds,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut conn = raw(&counter_url).await;
        for _ in 0..rounds {
            let guard = match lease {
                Some(lease) => lock.lock_with_lease(lease).await,
                None => lock.lock().await,
            }
            .unwrap();
            increment_unsafely(&mut conn).await;
            let name = guard.name().to_owned();
            let field = format!("{}:{}", holds.client_id, guard.owner().as_str());
            match guard.unlock().await {
                Ok(()) => {}
                Err(err @ multilock::Error::NotHeld { .. }) => panic!("unlock: {err}"),
                Err(err) if err.is_permanent() => panic!("unlock: {err}"),
                Err(err) => holds.wait_until_released(&name, &field, &err).await,
            }
        }
    })
}

/// Waits for every [`spawn_counter_task`], failing as soon as one fails:
/// the others may be waiting for a lock its failure left taken.
pub async fn join_counter_tasks(tasks: Vec<tokio::task::JoinHandle<()>>) {
    if let Err(err) = futures::future::try_join_all(tasks).await {
        match err.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(err) => panic!("a counter task did not finish: {err}"),
        }
    }
}

/// Where a [`spawn_counter_task`]'s holds live: its client's id (the
/// first part of every hash field it writes) and the servers of the lock.
#[derive(Clone)]
pub struct Holds {
    client_id: String,
    urls: Vec<String>,
}

impl Holds {
    /// The holds of `client` on `servers`.
    pub fn of(client: &Client, servers: &[RedisProcess]) -> Holds {
        Holds {
            client_id: client.id().to_owned(),
            urls: servers.iter().map(RedisProcess::url).collect(),
        }
    }

    /// Waits (at most [`PATIENCE`]) until no server holds `field` of
    /// `name`: a release left to the background after `unconfirmed`.
    async fn wait_until_released(&self, name: &str, field: &str, unconfirmed: &multilock::Error) {
        // `poll_until`, not `eventually`: this runs in a spawned task.
        poll_until(
            PATIENCE,
            || format!("unlock left unconfirmed ({unconfirmed}): {field} of {name} still held"),
            || async {
                for url in &self.urls {
                    let held: bool = run(url, redis::cmd("HEXISTS").arg(name).arg(field))
                        .await
                        .unwrap();
                    if held {
                        return None;
                    }
                }
                Some(())
            },
        )
        .await
        .unwrap_or_else(|err| panic!("{err}"))
    }
}

/// The counter [`spawn_counter_task`] bumps.
pub async fn counter(url: &str) -> u64 {
    run(url, redis::cmd("GET").arg("counter")).await.unwrap()
}

/// A server that accepts `DEBUG SLEEP` (Redis 7 refuses DEBUG by default).
pub async fn debuggable_server() -> RedisProcess {
    RedisProcess::start_with_args(|_| vec!["--enable-debug-command".into(), "yes".into()])
        .await
        .unwrap()
}

/// Freezes `server` for `seconds` from another connection; returns once the
/// server is asleep (a PING on a third connection no longer answers).
pub async fn debug_sleep(server: &RedisProcess, seconds: f64) -> tokio::task::JoinHandle<()> {
    // No response timeout: the reply comes when the sleep ends.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let sleeper = tokio::spawn(async move {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(seconds)
            .query_async::<()>(&mut admin)
            .await
            .expect("DEBUG SLEEP");
    });
    let probe = multilock_testkit::PollLimit::new(Duration::from_secs(5));
    loop {
        let ping = async {
            let mut conn = raw(&server.url()).await;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        if tokio::time::timeout(Duration::from_millis(100), ping)
            .await
            .is_err()
        {
            break;
        }
        probe
            .tick(|| "the server never fell asleep".into())
            .await
            .unwrap();
    }
    sleeper
}

/// A raw subscription to `channel`, as a Java client's would be.
pub async fn subscribe_raw(
    url: &str,
    channel: &str,
) -> impl futures::Stream<Item = redis::Msg> + use<> {
    let mut pubsub = redis::Client::open(url)
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
        .unwrap_or_else(|| panic!("not free within {wait:?}: {why}"))
        .unlock()
        .await
        .unwrap();
}

/// Script calls (EVALSHA and EVAL: every lock request) so far at `url`.
pub async fn script_calls(url: &str) -> u64 {
    let calls = command_calls(url).await;
    ["evalsha", "eval"]
        .iter()
        .map(|c| calls.get(*c).copied().unwrap_or(0))
        .sum()
}

/// Waits (at most `limit`) until `url` ran `at_least` more script calls
/// than `since` (a count from [`script_calls`]): renewals, or a waiter's
/// rounds, seen on the server.
pub async fn wait_for_script_calls(url: &str, since: u64, at_least: u64, limit: Duration) {
    eventually(
        limit,
        |calls: &u64| format!("{calls} script calls on {url}, waiting for {at_least}"),
        || async {
            let calls = script_calls(url).await - since;
            if calls >= at_least {
                Ok(())
            } else {
                Err(calls)
            }
        },
    )
    .await;
}

/// A runtime of its own, for tests of a node or client that outlives one.
pub fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The wall clock in microseconds since the Unix epoch: what a fencing
/// token from the wall-clock floor is at least, when taken after now.
pub fn wall_clock_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[cfg(feature = "tls")]
/// A free loopback port, not reserved: a server started on it exits if
/// another program took it first, and its start is tried again.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[cfg(feature = "tls")]
/// A self-signed certificate and its key for `localhost`, made by
/// `openssl` in `dir`, valid a day: `(cert, key)`.
pub fn self_signed_cert(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    (cert, key)
}
