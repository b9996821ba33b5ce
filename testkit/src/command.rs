//! The kit's own requests to a server under test: one command with a bound,
//! and waiting until a server answers PING.

use std::io;
use std::net::TcpListener;
use std::time::Duration;

use super::PollLimit;

/// How long one of the kit's own commands may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(5);

/// Runs one command against the server at `url` on a connection of its own,
/// for the kit's checks and replication steps.
///
/// # Errors
///
/// When the server cannot be reached, answers with an error (the message
/// names `url`), or does not answer within 5 s ([`io::ErrorKind::TimedOut`]).
pub(crate) async fn command<T: redis::FromRedisValue>(
    url: &str,
    cmd: &redis::Cmd,
) -> io::Result<T> {
    let client = redis::Client::open(url).map_err(io::Error::other)?;
    let run = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        cmd.query_async::<T>(&mut conn).await
    };
    match tokio::time::timeout(COMMAND_LIMIT, run).await {
        Ok(result) => result.map_err(|err| io::Error::other(format!("{url}: {err}"))),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{url}: no reply within {COMMAND_LIMIT:?}"),
        )),
    }
}

/// Polls PING until the server at `url` answers.
///
/// # Errors
///
/// [`io::ErrorKind::TimedOut`] when it does not answer within `limit`.
pub(crate) async fn wait_until_ready(url: &str, limit: Duration) -> io::Result<()> {
    let client = redis::Client::open(url).map_err(io::Error::other)?;
    let poll = PollLimit::new(limit);
    loop {
        let attempt = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), attempt).await {
            return Ok(());
        }
        poll.tick(|| format!("{url} did not answer PING")).await?;
    }
}

/// Whether a server is a primary or a replica.
///
/// ```no_run
/// # async fn f(c: &multilock_testkit::RedisCluster) -> std::io::Result<()> {
/// assert_eq!(c.nodes()[0].role().await?, multilock_testkit::Role::Primary);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Accepts writes (`role:master`).
    Primary,
    /// Replicates a primary (`role:slave`).
    Replica,
}

/// The role of the server at `url` (`INFO replication`), and for a replica
/// its primary's port and whether its link is up.
pub(super) async fn role(url: &str) -> io::Result<(Role, Option<(u16, bool)>)> {
    let info: String = ask(url, &["INFO", "replication"]).await?;
    let field = |name| info_field(&info, name);
    match field("role") {
        Some("master") => Ok((Role::Primary, None)),
        Some("slave") => {
            let port = field("master_port").and_then(|p| p.parse().ok());
            let up = field("master_link_status") == Some("up");
            Ok((Role::Replica, Some((port.unwrap_or(0), up))))
        }
        other => Err(io::Error::other(format!("{url}: role {other:?}"))),
    }
}

/// Runs the command `args` on the server at `url` ([`command`]).
pub(super) async fn ask<T: redis::FromRedisValue>(url: &str, args: &[&str]) -> io::Result<T> {
    command(url, redis::cmd(args[0]).arg(&args[1..])).await
}

/// A field of an `INFO` or `CLUSTER INFO` reply.
pub(super) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    let mut lines = info.lines();
    lines.find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
}

/// Polls `f` until it succeeds; once `limit` is spent, fails with `what`
/// and the last error of `f` (why the condition was not met).
pub(super) async fn poll_ready<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> io::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = io::Result<T>>,
{
    let poll = PollLimit::new(limit);
    loop {
        match f().await {
            Ok(value) => return Ok(value),
            Err(reason) => poll.tick(|| format!("{what}: {reason}")).await?,
        }
    }
}

/// The URL of a loopback server on `port`.
pub(super) fn url_of(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

/// A free loopback port, not reserved: the server started on it must
/// check that it got it.
pub(super) fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
