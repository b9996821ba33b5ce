//! A Sentinel group of `redis-server` processes on loopback: a primary,
//! two replicas, and three sentinels monitoring them.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::command::{Role, ask, free_port, info_field, poll_ready, role, url_of};
use super::replicated::PRIMARY_FLAGS;
use super::{PollLimit, RedisProcess, TestServer};

/// How long a start or a failover may take.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// How long a return to health may take: a demoted primary is
/// reconfigured after 8 s, on a sentinel's `INFO` every 10 s.
const HEALTH_LIMIT: Duration = Duration::from_secs(60);

/// The name the sentinels monitor the primary under.
const MASTER: &str = "mymaster";

/// A member of a [`SentinelGroup`], to inject a fault into.
///
/// ```no_run
/// # async fn f(g: &mut multilock_testkit::SentinelGroup) -> std::io::Result<()> {
/// g.restart(multilock_testkit::GroupMember::Sentinel(2)).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupMember {
    /// Data node `i` of [`SentinelGroup::data_nodes`].
    Data(usize),
    /// Sentinel `i` of [`SentinelGroup::sentinels`].
    Sentinel(usize),
}

/// A sentinel: `redis-server <its config> --sentinel` on a free loopback
/// port, its config file (which it rewrites) in a directory of its own,
/// killed when dropped.
///
/// Not a [`RedisProcess`]: a sentinel needs its config file as the first
/// argument, before the options `RedisProcess` passes.
///
/// ```no_run
/// # fn f(g: &multilock_testkit::SentinelGroup) {
/// let sentinel = &g.sentinels()[0];
/// println!("{} {} {:?}", sentinel.url(), sentinel.port(), sentinel.pid());
/// # }
/// ```
#[derive(Debug)]
pub struct SentinelNode {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    paused: bool,
}

impl SentinelNode {
    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        url_of(self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id, while it runs (it may be paused).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    async fn start(primary: u16) -> io::Result<SentinelNode> {
        let mut taken = None;
        // The port is free when probed; a sentinel that finds it taken by
        // then exits, and the next port is tried.
        for _ in 0..5 {
            let port = free_port()?;
            let name = format!("multilock-sentinel-{port}-{}", std::process::id());
            let dir = std::env::temp_dir().join(name);
            std::fs::create_dir_all(&dir)?;
            let config = [
                format!("port {port}\nbind 127.0.0.1\ndir \"{}\"", dir.display()),
                "sentinel resolve-hostnames no".to_owned(),
                format!("sentinel monitor {MASTER} 127.0.0.1 {primary} 2"),
                format!("sentinel down-after-milliseconds {MASTER} 1000"),
                format!("sentinel failover-timeout {MASTER} 5000\n"),
            ];
            std::fs::write(dir.join("sentinel.conf"), config.join("\n"))?;
            let mut node = SentinelNode {
                port,
                dir,
                child: None,
                paused: false,
            };
            match node.spawn().await {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => taken = Some(e),
                result => return result.map(|()| node),
            }
        }
        Err(taken.unwrap_or_else(|| io::Error::other("no port for a sentinel")))
    }

    /// Runs the sentinel and waits until it answers, as itself: `INFO`
    /// names its pid.
    async fn spawn(&mut self) -> io::Result<()> {
        let binary = super::process::server_binary();
        let child = Command::new(&binary)
            .arg(self.dir.join("sentinel.conf"))
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run {binary}: {e}")))?;
        let (url, pid) = (self.url(), child.id().to_string());
        self.paused = false;
        let child = self.child.insert(child);
        let poll = PollLimit::new(Duration::from_secs(10));
        loop {
            if let Some(status) = child.try_wait()? {
                let message = format!("sentinel {url} exited at start ({status}); port taken?");
                return Err(io::Error::new(io::ErrorKind::AddrInUse, message));
            }
            let info = ask::<String>(&url, &["INFO", "server"]).await;
            if info.is_ok_and(|info| info_field(&info, "process_id") == Some(&pid)) {
                return Ok(());
            }
            poll.tick(|| format!("sentinel {url} did not answer"))
                .await?;
        }
    }

    fn signal(&self, signal: &str) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::other("the sentinel is not running"))?;
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()?;
        match status.success() {
            true => Ok(()),
            false => Err(io::Error::other(format!("kill {signal} {pid} failed"))),
        }
    }

    fn kill(&mut self) -> io::Result<()> {
        if self.paused {
            let _ = self.signal("-CONT");
            self.paused = false;
        }
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }
}

impl Drop for SentinelNode {
    fn drop(&mut self) {
        let _ = self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Sentinel group on loopback: a primary, 2 replicas (`--replicaof`) and
/// 3 sentinels (`sentinel monitor mymaster 127.0.0.1 <port> 2`,
/// `down-after-milliseconds 1000`, `failover-timeout 5000`), killed when
/// dropped.
///
/// Data node 0 is the first primary. Methods taking a [`GroupMember`]
/// panic when there is no such member. A restarted data node comes back
/// empty, with the flags it started with (data node 0 a primary, the
/// others replicas of it); the sentinels then reconfigure it, which takes
/// them some seconds: [`SentinelGroup::wait_until_healthy`].
///
/// ```no_run
/// use multilock_testkit::{GroupMember, SentinelGroup};
///
/// # async fn demo() -> std::io::Result<()> {
/// let mut group = SentinelGroup::start().await?;
/// let seeds = group.sentinel_urls(); // for a Sentinel client of "mymaster"
/// let first = group.primary_url().await?;
/// let promoted = group.failover().await?; // SENTINEL FAILOVER
/// let old = group.kill_primary().await?; // the promoted one
/// let next = group.wait_for_failover(old).await?; // replaced
/// group.restart(GroupMember::Data(old)).await?;
/// group.pause(GroupMember::Sentinel(0)).await?;
/// group.unpause(GroupMember::Sentinel(0)).await?;
/// group.wait_until_healthy().await?; // `old` is a replica again
/// group.kill_sentinels().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SentinelGroup {
    data: Vec<RedisProcess>,
    paused: Vec<bool>,
    sentinels: Vec<SentinelNode>,
}

impl SentinelGroup {
    /// Starts the data nodes, then the sentinels once both replicas are in
    /// sync, and waits until the group is healthy
    /// ([`SentinelGroup::wait_until_healthy`]): every sentinel names data
    /// node 0 as the primary and knows the other sentinels and the
    /// replicas. Fails when `redis-server` cannot be run, or the group is
    /// not ready within 30 s (the message says what was missing).
    ///
    /// # Cancel safety
    /// Dropping the future kills the processes already started.
    pub async fn start() -> io::Result<SentinelGroup> {
        let primary = RedisProcess::start_with_args(|_| flags(&[])).await?;
        let port = primary.port().to_string();
        let replica =
            || RedisProcess::start_with_args(|_| flags(&["--replicaof", "127.0.0.1", &port]));
        let (a, b) = tokio::try_join!(replica(), replica())?;
        let (data, paused, sentinels) = (vec![primary, a, b], vec![false; 3], Vec::new());
        let mut group = SentinelGroup {
            data,
            paused,
            sentinels,
        };
        // A sentinel learns of replicas from the primary's INFO, asked at
        // once and then every 10 s: they must be listed by then.
        poll_ready(READY_LIMIT, "the replicas did not sync", || async {
            let info: String = ask(&group.data[0].url(), &["INFO", "replication"]).await?;
            let online = info.matches("state=online").count();
            match online == 2 && group.data_health(0).await.is_ok() {
                true => Ok(()),
                false => Err(io::Error::other(format!("{online} of 2 replicas online"))),
            }
        })
        .await?;
        let sentinels = (0..3).map(|_| SentinelNode::start(group.data[0].port()));
        group.sentinels = futures::future::try_join_all(sentinels).await?;
        let what = "the Sentinel group did not become ready";
        poll_ready(READY_LIMIT, what, || group.health()).await?;
        Ok(group)
    }

    /// The name the sentinels monitor the primary under: `mymaster`.
    pub fn master_name(&self) -> &'static str {
        MASTER
    }

    /// `redis://` URLs of the 3 sentinels.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(SentinelNode::url).collect()
    }

    /// The data nodes: the first primary, then its 2 replicas.
    pub fn data_nodes(&self) -> &[RedisProcess] {
        &self.data
    }

    /// The sentinels.
    pub fn sentinels(&self) -> &[SentinelNode] {
        &self.sentinels
    }

    /// The index in [`SentinelGroup::data_nodes`] of the primary, as the
    /// first running sentinel that answers names it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`); fails when none answers.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    pub async fn primary(&self) -> io::Result<usize> {
        let mut last = io::Error::other("no sentinel runs");
        for url in self.up_sentinels() {
            match self.asked_primary(&url).await {
                Ok(port) => return self.data_index(port),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The primary's URL, as [`SentinelGroup::primary`] finds it.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    pub async fn primary_url(&self) -> io::Result<String> {
        Ok(self.data[self.primary().await?].url())
    }

    /// Kills the primary (SIGKILL) and returns its index; the sentinels
    /// then replace it: [`SentinelGroup::wait_for_failover`].
    ///
    /// # Cancel safety
    /// Dropping the future may leave the primary running or killed.
    pub async fn kill_primary(&mut self) -> io::Result<usize> {
        let primary = self.primary().await?;
        self.kill(GroupMember::Data(primary)).await?;
        Ok(primary)
    }

    /// Sends `SENTINEL FAILOVER mymaster` to a sentinel (again while it
    /// refuses, for up to 10 s) and waits as
    /// [`SentinelGroup::wait_for_failover`]; returns the new primary's
    /// index. The former primary becomes a replica some seconds later
    /// ([`SentinelGroup::wait_until_healthy`]): until then it still takes
    /// writes. Fails when no sentinel accepts, or no failover within 30 s.
    ///
    /// # Cancel safety
    /// Dropping the future leaves a failover it has asked for under way.
    pub async fn failover(&self) -> io::Result<usize> {
        let old = self.primary().await?;
        let up = self.up_sentinels().into_iter().next();
        let url = up.ok_or_else(|| io::Error::other("no sentinel runs"))?;
        let refused = format!("{url} refused SENTINEL FAILOVER");
        let failover = || ask::<()>(&url, &["SENTINEL", "FAILOVER", MASTER]);
        poll_ready(Duration::from_secs(10), &refused, failover).await?;
        self.wait_for_failover(old).await
    }

    /// Waits until every running sentinel names the same primary, not data
    /// node `old`, and that node is a primary; returns its index. Fails when
    /// not within 30 s.
    ///
    /// # Cancel safety
    /// Cancel safe: it only polls.
    pub async fn wait_for_failover(&self, old: usize) -> io::Result<usize> {
        let what = format!("the sentinels did not replace data node {old}");
        poll_ready(READY_LIMIT, &what, || async {
            let primary = self.agreed_primary().await?;
            if primary == old || role(&self.data[primary].url()).await?.0 != Role::Primary {
                return Err(io::Error::other(format!("the primary is {primary}")));
            }
            Ok(primary)
        })
        .await
    }

    /// Kills every sentinel (SIGKILL).
    ///
    /// # Cancel safety
    /// Finishes at once.
    pub async fn kill_sentinels(&mut self) -> io::Result<()> {
        self.sentinels.iter_mut().try_for_each(SentinelNode::kill)
    }

    /// Kills `member` (SIGKILL); a data node loses its data.
    ///
    /// # Cancel safety
    /// One signal: if dropped, it may or may not have been sent.
    pub async fn kill(&mut self, member: GroupMember) -> io::Result<()> {
        match member {
            GroupMember::Data(i) => {
                self.paused[i] = false;
                self.data[i].kill().await
            }
            GroupMember::Sentinel(i) => self.sentinels[i].kill(),
        }
    }

    /// Freezes `member` (SIGSTOP).
    ///
    /// # Cancel safety
    /// One signal: if dropped, it may or may not have been sent.
    pub async fn pause(&mut self, member: GroupMember) -> io::Result<()> {
        match member {
            GroupMember::Data(i) => self.data[i].pause().await?,
            GroupMember::Sentinel(i) => self.sentinels[i].signal("-STOP")?,
        }
        self.set_paused(member, true);
        Ok(())
    }

    /// Resumes a member frozen by [`SentinelGroup::pause`] (SIGCONT).
    ///
    /// # Cancel safety
    /// One signal: if dropped, it may or may not have been sent.
    pub async fn unpause(&mut self, member: GroupMember) -> io::Result<()> {
        match member {
            GroupMember::Data(i) => self.data[i].unpause().await?,
            GroupMember::Sentinel(i) => self.sentinels[i].signal("-CONT")?,
        }
        self.set_paused(member, false);
        Ok(())
    }

    /// Starts `member` again on the same port (killed first if it runs):
    /// a data node empty, with its first flags; a sentinel with the config
    /// it rewrote, so it knows the group. Returns once it answers (fails if
    /// not within 10 s).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the member stopped.
    pub async fn restart(&mut self, member: GroupMember) -> io::Result<()> {
        self.kill(member).await?;
        match member {
            GroupMember::Data(i) => self.data[i].restart().await,
            GroupMember::Sentinel(i) => self.sentinels[i].spawn().await,
        }
    }

    /// Waits until every running, unpaused sentinel names the same primary,
    /// reports it up (`status=ok`) with 2 replicas and 3 sentinels, and
    /// flags each running replica a plain `slave`; the primary is a
    /// primary, and every other running data node replicates it, link up.
    /// Returns the primary's index: not always the one a failover just
    /// promoted, since sentinels that missed a promotion (a loaded machine)
    /// may start a second failover of their own, and the newer epoch wins.
    /// Fails when not within 60 s (the message says what is missing): a
    /// former primary still running is demoted 10-20 s after a failover.
    ///
    /// # Cancel safety
    /// Cancel safe: it only polls.
    pub async fn wait_until_healthy(&self) -> io::Result<usize> {
        let what = "the Sentinel group did not become healthy";
        poll_ready(HEALTH_LIMIT, what, || self.health()).await
    }

    async fn health(&self) -> io::Result<usize> {
        let primary = self.agreed_primary().await?;
        let port = self.data[primary].port();
        for url in self.up_sentinels() {
            let info: String = ask(&url, &["INFO", "sentinel"]).await?;
            let want = format!("status=ok,address=127.0.0.1:{port},slaves=2,sentinels=3");
            if !info.contains(&want) {
                let seen = info_field(&info, "master0").unwrap_or_default();
                return Err(io::Error::other(format!("{url} sees {seen}")));
            }
            let replicas: Vec<HashMap<String, String>> =
                ask(&url, &["SENTINEL", "REPLICAS", MASTER]).await?;
            for node in (0..3).filter(|&i| i != primary && self.is_up(i)) {
                let port = self.data[node].port().to_string();
                let seen = replicas.iter().find(|r| r.get("port") == Some(&port));
                let flags = seen.and_then(|r| r.get("flags"));
                if flags.is_none_or(|flags| flags != "slave") {
                    return Err(io::Error::other(format!("{url}: {port} is {flags:?}")));
                }
            }
        }
        self.data_health(primary).await?;
        Ok(primary)
    }

    /// Whether data node `primary` is a primary and every other running,
    /// unpaused data node replicates it, link up.
    async fn data_health(&self, primary: usize) -> io::Result<()> {
        let port = self.data[primary].port();
        for (i, node) in self.data.iter().enumerate().filter(|&(i, _)| self.is_up(i)) {
            let (role, link) = role(&node.url()).await?;
            let healthy = match i == primary {
                true => role == Role::Primary,
                false => link == Some((port, true)),
            };
            if !healthy {
                return Err(io::Error::other(format!(
                    "{} is {role:?} {link:?}",
                    node.url()
                )));
            }
        }
        Ok(())
    }

    /// The primary every running, unpaused sentinel names.
    async fn agreed_primary(&self) -> io::Result<usize> {
        let mut agreed = None;
        for url in self.up_sentinels() {
            let port = self.asked_primary(&url).await?;
            if *agreed.get_or_insert(port) != port {
                return Err(io::Error::other("the sentinels name different primaries"));
            }
        }
        self.data_index(agreed.ok_or_else(|| io::Error::other("no sentinel runs"))?)
    }

    async fn asked_primary(&self, sentinel: &str) -> io::Result<u16> {
        let addr: Vec<String> =
            ask(sentinel, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]).await?;
        let port = addr.get(1).and_then(|port| port.parse().ok());
        port.ok_or_else(|| io::Error::other(format!("{sentinel} names no primary")))
    }

    fn up_sentinels(&self) -> Vec<String> {
        let up = self
            .sentinels
            .iter()
            .filter(|s| s.pid().is_some() && !s.paused);
        up.map(SentinelNode::url).collect()
    }

    fn data_index(&self, port: u16) -> io::Result<usize> {
        let index = self.data.iter().position(|n| n.port() == port);
        index.ok_or_else(|| io::Error::other(format!("the primary {port} is no data node")))
    }

    fn is_up(&self, data: usize) -> bool {
        self.data[data].is_running() && !self.paused[data]
    }

    fn set_paused(&mut self, member: GroupMember, paused: bool) {
        match member {
            GroupMember::Data(i) => self.paused[i] = paused,
            GroupMember::Sentinel(i) => self.sentinels[i].paused = paused,
        }
    }
}

/// A data node's arguments: `extra`, and a quick sync of replicas.
fn flags(extra: &[&str]) -> Vec<String> {
    extra
        .iter()
        .chain(&PRIMARY_FLAGS)
        .map(|&a| a.to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// Polls until `key` reads `value` on data node `node`.
    async fn wait_for(group: &SentinelGroup, node: usize, key: &str, value: &str) {
        let url = group.data_nodes()[node].url();
        let what = format!("{key} did not reach {url}");
        poll_ready(READY_LIMIT, &what, || async {
            match ask::<Option<String>>(&url, &["GET", key]).await? {
                Some(read) if read == value => Ok(()),
                read => Err(io::Error::other(format!("read {read:?}"))),
            }
        })
        .await
        .unwrap();
    }

    /// A write on the primary reaches both replicas; then a `SENTINEL
    /// FAILOVER` moves the primary, which the other replica follows.
    #[tokio::test]
    async fn a_started_group_replicates_and_sentinel_failover_moves_the_primary() {
        let started = Instant::now();
        let group = SentinelGroup::start().await.unwrap();
        tracing::info!("Sentinel group ready in {:?}", started.elapsed());
        assert_eq!(group.master_name(), "mymaster");
        assert_eq!(group.sentinel_urls().len(), 3);
        assert_eq!(
            group.primary_url().await.unwrap(),
            group.data_nodes()[0].url()
        );
        ask::<()>(&group.data_nodes()[0].url(), &["SET", "k", "1"])
            .await
            .unwrap();
        wait_for(&group, 1, "k", "1").await;
        wait_for(&group, 2, "k", "1").await;

        let started = Instant::now();
        let promoted = group.failover().await.unwrap();
        tracing::info!("SENTINEL FAILOVER done in {:?}", started.elapsed());
        assert_ne!(promoted, 0);
        assert_eq!(group.primary().await.unwrap(), promoted);
        ask::<()>(&group.data_nodes()[promoted].url(), &["SET", "k", "2"])
            .await
            .unwrap();
        wait_for(&group, 3 - promoted, "k", "2").await;
    }

    /// A killed primary is replaced; killed sentinels no longer answer.
    #[tokio::test]
    async fn a_killed_primary_is_replaced() {
        let mut group = SentinelGroup::start().await.unwrap();
        let started = Instant::now();
        assert_eq!(group.kill_primary().await.unwrap(), 0);
        let promoted = group.wait_for_failover(0).await.unwrap();
        tracing::info!("killed primary replaced in {:?}", started.elapsed());
        ask::<()>(&group.data_nodes()[promoted].url(), &["SET", "k", "3"])
            .await
            .unwrap();
        wait_for(&group, 3 - promoted, "k", "3").await;
        let primary = group.wait_until_healthy().await.unwrap();
        group.pause(GroupMember::Sentinel(0)).await.unwrap();
        assert_eq!(group.primary().await.unwrap(), primary);
        group.unpause(GroupMember::Sentinel(0)).await.unwrap();
        group.kill_sentinels().await.unwrap();
        assert!(group.sentinels().iter().all(|s| s.pid().is_none()));
        assert!(group.primary().await.is_err());
    }
}
