//! A primary with one asynchronous replica, on either backend: one type,
//! [`ReplicatedPair<S>`], generic over the backend `S`; the few steps that
//! differ between backends are the [`ReplicaBackend`] trait. The pair's
//! docs say why and how.

use std::io;
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::Duration;

use super::command::command;
use super::{PollLimit, RedisContainer, RedisProcess, TestServer};

/// How long a pair may take to replicate after its start.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// The flags that make a primary sync a (re)connecting replica at once, not
/// after the default 5 s wait for more replicas.
pub(crate) const PRIMARY_FLAGS: [&str; 2] = ["--repl-diskless-sync-delay", "0"];

/// The steps of a [`ReplicatedPair`] that differ between backends: how the
/// two servers start, and how the replication link is cut and restored.
///
/// Implemented by [`RedisProcess`] and [`RedisContainer`] (the table on
/// [`ReplicatedPair`] says what each does), and by
/// [`AnyServer`](super::AnyServer) by dispatch.
pub trait ReplicaBackend: TestServer + Sync {
    /// Starts a primary, then a replica of it that keeps this role across
    /// restarts. Returns once both answer; the link may not be up yet.
    fn start_pair() -> impl Future<Output = io::Result<(Self, Self)>> + Send;

    /// Stops replication from `primary` to `replica`; clients still reach
    /// both.
    fn cut_link(primary: &Self, replica: &mut Self) -> impl Future<Output = io::Result<()>> + Send;

    /// Undoes [`ReplicaBackend::cut_link`]: `replica` replicates `primary`
    /// again (and resynchronises from it if it runs).
    fn restore_link(
        primary: &Self,
        replica: &mut Self,
    ) -> impl Future<Output = io::Result<()>> + Send;
}

/// A primary with one asynchronous replica, without Sentinel: the test
/// plays the failover itself ([`ReplicatedPair::promote`]). The fields are
/// public so tests can inject other faults into either server.
///
/// One type for every backend `S`: [`RedisContainer`] (the default),
/// [`RedisProcess`], or [`AnyServer`](super::AnyServer) for a backend
/// chosen at run time ([`Backend::start_pair`](super::Backend::start_pair)).
/// What differs between backends is small: how the two servers start with
/// the replica pointed at the primary, and how the replication link is cut
/// and restored while clients still reach both servers. Those three steps
/// are the [`ReplicaBackend`] trait. The rest (link status, acknowledged
/// writes, promotion, removal) is the same Redis commands on any backend
/// and is written once, here.
///
/// | step | [`RedisProcess`] | [`RedisContainer`] |
/// |---|---|---|
/// | start | the replica runs with `--replicaof 127.0.0.1 <primary port>` | both servers sit on two networks: clients use side A ([`TestServer::url`]), the replica runs with `--replicaof <primary's side B address> 6379` |
/// | [cut the link](ReplicatedPair::cut_link) | `REPLICAOF` to a loopback port that accepts connections and never answers | the replica leaves side B: a partition of the replication network only |
/// | [restore it](ReplicatedPair::restore_link) | `REPLICAOF` the primary again | the replica rejoins side B |
///
/// On both, the primary syncs a (re)connecting replica at once
/// (`--repl-diskless-sync-delay 0`), and each server keeps its flags
/// across [`TestServer::restart`]: a restarted primary comes back empty
/// and still a primary, a restarted replica comes back a replica of the
/// primary.
///
/// `ReplicatedPair` without a parameter is the container pair, as it has
/// always been. A default parameter takes no part in type inference, so
/// where nothing else says which backend, the call does:
/// `ReplicatedPair::<RedisContainer>::start()`.
///
/// # Examples
///
/// ```no_run
/// use multilock_testkit::{RedisProcess, ReplicatedPair, TestServer};
///
/// # async fn demo() -> std::io::Result<()> {
/// let mut pair = ReplicatedPair::<RedisProcess>::start().await?; // link up, acks flowing
/// pair.cut_link().await?;     // writes to the primary stay there
/// pair.primary.kill().await?; // ... and are lost with it
/// pair.promote().await?;      // the replica takes over, without them
/// let node = multilock::Node::new(&pair.replica.url()).unwrap();
/// pair.rm().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ReplicatedPair<S = RedisContainer> {
    /// The server clients write to.
    pub primary: S,
    /// Replicates the primary until [`ReplicatedPair::cut_link`] or
    /// [`ReplicatedPair::promote`].
    pub replica: S,
}

impl<S: ReplicaBackend> ReplicatedPair<S> {
    /// Starts the primary, then the replica, and waits until replication
    /// is up (`master_link_status:up` on the replica) and the replica
    /// acknowledges writes ([`wait_replica_acks`]).
    ///
    /// # Errors
    ///
    /// As the backend's [`TestServer::start`], or when the link does not
    /// come up, or the replica does not acknowledge a write, within 30 s
    /// each.
    ///
    /// # Cancel safety
    ///
    /// As the backend's [`TestServer::start`]: dropping the future removes
    /// the servers already started.
    pub async fn start() -> io::Result<ReplicatedPair<S>> {
        let (primary, replica) = S::start_pair().await?;
        let pair = ReplicatedPair { primary, replica };
        pair.wait_link_up(READY_LIMIT).await?;
        pair.wait_replica_acks(READY_LIMIT).await?;
        Ok(pair)
    }

    /// Waits until the replica reports its link to the primary up.
    ///
    /// # Errors
    ///
    /// When it is not up within `limit`, or the replica does not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only polls.
    pub async fn wait_link_up(&self, limit: Duration) -> io::Result<()> {
        let poll = PollLimit::new(limit);
        while !self.link_is_up().await? {
            poll.tick(|| format!("replica {} not in sync", self.replica.url()))
                .await?;
        }
        Ok(())
    }

    /// Whether the replica reports `master_link_status:up`. This is what
    /// the replica believes: after a cut over the network (containers) it
    /// notices only at its replication timeout.
    ///
    /// # Errors
    ///
    /// When the replica does not answer within 5 s.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn link_is_up(&self) -> io::Result<bool> {
        let info: String =
            command(&self.replica.url(), redis::cmd("INFO").arg("replication")).await?;
        Ok(info.lines().any(|l| l.trim() == "master_link_status:up"))
    }

    /// Waits until the replica acknowledges writes, so that `WAIT 1` on the
    /// primary counts it: [`wait_replica_acks`] on the primary.
    ///
    /// # Errors
    ///
    /// As [`wait_replica_acks`].
    ///
    /// # Cancel safety
    ///
    /// As [`wait_replica_acks`].
    pub async fn wait_replica_acks(&self, limit: Duration) -> io::Result<()> {
        wait_replica_acks(&self.primary.url(), limit).await
    }

    /// Cuts the replication link: writes to the primary no longer reach the
    /// replica, and clients still reach both.
    ///
    /// # Errors
    ///
    /// When Docker or the replica refuses.
    ///
    /// # Cancel safety
    ///
    /// One request: if dropped, it may or may not have been applied.
    pub async fn cut_link(&mut self) -> io::Result<()> {
        S::cut_link(&self.primary, &mut self.replica).await
    }

    /// Restores the replication link. If the primary still runs, the
    /// replica resynchronises from it.
    ///
    /// # Errors
    ///
    /// When Docker or the replica refuses.
    ///
    /// # Cancel safety
    ///
    /// One request: if dropped, it may or may not have been applied.
    pub async fn restore_link(&mut self) -> io::Result<()> {
        S::restore_link(&self.primary, &mut self.replica).await
    }

    /// The failover: `REPLICAOF NO ONE` on the replica, which becomes a
    /// writable master with the data it had received.
    ///
    /// # Errors
    ///
    /// When the replica does not answer.
    ///
    /// # Cancel safety
    ///
    /// One request: if dropped, it may or may not have been applied.
    pub async fn promote(&mut self) -> io::Result<()> {
        let _: String = command(
            &self.replica.url(),
            redis::cmd("REPLICAOF").arg("NO").arg("ONE"),
        )
        .await?;
        Ok(())
    }

    /// Removes both servers (and, for containers, their networks).
    ///
    /// # Errors
    ///
    /// When a removal fails.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future still removes the servers: their `Drop` does.
    pub async fn rm(self) -> io::Result<()> {
        let replica = self.replica.rm().await;
        let primary = self.primary.rm().await;
        replica.and(primary)
    }
}

impl ReplicaBackend for RedisProcess {
    async fn start_pair() -> io::Result<(RedisProcess, RedisProcess)> {
        let primary = RedisProcess::start_with_args(|_| to_strings(&PRIMARY_FLAGS)).await?;
        let port = primary.port().to_string();
        let replica =
            RedisProcess::start_with_args(|_| to_strings(&["--replicaof", "127.0.0.1", &port]))
                .await?;
        Ok((primary, replica))
    }

    /// Points the replica at a loopback port that accepts connections and
    /// never answers: its handshake hangs as over a partition, and it keeps
    /// the data it has.
    async fn cut_link(_primary: &RedisProcess, replica: &mut RedisProcess) -> io::Result<()> {
        replica_of(replica, black_hole()?).await
    }

    async fn restore_link(primary: &RedisProcess, replica: &mut RedisProcess) -> io::Result<()> {
        replica_of(replica, primary.port()).await
    }
}

fn to_strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// `REPLICAOF 127.0.0.1 <port>` on `replica`.
async fn replica_of(replica: &RedisProcess, port: u16) -> io::Result<()> {
    let _: String = command(
        &replica.url(),
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg(port),
    )
    .await?;
    Ok(())
}

/// A loopback port of this process's own that accepts connections (the
/// kernel does) and never answers them: nothing else can listen there.
fn black_hole() -> io::Result<u16> {
    static BLACK_HOLE: Mutex<Option<TcpListener>> = Mutex::new(None);
    let mut hole = BLACK_HOLE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(listener) = hole.as_ref() {
        return Ok(listener.local_addr()?.port());
    }
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    *hole = Some(listener);
    Ok(port)
}

/// Waits until a replica of the primary at `url` acknowledges writes, so
/// that `WAIT 1` counts it. A replica reporting its link up, and listed
/// `online` by the primary, may still ignore the primary's `GETACK` for
/// about a second (measured here on Redis 7.0: `WAIT 1 200` returned 0 for
/// the first 0.9 s); and right after the sync a write may carry offset 0,
/// which any replica "acknowledges". So: a write, then `WAIT 1 100`, until
/// the primary reports the replica's offset past zero.
///
/// # Errors
///
/// When no replica acknowledges within `limit`, or the primary does not
/// answer.
///
/// # Cancel safety
///
/// Cancel safe: it writes one key, `multilock:replica-warm-up`, and polls.
pub async fn wait_replica_acks(url: &str, limit: Duration) -> io::Result<()> {
    let client = redis::Client::open(url).map_err(io::Error::other)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(io::Error::other)?;
    let poll = PollLimit::new(limit);
    loop {
        let acknowledged: u64 = redis::pipe()
            .cmd("SET")
            .arg("multilock:replica-warm-up")
            .arg(1)
            .ignore()
            .cmd("WAIT")
            .arg(1)
            .arg(100)
            .query_async::<(u64,)>(&mut conn)
            .await
            .map_err(io::Error::other)?
            .0;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .map_err(io::Error::other)?;
        let offset_past_zero = info.lines().filter(|l| l.starts_with("slave")).any(|l| {
            l.split(',')
                .any(|kv| kv.starts_with("offset=") && kv != "offset=0")
        });
        if acknowledged >= 1 && offset_past_zero {
            return Ok(());
        }
        poll.tick(|| format!("no replica of {url} acknowledged a write"))
            .await?;
    }
}

/// Waits until `replicas` replicas of the primary at `url` have every write
/// it took so far (the holds of lock `name` among them), for at most 5 s,
/// and returns how many acknowledged: a write in the name's hash slot, then
/// `WAIT` on the same connection (a connection that wrote nothing would not
/// wait; on a cluster node the slot must be the node's own).
///
/// # Errors
///
/// When the primary cannot be reached or refuses.
///
/// # Cancel safety
///
/// Cancel safe: it writes one key, `{name}:replicated`, and waits.
pub async fn wait_replicated(url: &str, name: &str, replicas: u64) -> io::Result<u64> {
    // No response timeout: `WAIT` answers within its own 5 s.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut conn = redis::Client::open(url)
        .map_err(io::Error::other)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(io::Error::other)?;
    let (acknowledged,): (u64,) = redis::pipe()
        .cmd("INCR")
        .arg(format!("{{{name}}}:replicated"))
        .ignore()
        .cmd("WAIT")
        .arg(replicas)
        .arg(5000)
        .query_async(&mut conn)
        .await
        .map_err(io::Error::other)?;
    Ok(acknowledged)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(url: &str, key: &str) -> Option<String> {
        command(url, redis::cmd("GET").arg(key)).await.unwrap()
    }

    async fn set(url: &str, key: &str) {
        let _: () = command(url, redis::cmd("SET").arg(key).arg("1"))
            .await
            .unwrap();
    }

    /// The process pair replicates, stops replicating while cut (the
    /// replica keeps what it had), catches up once restored, and its
    /// replica takes writes once promoted.
    #[tokio::test]
    async fn a_process_pair_cuts_restores_and_promotes() {
        let mut pair = ReplicatedPair::<RedisProcess>::start().await.unwrap();
        let (primary, replica) = (pair.primary.url(), pair.replica.url());
        set(&primary, "before").await;
        pair.wait_replica_acks(READY_LIMIT).await.unwrap();
        assert!(get(&replica, "before").await.is_some());

        pair.cut_link().await.unwrap();
        assert!(!pair.link_is_up().await.unwrap());
        set(&primary, "during").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(get(&replica, "during").await.is_none(), "the link is cut");
        assert!(get(&replica, "before").await.is_some(), "data kept");

        pair.restore_link().await.unwrap();
        pair.wait_link_up(READY_LIMIT).await.unwrap();
        pair.wait_replica_acks(READY_LIMIT).await.unwrap();
        assert!(get(&replica, "during").await.is_some(), "caught up");

        pair.primary.kill().await.unwrap();
        pair.promote().await.unwrap();
        set(&replica, "after").await;
        pair.rm().await.unwrap();
    }

    /// A restarted primary keeps its role and flags: the replica syncs from
    /// it again (and so comes back empty).
    #[tokio::test]
    async fn a_restarted_process_primary_is_replicated_again() {
        let mut pair = ReplicatedPair::<RedisProcess>::start().await.unwrap();
        set(&pair.primary.url(), "lost").await;
        pair.wait_replica_acks(READY_LIMIT).await.unwrap();
        pair.primary.restart().await.unwrap();
        pair.wait_link_up(READY_LIMIT).await.unwrap();
        pair.wait_replica_acks(READY_LIMIT).await.unwrap();
        assert!(get(&pair.replica.url(), "lost").await.is_none());
        pair.rm().await.unwrap();
    }
}
