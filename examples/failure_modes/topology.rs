//! The servers behind each lock type, and the lock as a client sees it.

use std::io;
use std::time::Duration;

use multilock::{Client, Guard, Lock, MultiLock, Node, NodeBuilder, RedLock};
use multilock_testkit::{AnyServer, Backend, ReplicatedPair, Side, TestServer};

/// Per-request timeouts of every node.
const NODE_TIMEOUT: Duration = Duration::from_millis(300);
/// The lock's name, in every table.
pub const NAME: &str = "resource";

/// The lock types compared, one column each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Single,
    SingleSync,
    Multi,
    Red,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Single, Kind::SingleSync, Kind::Multi, Kind::Red];

    pub fn title(self) -> &'static str {
        match self {
            Kind::Single => "single + replica",
            Kind::SingleSync => "single + replica, WAIT 1",
            Kind::Multi => "MultiLock (3)",
            Kind::Red => "RedLock (5)",
        }
    }

    pub fn is_single(self) -> bool {
        matches!(self, Kind::Single | Kind::SingleSync)
    }
}

/// The servers of one lock type: for the single kinds a primary and its
/// replica; else 3 or 5 independent masters, each reachable from two
/// sides (containers), so a partition can cut one client off.
pub struct Topology {
    pub kind: Kind,
    pub backend: Backend,
    servers: Servers,
}

enum Servers {
    Replicated(Box<ReplicatedPair<AnyServer>>),
    Masters(Vec<AnyServer>),
}

impl Topology {
    pub async fn start(kind: Kind, backend: Backend) -> io::Result<Topology> {
        let servers = match kind {
            Kind::Single | Kind::SingleSync => {
                Servers::Replicated(Box::new(backend.start_pair().await?))
            }
            Kind::Multi => Servers::Masters(backend.start_many_two_sided(3).await?),
            Kind::Red => Servers::Masters(backend.start_many_two_sided(5).await?),
        };
        Ok(Topology {
            kind,
            backend,
            servers,
        })
    }

    /// Server `i`: for the single kinds 0 is the primary and 1 the replica.
    pub fn server(&mut self, i: usize) -> &mut AnyServer {
        match &mut self.servers {
            Servers::Replicated(pair) => match i {
                0 => &mut pair.primary,
                1 => &mut pair.replica,
                _ => panic!("a replicated pair has two servers, not {}", i + 1),
            },
            Servers::Masters(masters) => &mut masters[i],
        }
    }

    /// The primary and its replica (single kinds).
    pub fn pair(&mut self) -> &mut ReplicatedPair<AnyServer> {
        match &mut self.servers {
            Servers::Replicated(pair) => pair,
            Servers::Masters(_) => panic!("{} has no replica", self.kind.title()),
        }
    }

    /// The servers a client locks on: the primary, or every master.
    fn lock_servers(&self) -> Vec<&AnyServer> {
        match &self.servers {
            Servers::Replicated(pair) => vec![&pair.primary],
            Servers::Masters(masters) => masters.iter().collect(),
        }
    }

    /// The lock as a client sees it. `urls` picks each server's address.
    fn lock_on(&self, client: &Client, urls: Vec<String>) -> AnyLock {
        let nodes: Vec<Node> = urls.into_iter().map(node).collect();
        match self.kind {
            Kind::Single => AnyLock::Single(client.lock(&nodes[0], NAME).unwrap()),
            Kind::SingleSync => AnyLock::Single(
                client
                    .lock(&nodes[0], NAME)
                    .unwrap()
                    .with_replica_sync(1, Duration::from_millis(200))
                    .unwrap(),
            ),
            Kind::Multi => AnyLock::Multi(client.multi_lock_on(&nodes, NAME).unwrap()),
            Kind::Red => AnyLock::Red(client.red_lock_on(&nodes, NAME).unwrap()),
        }
    }

    /// The lock on the primary (single kinds) or on every master.
    pub fn lock(&self, client: &Client) -> AnyLock {
        let urls = self.lock_servers().iter().map(|s| s.url()).collect();
        self.lock_on(client, urls)
    }

    /// The lock through the other side of a partition.
    pub fn lock_from_other_side(&self, client: &Client) -> AnyLock {
        let urls = self
            .lock_servers()
            .iter()
            .map(|s| s.url_from(Side::B))
            .collect();
        self.lock_on(client, urls)
    }

    /// The lock on the promoted replica (single kinds).
    pub fn lock_on_replica(&self, client: &Client) -> AnyLock {
        match &self.servers {
            Servers::Replicated(pair) => self.lock_on(client, vec![pair.replica.url()]),
            Servers::Masters(_) => panic!("{} has no replica", self.kind.title()),
        }
    }

    /// The failover (single kinds): the replica's link comes back, then
    /// the replica is promoted, with whatever data it had received.
    pub async fn fail_over(&mut self) -> io::Result<()> {
        let pair = self.pair();
        pair.restore_link().await?;
        pair.promote().await
    }

    pub async fn rm(self) {
        match self.servers {
            Servers::Replicated(pair) => {
                let _ = pair.rm().await;
            }
            Servers::Masters(masters) => {
                for server in masters {
                    let _ = server.rm().await;
                }
            }
        }
    }
}

fn node(url: String) -> Node {
    timed(Node::builder(url)).expect("valid URL")
}

/// Builds a node with the per-request timeouts every table uses.
pub fn timed(builder: NodeBuilder) -> multilock::Result<Node> {
    builder
        .connect_timeout(NODE_TIMEOUT)
        .response_timeout(NODE_TIMEOUT)
        .build()
}

pub fn client(watchdog: Duration) -> Client {
    Client::builder()
        .watchdog_timeout(watchdog)
        .build()
        .unwrap()
}

/// The three lock types behind one face.
#[derive(Clone)]
pub enum AnyLock {
    Single(Lock),
    Multi(MultiLock),
    Red(RedLock),
}

impl AnyLock {
    pub async fn try_lock_for(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> multilock::Result<Option<Guard>> {
        match self {
            AnyLock::Single(l) => l.try_lock_for(wait, lease).await,
            AnyLock::Multi(l) => l.try_lock_for(wait, lease).await,
            AnyLock::Red(l) => l.try_lock_for(wait, lease).await,
        }
    }

    pub fn fenced(&self) -> AnyLock {
        match self {
            AnyLock::Single(l) => AnyLock::Single(l.with_fencing()),
            AnyLock::Multi(l) => AnyLock::Multi(l.with_fencing()),
            AnyLock::Red(l) => AnyLock::Red(l.with_fencing()),
        }
    }
}
