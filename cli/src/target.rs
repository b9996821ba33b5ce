//! From the node arguments to nodes and lock handles: one server, a
//! Sentinel group, a Cluster, or several servers as a RedLock (or, with
//! `--all`, a MultiLock).

use multilock::{AnyLock, Client, Lock, Node};

use crate::Failure;
use crate::args::NodeArgs;

/// The kind of single-node lock a handle is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The reentrant lock.
    Lock,
    /// The fair lock.
    Fair,
    /// A read-write lock's read lock.
    Read,
    /// A read-write lock's write lock.
    Write,
}

impl Kind {
    /// How the kind is named in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Lock => "reentrant lock",
            Kind::Fair => "fair lock",
            Kind::Read => "read lock",
            Kind::Write => "write lock",
        }
    }
}

/// The nodes the arguments name, and how a lock spans them.
#[derive(Debug)]
pub struct Target {
    /// The nodes: one for a server, a Sentinel group or a Cluster;
    /// several for a RedLock or MultiLock.
    pub nodes: Vec<Node>,
    /// Whether every node must hold (a MultiLock) rather than a majority.
    pub all: bool,
    client: Client,
}

impl Target {
    /// The nodes of `args`. Nothing connects yet.
    pub fn new(args: &NodeArgs) -> Result<Target, Failure> {
        let mut nodes = Vec::new();
        if let Some(master) = &args.sentinel {
            let mut builder = Node::sentinel(master.clone(), args.nodes.clone());
            if let Some(password) = &args.data_password {
                builder = builder.password(password.clone());
            }
            if let Some(timeout) = args.timeout {
                builder = builder.connect_timeout(timeout).response_timeout(timeout);
            }
            nodes.push(builder.build()?);
        } else if args.cluster {
            let mut builder = Node::cluster(args.nodes.clone());
            if let Some(timeout) = args.timeout {
                builder = builder.connect_timeout(timeout).response_timeout(timeout);
            }
            nodes.push(builder.build()?);
        } else {
            for url in &args.nodes {
                let mut builder = Node::builder(url.clone());
                if let Some(timeout) = args.timeout {
                    builder = builder.connect_timeout(timeout).response_timeout(timeout);
                }
                nodes.push(builder.build()?);
            }
        }
        let client = Client::builder().build()?;
        Ok(Target {
            nodes,
            all: args.all,
            client,
        })
    }

    /// The lock `name` of `kind` on `node` alone.
    pub fn single(&self, node: &Node, name: &str, kind: Kind) -> Result<Lock, Failure> {
        Ok(match kind {
            Kind::Lock => self.client.lock(node, name)?,
            Kind::Fair => self.client.fair_lock(node, name)?,
            Kind::Read => self.client.read_write_lock(node, name)?.read().clone(),
            Kind::Write => self.client.read_write_lock(node, name)?.write().clone(),
        })
    }

    /// The lock `name` of `kind` over every node: the node's own lock, or
    /// a RedLock (a MultiLock with `--all`) of the nodes' locks.
    pub fn handle(&self, name: &str, kind: Kind) -> Result<AnyLock, Failure> {
        let locks = self
            .nodes
            .iter()
            .map(|node| self.single(node, name, kind))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(match locks.len() {
            1 => locks.into_iter().next().expect("one lock").into(),
            _ if self.all => self.client.multi_lock(locks)?.into(),
            _ => self.client.red_lock(locks)?.into(),
        })
    }
}
