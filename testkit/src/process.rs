//! The process backend: `redis-server` on free loopback ports.

use std::collections::BTreeSet;
use std::io;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::{PollLimit, TestServer};

/// The variable naming the server binary every server of the kit runs:
/// plain processes, replicas, sentinels (`<binary> <conf> --sentinel`) and
/// cluster nodes. Unset: `redis-server` from `PATH`.
pub const SERVER_ENV: &str = "MULTILOCK_REDIS_SERVER";

/// The binary to run: `$MULTILOCK_REDIS_SERVER`, else `redis-server` from `PATH`.
pub(crate) fn server_binary() -> String {
    std::env::var(SERVER_ENV).unwrap_or_else(|_| "redis-server".to_owned())
}

/// The major version of [`server_binary`] (`Redis server v=6.2.14 ...` is
/// 6, `Valkey server v=8.1.8 ...` 8), asked once; `None` when it does not
/// say, taken as recent.
pub(crate) fn server_major() -> Option<u32> {
    static MAJOR: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *MAJOR.get_or_init(|| {
        let output = Command::new(server_binary())
            .arg("--version")
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let version = text.split_whitespace().find_map(|w| w.strip_prefix("v="))?;
        version.split('.').next()?.parse().ok()
    })
}

/// A `redis-server` process on a loopback port, killed when dropped.
///
/// Started without persistence (`--save "" --appendonly no`), so a restart
/// comes back empty, as a master that lost its data.
#[derive(Debug)]
pub struct RedisProcess {
    port: ReservedPort,
    dir: PathBuf,
    extra_args: Vec<String>,
    child: Option<Child>,
    paused: bool,
}

impl RedisProcess {
    /// Starts a server on a free port and waits until it listens there.
    ///
    /// # Errors
    ///
    /// When `redis-server` cannot be run or does not answer within 10 s.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future kills a server it already started.
    pub async fn start() -> io::Result<RedisProcess> {
        RedisProcess::start_with_args(|_| Vec::new()).await
    }

    /// Starts a server with extra arguments, made from the port it will
    /// listen on: an ACL user, or TLS on that port instead of plain TCP
    /// (`--port 0 --tls-port <port> ...`), called again for each port tried.
    /// Later arguments override earlier ones. Waits until the server itself
    /// listens on the port: a port no other server of this process holds,
    /// and, when another program takes it first, the next free one.
    ///
    /// # Errors
    ///
    /// When `redis-server` cannot be run, does not listen within 10 s, or
    /// finds its port taken five times in a row.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future kills a server it already started.
    pub async fn start_with_args(extra: impl Fn(u16) -> Vec<String>) -> io::Result<RedisProcess> {
        let mut last_error = None;
        // Another process may take the port between our probe and the
        // server's bind; the server then exits and we try another port.
        for _ in 0..START_ATTEMPTS {
            let port = ReservedPort::new()?;
            let dir = std::env::temp_dir().join(format!(
                "multilock-redis-{}-{}",
                port.0,
                std::process::id()
            ));
            std::fs::create_dir_all(&dir)?;
            let mut server = RedisProcess {
                extra_args: extra(port.0),
                port,
                dir,
                child: None,
                paused: false,
            };
            match server.spawn().await {
                Ok(()) => return Ok(server),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last_error = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("no port")))
    }

    /// Starts `n` servers concurrently.
    ///
    /// # Errors
    ///
    /// As [`RedisProcess::start`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future kills the servers already started.
    pub async fn start_many(n: usize) -> io::Result<Vec<RedisProcess>> {
        futures::future::try_join_all((0..n).map(|_| RedisProcess::start())).await
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port.0
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process runs (it may be paused).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    async fn spawn(&mut self) -> io::Result<()> {
        let child = Command::new(server_binary())
            .args(["--port", &self.port.0.to_string()])
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                io::Error::new(e.kind(), format!("cannot run {}: {e}", server_binary()))
            })?;
        self.paused = false;
        let child = self.child.insert(child);
        wait_until_listening(child, self.port.0, Duration::from_secs(10)).await
    }

    fn signal(&self, signal: &str) -> io::Result<()> {
        let Some(pid) = self.pid() else {
            return Err(io::Error::other("the server is not running"));
        };
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("kill {signal} {pid} failed")))
        }
    }

    fn kill_now(&mut self) -> io::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        self.paused = false;
        Ok(())
    }
}

impl TestServer for RedisProcess {
    async fn start() -> io::Result<Self> {
        RedisProcess::start().await
    }

    async fn start_many(n: usize) -> io::Result<Vec<Self>> {
        RedisProcess::start_many(n).await
    }

    async fn rm(mut self) -> io::Result<()> {
        self.kill_now()
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port.0)
    }

    fn is_running(&self) -> bool {
        RedisProcess::is_running(self)
    }

    async fn kill(&mut self) -> io::Result<()> {
        self.kill_now()
    }

    async fn pause(&mut self) -> io::Result<()> {
        self.signal("-STOP")?;
        self.paused = true;
        Ok(())
    }

    async fn unpause(&mut self) -> io::Result<()> {
        self.signal("-CONT")?;
        self.paused = false;
        Ok(())
    }

    async fn restart(&mut self) -> io::Result<()> {
        self.kill_now()?;
        self.spawn().await
    }

    async fn partition(&mut self) -> io::Result<()> {
        self.pause().await
    }

    async fn heal(&mut self) -> io::Result<()> {
        self.unpause().await
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        if self.paused {
            let _ = self.signal("-CONT");
        }
        let _ = self.kill_now();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How many ports [`RedisProcess::start`] tries before giving up.
const START_ATTEMPTS: usize = 5;

/// Ports held by this process's servers, from start to drop, restarts
/// included: the kernel may hand a port out again as soon as its server is
/// killed, and two tests of one binary must never share a server.
static RESERVED_PORTS: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A free loopback port, reserved in this process until dropped.
#[derive(Debug)]
struct ReservedPort(u16);

impl ReservedPort {
    fn new() -> io::Result<ReservedPort> {
        let mut reserved = RESERVED_PORTS.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            if reserved.insert(port) {
                return Ok(ReservedPort(port));
            }
        }
    }
}

impl Drop for ReservedPort {
    fn drop(&mut self) {
        RESERVED_PORTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// Polls until `child` listens on `port`: a Redis server listens once it is
/// ready (no data to load here), whatever it then requires (a password,
/// TLS). Fails with [`io::ErrorKind::AddrInUse`] when the child exits first,
/// as a server does when someone else holds the port, and never takes
/// another process's listener for the child's.
async fn wait_until_listening(child: &mut Child, port: u16, limit: Duration) -> io::Result<()> {
    let poll = PollLimit::new(limit);
    loop {
        if let Some(status) = child.try_wait()? {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("redis-server on port {port} exited at start ({status}); port taken?"),
            ));
        }
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
            && listens_on(child.id(), port)?
        {
            return Ok(());
        }
        poll.tick(|| format!("redis-server on port {port} did not listen"))
            .await?;
    }
}

/// Whether process `pid` owns the listening socket on loopback `port`:
/// the socket's inode from `/proc/net/tcp`, among the process's open files.
#[cfg(target_os = "linux")]
fn listens_on(pid: u32, port: u16) -> io::Result<bool> {
    const LISTEN: &str = "0A";
    let local = format!("0100007F:{port:04X}");
    let table = std::fs::read_to_string("/proc/net/tcp")?;
    let Some(inode) = table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&LISTEN))
            .then(|| fields.get(9).map(|inode| format!("socket:[{inode}]")))
            .flatten()
    }) else {
        return Ok(false);
    };
    // A child that has just exited has no open files to list: not ours, and
    // the caller's next `try_wait` tells why.
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Ok(false);
    };
    Ok(fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == inode.as_str())
    }))
}

/// Elsewhere, a listener is taken as the child's while the child runs.
#[cfg(not(target_os = "linux"))]
fn listens_on(_pid: u32, _port: u16) -> io::Result<bool> {
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that cannot bind because another program holds its port is
    /// reported as such, even though the port accepts connections.
    #[tokio::test]
    async fn a_taken_port_is_not_mistaken_for_the_server() {
        let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = squatter.local_addr().unwrap().port();
        let mut child = Command::new(server_binary())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let err = wait_until_listening(&mut child, port, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Servers of one process never share a port, restarts included.
    #[tokio::test]
    async fn servers_get_distinct_ports_that_survive_restarts() {
        let mut servers = RedisProcess::start_many(8).await.unwrap();
        let port = servers[0].port();
        servers[0].restart().await.unwrap();
        assert_eq!(servers[0].port(), port);
        let mut ports: Vec<u16> = servers.iter().map(RedisProcess::port).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 8);
        let reserved = RESERVED_PORTS.lock().unwrap();
        assert!(ports.iter().all(|p| reserved.contains(p)));
    }
}
