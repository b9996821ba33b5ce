//! The process backend: `redis-server` on free loopback ports.

use std::io;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::TestServer;

/// The binary to run: `$MULTILOCK_REDIS_SERVER`, else `redis-server` from `PATH`.
fn server_binary() -> String {
    std::env::var("MULTILOCK_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// A `redis-server` process on a loopback port, killed when dropped.
///
/// Started without persistence (`--save "" --appendonly no`), so a restart
/// comes back empty, as a master that lost its data.
#[derive(Debug)]
pub struct RedisProcess {
    port: u16,
    dir: PathBuf,
    extra_args: Vec<String>,
    child: Option<Child>,
    paused: bool,
}

impl RedisProcess {
    /// Starts a server on a free port and waits until it answers PING.
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
    /// (`--port 0 --tls-port <port> ...`). Later arguments override earlier
    /// ones. Waits until the port accepts connections.
    ///
    /// # Errors
    ///
    /// When `redis-server` cannot be run or does not listen within 10 s.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future kills a server it already started.
    pub async fn start_with_args(
        extra: impl FnOnce(u16) -> Vec<String>,
    ) -> io::Result<RedisProcess> {
        let port = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("multilock-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut server = RedisProcess {
            port,
            dir,
            extra_args: extra(port),
            child: None,
            paused: false,
        };
        server.spawn().await?;
        Ok(server)
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
        self.port
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
            .args(["--port", &self.port.to_string()])
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
        self.child = Some(child);
        self.paused = false;
        wait_until_listening(self.port, Duration::from_secs(10)).await
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
        format!("redis://127.0.0.1:{}", self.port)
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

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Polls the port until it accepts connections: a Redis server listens once
/// it is ready (no data to load here), whatever it then requires (a
/// password, TLS).
async fn wait_until_listening(port: u16, limit: Duration) -> io::Result<()> {
    let started = Instant::now();
    loop {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(_) => return Ok(()),
            Err(_) if started.elapsed() > limit => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("redis-server on port {port} did not listen within {limit:?}"),
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
/// Polls PING until the server answers.
pub(crate) async fn wait_until_ready(url: &str, limit: Duration) -> io::Result<()> {
    let client = redis::Client::open(url).map_err(io::Error::other)?;
    let started = Instant::now();
    loop {
        let attempt = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        match tokio::time::timeout(Duration::from_millis(500), attempt).await {
            Ok(Ok(_)) => return Ok(()),
            _ if started.elapsed() > limit => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{url} did not answer PING within {limit:?}"),
                ));
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
