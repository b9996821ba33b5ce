//! The backend chosen at run time: [`Backend`] starts servers, [`AnyServer`]
//! is one of them, on either backend.

use std::fmt;
use std::io;
use std::str::FromStr;

use super::{RedisContainer, RedisProcess, ReplicaBackend, ReplicatedPair, Side, TestServer};

/// Environment variable choosing the backend of [`AnyServer`]'s
/// [`TestServer::start`]: `processes` (the default) or `containers`.
pub const BACKEND_ENV: &str = "MULTILOCK_BACKEND";

/// Which kind of server to run: the runner of [`AnyServer`], so a program
/// or a test picks the backend at run time and needs no dispatch of its own.
///
/// # Examples
///
/// ```no_run
/// use multilock_testkit::{Backend, TestServer};
///
/// # async fn demo() -> std::io::Result<()> {
/// // Containers when Docker works here, else processes.
/// let backend = match Backend::Containers.check().await {
///     Ok(()) => Backend::Containers,
///     Err(_) => Backend::Processes,
/// };
/// let mut nodes = backend.start_many(3).await?;
/// nodes[0].kill().await?;
/// let mut pair = backend.start_pair().await?;
/// pair.cut_link().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// `redis-server` processes on loopback ports ([`RedisProcess`]).
    #[default]
    Processes,
    /// Docker containers ([`RedisContainer`]).
    Containers,
}

impl Backend {
    /// The backend named by [`BACKEND_ENV`], else [`Backend::Processes`].
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidInput`] when the variable names no backend.
    pub fn from_env() -> io::Result<Backend> {
        match std::env::var(BACKEND_ENV) {
            Ok(name) if !name.is_empty() => name.parse(),
            _ => Ok(Backend::default()),
        }
    }

    /// Whether servers of this backend can run here: starts one and
    /// removes it. For containers this also settles the image
    /// ([`redis_image`](super::containers::redis_image)), which, without
    /// registry access, builds the local one the first time (seconds).
    ///
    /// # Errors
    ///
    /// Why not: as [`Backend::start`], or the removal failed.
    ///
    /// # Cancel safety
    ///
    /// As [`Backend::start`].
    pub async fn check(self) -> io::Result<()> {
        self.start().await?.rm().await
    }

    /// Starts one server, empty, and returns once it answers.
    ///
    /// # Errors
    ///
    /// As [`RedisProcess::start`] or [`RedisContainer::start`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future removes what it started.
    pub async fn start(self) -> io::Result<AnyServer> {
        Ok(match self {
            Backend::Processes => AnyServer::Process(RedisProcess::start().await?),
            Backend::Containers => AnyServer::Container(RedisContainer::start().await?),
        })
    }

    /// Starts `n` independent servers at once.
    ///
    /// # Errors
    ///
    /// As [`Backend::start`]; the servers already started are removed.
    ///
    /// # Cancel safety
    ///
    /// As [`Backend::start`].
    pub async fn start_many(self, n: usize) -> io::Result<Vec<AnyServer>> {
        Ok(match self {
            Backend::Processes => wrap(RedisProcess::start_many(n).await?),
            Backend::Containers => wrap(RedisContainer::start_many(n).await?),
        })
    }

    /// Starts `n` servers that clients reach from two sides
    /// ([`AnyServer::url_from`]), so one side can be cut off
    /// ([`AnyServer::partition_side`]). A process has one address: both
    /// sides are the same and cannot be cut apart.
    ///
    /// # Errors
    ///
    /// As [`Backend::start_many`].
    ///
    /// # Cancel safety
    ///
    /// As [`Backend::start`].
    pub async fn start_many_two_sided(self, n: usize) -> io::Result<Vec<AnyServer>> {
        Ok(match self {
            Backend::Processes => wrap(RedisProcess::start_many(n).await?),
            Backend::Containers => wrap(RedisContainer::start_many_two_sided(n).await?),
        })
    }

    /// Starts a primary with a replica, replicating and acknowledging
    /// writes: [`ReplicatedPair::start`] on this backend.
    ///
    /// # Errors
    ///
    /// As [`ReplicatedPair::start`].
    ///
    /// # Cancel safety
    ///
    /// As [`ReplicatedPair::start`].
    pub async fn start_pair(self) -> io::Result<ReplicatedPair<AnyServer>> {
        Ok(match self {
            Backend::Processes => ReplicatedPair::<RedisProcess>::start().await?.into(),
            Backend::Containers => ReplicatedPair::<RedisContainer>::start().await?.into(),
        })
    }

    /// The servers of one backend, as [`AnyServer`]s, for the replicated
    /// pair's [`ReplicaBackend::start_pair`].
    async fn start_pair_servers(self) -> io::Result<(AnyServer, AnyServer)> {
        Ok(match self {
            Backend::Processes => {
                let (primary, replica) = RedisProcess::start_pair().await?;
                (primary.into(), replica.into())
            }
            Backend::Containers => {
                let (primary, replica) = RedisContainer::start_pair().await?;
                (primary.into(), replica.into())
            }
        })
    }
}

fn wrap<S: Into<AnyServer>>(servers: Vec<S>) -> Vec<AnyServer> {
    servers.into_iter().map(Into::into).collect()
}

impl FromStr for Backend {
    type Err = io::Error;

    /// `processes` or `containers` (also singular), any case.
    fn from_str(name: &str) -> io::Result<Backend> {
        match name.to_ascii_lowercase().as_str() {
            "processes" | "process" => Ok(Backend::Processes),
            "containers" | "container" => Ok(Backend::Containers),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unknown test kit backend {name:?}: use processes or containers"),
            )),
        }
    }
}

impl fmt::Display for Backend {
    /// `processes` or `containers`, as [`FromStr`] reads them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Processes => "processes",
            Backend::Containers => "containers",
        })
    }
}

/// A server of either backend, with the faults of [`TestServer`] by
/// dispatch. Start it with a [`Backend`] chosen at run time, or with
/// [`TestServer::start`], which reads [`BACKEND_ENV`].
///
/// A [`ReplicatedPair<AnyServer>`] is a replicated pair of either backend
/// ([`Backend::start_pair`]).
///
/// # Examples
///
/// ```no_run
/// use multilock_testkit::{AnyServer, Backend, Side, TestServer};
///
/// # async fn demo(backend: Backend) -> std::io::Result<()> {
/// let mut server: AnyServer = backend.start().await?;
/// let node = multilock::Node::new(&server.url()).unwrap();
/// server.pause().await?;
/// server.unpause().await?;
/// server.rm().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub enum AnyServer {
    /// A `redis-server` process.
    Process(RedisProcess),
    /// A container.
    Container(RedisContainer),
}

impl AnyServer {
    /// The backend this server runs on.
    pub fn backend(&self) -> Backend {
        match self {
            AnyServer::Process(_) => Backend::Processes,
            AnyServer::Container(_) => Backend::Containers,
        }
    }

    /// `redis://host:port` through the given side
    /// ([`RedisContainer::url_from`]); a process has one address, the same
    /// for both sides.
    ///
    /// # Panics
    ///
    /// For [`Side::B`] of a container that has no side B (see
    /// [`RedisContainer::url_from`]).
    pub fn url_from(&self, side: Side) -> String {
        match self {
            AnyServer::Process(server) => server.url(),
            AnyServer::Container(server) => server.url_from(side),
        }
    }

    /// Cuts the server off one side only
    /// ([`RedisContainer::partition_side`]).
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::Unsupported`] for a process, which has one address;
    /// else as [`RedisContainer::partition_side`].
    ///
    /// # Cancel safety
    ///
    /// One Docker request: if dropped, it may or may not have been applied.
    pub async fn partition_side(&mut self, side: Side) -> io::Result<()> {
        match self {
            AnyServer::Process(_) => Err(one_address()),
            AnyServer::Container(server) => server.partition_side(side).await,
        }
    }

    /// Undoes [`AnyServer::partition_side`]
    /// ([`RedisContainer::heal_side`]).
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::Unsupported`] for a process; else as
    /// [`RedisContainer::heal_side`].
    ///
    /// # Cancel safety
    ///
    /// One Docker request: if dropped, it may or may not have been applied.
    pub async fn heal_side(&mut self, side: Side) -> io::Result<()> {
        match self {
            AnyServer::Process(_) => Err(one_address()),
            AnyServer::Container(server) => server.heal_side(side).await,
        }
    }
}

fn one_address() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "a process has one address: cutting one side off needs containers",
    )
}

impl From<RedisProcess> for AnyServer {
    fn from(server: RedisProcess) -> AnyServer {
        AnyServer::Process(server)
    }
}

impl From<RedisContainer> for AnyServer {
    fn from(server: RedisContainer) -> AnyServer {
        AnyServer::Container(server)
    }
}

impl From<ReplicatedPair<RedisProcess>> for ReplicatedPair<AnyServer> {
    fn from(pair: ReplicatedPair<RedisProcess>) -> ReplicatedPair<AnyServer> {
        ReplicatedPair {
            primary: pair.primary.into(),
            replica: pair.replica.into(),
        }
    }
}

impl From<ReplicatedPair<RedisContainer>> for ReplicatedPair<AnyServer> {
    fn from(pair: ReplicatedPair<RedisContainer>) -> ReplicatedPair<AnyServer> {
        ReplicatedPair {
            primary: pair.primary.into(),
            replica: pair.replica.into(),
        }
    }
}

/// Runs `$call` on whichever server `$server` holds.
macro_rules! dispatch {
    ($server:expr, $s:ident => $call:expr) => {
        match $server {
            AnyServer::Process($s) => $call,
            AnyServer::Container($s) => $call,
        }
    };
}

impl TestServer for AnyServer {
    /// Starts one server on the backend of [`BACKEND_ENV`].
    async fn start() -> io::Result<Self> {
        Backend::from_env()?.start().await
    }

    /// Starts `n` servers on the backend of [`BACKEND_ENV`].
    async fn start_many(n: usize) -> io::Result<Vec<Self>> {
        Backend::from_env()?.start_many(n).await
    }

    async fn rm(self) -> io::Result<()> {
        dispatch!(self, s => s.rm().await)
    }

    fn url(&self) -> String {
        dispatch!(self, s => s.url())
    }

    fn is_running(&self) -> bool {
        dispatch!(self, s => TestServer::is_running(s))
    }

    async fn kill(&mut self) -> io::Result<()> {
        dispatch!(self, s => s.kill().await)
    }

    async fn pause(&mut self) -> io::Result<()> {
        dispatch!(self, s => s.pause().await)
    }

    async fn unpause(&mut self) -> io::Result<()> {
        dispatch!(self, s => s.unpause().await)
    }

    async fn restart(&mut self) -> io::Result<()> {
        dispatch!(self, s => s.restart().await)
    }

    async fn partition(&mut self) -> io::Result<()> {
        dispatch!(self, s => s.partition().await)
    }

    async fn heal(&mut self) -> io::Result<()> {
        dispatch!(self, s => s.heal().await)
    }
}

impl ReplicaBackend for AnyServer {
    /// Starts the pair on the backend of [`BACKEND_ENV`].
    async fn start_pair() -> io::Result<(AnyServer, AnyServer)> {
        Backend::from_env()?.start_pair_servers().await
    }

    async fn cut_link(primary: &AnyServer, replica: &mut AnyServer) -> io::Result<()> {
        match (primary, replica) {
            (AnyServer::Process(p), AnyServer::Process(r)) => RedisProcess::cut_link(p, r).await,
            (AnyServer::Container(p), AnyServer::Container(r)) => {
                RedisContainer::cut_link(p, r).await
            }
            _ => Err(mixed_pair()),
        }
    }

    async fn restore_link(primary: &AnyServer, replica: &mut AnyServer) -> io::Result<()> {
        match (primary, replica) {
            (AnyServer::Process(p), AnyServer::Process(r)) => {
                RedisProcess::restore_link(p, r).await
            }
            (AnyServer::Container(p), AnyServer::Container(r)) => {
                RedisContainer::restore_link(p, r).await
            }
            _ => Err(mixed_pair()),
        }
    }
}

fn mixed_pair() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "a replicated pair needs its primary and replica on one backend",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_read_their_names() {
        for backend in [Backend::Processes, Backend::Containers] {
            assert_eq!(backend.to_string().parse::<Backend>().unwrap(), backend);
        }
        assert_eq!("Container".parse::<Backend>().unwrap(), Backend::Containers);
        let err = "vm".parse::<Backend>().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    /// Every fault reaches the process behind the enum.
    #[tokio::test]
    async fn a_process_behind_any_server_takes_the_faults() {
        let mut server = Backend::Processes.start().await.unwrap();
        assert_eq!(server.backend(), Backend::Processes);
        assert_eq!(server.url_from(Side::B), server.url());
        let err = server.partition_side(Side::A).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Unsupported);
        server.kill().await.unwrap();
        assert!(!server.is_running());
        server.restart().await.unwrap();
        assert!(server.is_running());
        server.rm().await.unwrap();
    }
}
