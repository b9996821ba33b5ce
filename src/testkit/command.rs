//! The kit's own requests to a server under test: one command with a bound,
//! and waiting until a server answers PING.

use std::io;
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
