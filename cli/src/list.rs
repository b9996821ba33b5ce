//! `multilock list`: the locks whose names match a pattern, on every node
//! (every primary of a Cluster).

use serde_json::json;

use crate::args::ListArgs;
use crate::output::{error_chain, shown};
use crate::target::Target;
use crate::{Failure, Outcome};

/// Scans each node for lock hashes matching the pattern and prints them.
/// A node (or a Cluster's shard) that fails is reported, and the others
/// still listed.
pub async fn run(args: ListArgs) -> Result<Outcome, Failure> {
    let target = Target::new(&args.nodes)?;
    let mut locks = Vec::new();
    let mut errors = Vec::new();
    for node in &target.nodes {
        match node.find_locks(&args.pattern).await {
            Ok(found) => {
                locks.extend(found.locks);
                // A Cluster's shard that failed: the others are listed.
                for failed in found.unscanned {
                    errors.push((failed.node, error_chain(&failed.error)));
                }
            }
            Err(err) => errors.push((node.addr().to_owned(), error_chain(&err))),
        }
    }
    let kind = |read_write: bool| if read_write { "rw" } else { "lock" };
    if args.json {
        let locks: Vec<_> = locks
            .iter()
            .map(
                |lock| json!({"name": lock.name, "node": lock.node, "kind": kind(lock.read_write)}),
            )
            .collect();
        let errors: Vec<_> = errors
            .iter()
            .map(|(node, error)| json!({"node": node, "error": error}))
            .collect();
        out!(
            "{}",
            json!({"pattern": args.pattern, "locks": locks, "errors": errors})
        );
    } else {
        let width = locks
            .iter()
            .map(|lock| shown(&lock.name).len())
            .max()
            .unwrap_or(4)
            .max(4);
        let node_width = locks
            .iter()
            .map(|lock| lock.node.len())
            .max()
            .unwrap_or(4)
            .max(4);
        out!("{:<width$}  {:<node_width$}  KIND", "NAME", "NODE");
        for lock in &locks {
            out!(
                "{:<width$}  {:<node_width$}  {}",
                shown(&lock.name),
                lock.node,
                kind(lock.read_write)
            );
        }
        for (node, error) in &errors {
            eprintln!("{node}: {error}");
        }
    }
    if errors.is_empty() {
        Ok(Outcome::Done)
    } else {
        Ok(Outcome::Failed(format!("{} node(s) failed", errors.len())))
    }
}
