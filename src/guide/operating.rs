//! During an incident: who holds `orders:42`, on which nodes, since when,
//! and who waits. The library answers with `inspect` and `find_locks`;
//! the `multilock` command-line tool (the `multilock-cli` crate) answers
//! from a shell.
//!
//! # Inspecting a lock
//!
//! [`Lock::inspect`](crate::Lock::inspect) and
//! [`QuorumLock::inspect`](crate::QuorumLock::inspect) (so `MultiLock`,
//! `RedLock` and [`AnyLock`](crate::AnyLock) too) read each node in **one
//! read-only request**: a script that calls only `HGETALL`, `HEXISTS`,
//! `PTTL`, `LRANGE`, `ZRANGE`, `GET` and `TIME`. A unit test checks the
//! script's source; a suite test watches MONITOR while it runs. Per node,
//! an [`Inspection`](crate::inspect::Inspection) holds a
//! [`LockState`](crate::inspect::LockState):
//!
//! - the **holders**: client id, owner and hold count; for a read-write
//!   lock the mode, the writer, and each reader's holds with the TTL of
//!   each hold's timeout key (`None` for a hold whose key expired);
//! - the lock key's remaining **TTL**;
//! - a fair lock's **queue**, head first, each waiter with its deadline
//!   (in the clock of the client that queued it; the server's clock is in
//!   the answer to compare with);
//! - the **fencing counter**.
//!
//! Every key of Redisson's lock family under the name is read, whatever
//! kind of handle asks, so a fair queue or a read-write lock left by
//! another client shows as it is stored. Owner fields show as written:
//! `<uuid>:<thread id>` from Redisson, whatever node-redisson chose.
//!
//! A node that does not answer within its timeout (the node's response
//! timeout; a quorum lock's [node timeout](crate::QuorumLock::with_node_timeout))
//! is part of the answer, with its error. The
//! [`Verdict`](crate::inspect::Verdict) then says, against the lock's
//! quorum (1, every node for a MultiLock, N/2+1 for a RedLock):
//!
//! | verdict | meaning |
//! |---|---|
//! | `Held(claims)` | an owner (or each reader listed) holds on a quorum; each claim names its nodes |
//! | `Free` | no node holds it, and the silent nodes are too few to make a quorum |
//! | `Split(claims)` | holds exist, none on a quorum, and the silent nodes could not complete one: a round in progress, or leftovers a TTL or rollback clears |
//! | `Unknown { unanswered }` | too few nodes answered to tell |
//!
//! ```no_run
//! # async fn demo(client: multilock::Client, nodes: Vec<multilock::Node>) -> multilock::Result<()> {
//! use multilock::inspect::Verdict;
//! let red = client.red_lock_on(&nodes, "orders:42")?;
//! let inspection = red.inspect().await?;
//! for node in &inspection.nodes {
//!     match &node.state {
//!         Ok(state) => {
//!             for holder in &state.holders {
//!                 println!("{}: {} x{} (ttl {:?})", node.node, holder.owner, holder.holds, state.ttl);
//!             }
//!         }
//!         Err(err) => println!("{}: no answer ({err})", node.node),
//!     }
//! }
//! if let Verdict::Split(claims) = &inspection.verdict {
//!     println!("no quorum: {claims:?}");
//! }
//! # Ok(()) }
//! ```
//!
//! # Finding locks
//!
//! [`Node::find_locks`](crate::Node::find_locks) walks a node's keys with
//! `SCAN … MATCH pattern COUNT 1000 TYPE hash`, never `KEYS`, and keeps the
//! hashes of Redisson's lock shape: every sampled field is `mode` or
//! `<uuid>:<owner>` with a count. A Cluster node scans each primary; a
//! Sentinel node its primary.
//!
//! # Forcing a release
//!
//! `force_unlock` deletes as Redisson's `forceUnlock` does and publishes the
//! kind's unlock message (the lock's channel; a fair lock's head; a
//! read-write lock's shared channel, in its own mode), so waiters of every
//! client, Redisson's included, wake and try.
//!
//! # The command-line tool
//!
//! The `multilock` binary (crate `multilock-cli`) wraps these: `inspect`
//! (a table, or `--json`), `watch` (each change as it happens), `list`
//! and `unlock --force`, on standalone, Sentinel and Cluster nodes. Its
//! README shows each with real output, and its exit codes.
