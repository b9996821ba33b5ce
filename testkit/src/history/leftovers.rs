//! The end check: what a run left on its nodes. Every lock kind's keys are
//! looked for: the lock's hash, a fair lock's queue and deadlines, and the
//! read holds' timeout keys of a read-write lock.

use std::fmt;
use std::io;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::{PollLimit, redisson_fair};

/// A lock's key found on a node at the end of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// The node's URL.
    pub node: String,
    /// The lock's name.
    pub name: String,
    /// The key found: the lock's hash (the name itself), or one of the keys
    /// of its kind (a fair lock's queue or deadlines, a read hold's
    /// timeout key).
    pub key: String,
    /// What it holds: the hash's fields (`<client-uuid>:<owner>`) and hold
    /// counts; a queue's fields (and empty values); the deadlines' fields
    /// and scores; a timeout key's value.
    pub fields: Vec<(String, String)>,
    /// The key's remaining TTL; `None` when it has none.
    pub ttl: Option<Duration>,
}

impl fmt::Display for Leftover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|(field, value)| {
                if value.is_empty() {
                    field.clone()
                } else {
                    format!("{field}={value}")
                }
            })
            .collect();
        if self.key == self.name {
            write!(f, "lock key {:?}", self.name)?;
        } else {
            write!(f, "key {:?} of lock {:?}", self.key, self.name)?;
        }
        write!(
            f,
            " left on {} (holding [{}], ",
            self.node,
            fields.join(", ")
        )?;
        match self.ttl {
            Some(ttl) => write!(f, "TTL {ttl:.1?})"),
            None => write!(f, "no TTL)"),
        }
    }
}

/// The keys of the locks `names` still present on any of the nodes at
/// `urls` (each lock's hash, fair queue, deadlines and read timeout keys):
/// polls every 20 ms until none remains or `settle` has passed (background
/// releases and rollbacks may still be under way), and returns what
/// remains then; empty when every key is gone.
///
/// Give it less time than the shortest lease used, or key expiry does the
/// releases' work and hides what they left.
///
/// # Errors
///
/// When a node cannot be reached or answers with an error.
///
/// # Cancel safety
///
/// Cancel safe: read only.
pub async fn leftover_keys(
    urls: &[String],
    names: &[String],
    settle: Duration,
) -> io::Result<Vec<Leftover>> {
    let mut connections = connect_all(urls).await?;
    let poll = PollLimit::new(settle);
    loop {
        let mut found = Vec::new();
        for (url, connection) in &mut connections {
            for name in names {
                found.extend(
                    keys_of(connection, name)
                        .await
                        .map_err(io::Error::other)?
                        .into_iter()
                        .map(|(key, fields, ttl)| Leftover {
                            node: (*url).clone(),
                            name: name.clone(),
                            key,
                            fields,
                            ttl,
                        }),
                );
            }
        }
        if found.is_empty() || poll.is_spent() {
            return Ok(found);
        }
        poll.tick(String::new).await?;
    }
}

type Found = Vec<(String, Vec<(String, String)>, Option<Duration>)>;

/// One connection to each of `urls`, with its URL: what an end check of
/// the nodes' keys reads through.
///
/// # Errors
///
/// When a node cannot be reached.
pub async fn connect_all(urls: &[String]) -> io::Result<Vec<(&String, MultiplexedConnection)>> {
    let mut connections = Vec::with_capacity(urls.len());
    for url in urls {
        let connection = redis::Client::open(url.as_str())
            .map_err(io::Error::other)?
            .get_multiplexed_async_connection()
            .await
            .map_err(io::Error::other)?;
        connections.push((url, connection));
    }
    Ok(connections)
}

/// The keys of a node matching `pattern` (every key: `None`), by a whole
/// `SCAN`: what an end check looks for leftovers with.
///
/// # Errors
///
/// When the node fails the scan.
pub async fn scan_keys(
    connection: &mut MultiplexedConnection,
    pattern: Option<&str>,
) -> redis::RedisResult<Vec<String>> {
    let mut scan = redis::cmd("SCAN");
    scan.cursor_arg(0);
    if let Some(pattern) = pattern {
        scan.arg("MATCH").arg(pattern);
    }
    scan.arg("COUNT").arg(1000);
    let mut iter: redis::AsyncIter<String> = scan.iter_async(connection).await?;
    let mut keys = Vec::new();
    while let Some(key) = iter.next_item().await {
        keys.push(key?);
    }
    Ok(keys)
}

/// Every key of lock `name` on one node, with its content and TTL.
async fn keys_of(connection: &mut MultiplexedConnection, name: &str) -> redis::RedisResult<Found> {
    let (queue, deadlines) = (redisson_fair::queue(name), redisson_fair::timeouts(name));
    #[allow(clippy::type_complexity)]
    let (hash, hash_ttl, queued, queue_ttl, scored, deadlines_ttl): (
        Vec<(String, String)>,
        i64,
        Vec<String>,
        i64,
        Vec<(String, String)>,
        i64,
    ) = redis::pipe()
        .hgetall(name)
        .pttl(name)
        .lrange(&queue, 0, -1)
        .pttl(&queue)
        .zrange_withscores(&deadlines, 0, -1)
        .pttl(&deadlines)
        .query_async(connection)
        .await?;
    let mut found = Found::new();
    let mut keep = |key: &str, fields: Vec<(String, String)>, ttl_ms: i64| {
        if ttl_ms != -2 {
            found.push((key.to_owned(), fields, ttl(ttl_ms)));
        }
    };
    keep(name, hash, hash_ttl);
    let queued = queued.into_iter().map(|f| (f, String::new())).collect();
    keep(&queue, queued, queue_ttl);
    keep(&deadlines, scored, deadlines_ttl);
    // Read holds' timeout keys: `{name}:<field>:rwlock_timeout:<n>`.
    let tagged = if name.contains('{') {
        name.to_owned()
    } else {
        format!("{{{name}}}")
    };
    let pattern = format!("{}:*:rwlock_timeout:*", glob_escaped(&tagged));
    for key in scan_keys(connection, Some(&pattern)).await? {
        let (value, ttl_ms): (Option<String>, i64) = redis::pipe()
            .get(&key)
            .pttl(&key)
            .query_async(connection)
            .await?;
        if ttl_ms != -2 {
            found.push((
                key,
                vec![(value.unwrap_or_default(), String::new())],
                ttl(ttl_ms),
            ));
        }
    }
    Ok(found)
}

fn ttl(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// `text` with the glob characters of `SCAN MATCH` escaped.
fn glob_escaped(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}
