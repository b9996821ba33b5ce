//! What a node can be (a standalone server, a Sentinel group's primary, a
//! Redis Cluster), how each follows failovers, and what asynchronous
//! replication can still lose.
//!
//! # Nodes
//!
//! A node is one of:
//!
//! | node | built with | what it is |
//! |---|---|---|
//! | a standalone server | `Node::new(url)`, `Node::builder(url)` | one Redis master behind a URL |
//! | a Sentinel group's primary | `Node::sentinel("mymaster", sentinel_urls)` (feature `sentinel`) | whichever server the group's sentinels name the primary now |
//! | a Redis Cluster | `Node::cluster(seed_urls)` (feature `cluster`) | each lock on the primary of its name's hash slot, as the cluster's slot map says now |
//!
//! Every lock kind takes any of them, alone or as members of a MultiLock or RedLock,
//! with the same API and the same builder options (pool size, timeouts,
//! keepalive); a Sentinel node also takes the data nodes' `username`,
//! `password`, `database` and `tls`, while each sentinel's own password and TLS
//! come from its URL (`redis://:pw@host:26379`, `rediss://...`). A Cluster
//! node takes its password and TLS from its seed URLs (the first seed's serve
//! every shard) and `sharded_pubsub(ShardedPubSub::{Auto, On, Off})`.
//!
//! # How a Sentinel node follows failovers
//!
//! It asks every sentinel
//! `SENTINEL GET-MASTER-ADDR-BY-NAME` about once a second (as Redisson does),
//! at once when a sentinel publishes `+switch-master`, a connection is lost or
//! a write is refused with `READONLY` (then every 100 ms for 10 s), and before
//! every new connection; a majority's answer wins. A new
//! connection checks `ROLE` says `master`. Once a new primary is known, every
//! connection to the former one is unusable (no request goes there, although
//! it stays a writable primary for 10-20 s after a `SENTINEL FAILOVER`), the
//! shared subscription moves to the new primary, and every waiter re-checks.
//! When no sentinel answers, the node keeps the primary it knows; with none
//! known, requests fail with `Unavailable::NoPrimary` within the connect
//! timeout, not after a hang. Switches are logged (`info`) and counted
//! (`multilock_primary_switches_total`). The new primary has a new `run_id`, so fencing treats a failover as
//! it treats a restart: the client repairs the token counters there before it
//! trusts them. `cargo run --release --example failover_time` measures the
//! time from a primary's death (SIGKILL, or `SENTINEL FAILOVER`) to the first
//! acquire on the new primary against Redis's own failover time: within
//! about 10 ms of it (`BENCHMARKS.md`, in the repository); and, beside it, the
//! time to the grant of a waiter in `lock()` whose holder unlocked at the
//! fault (its wait goes on through the failover, and the release reaches
//! the new primary in the background).
//!
//! # What it does not guarantee
//!
//! Replication is asynchronous. A lock
//! granted by the primary and not yet copied to the replica that is promoted
//! is gone after the failover, and a second client can then be granted the
//! same lock while the first still holds it (`lost()` fires for the first
//! holder once its renewal finds the hold missing). `with_replica_sync`
//! (`WAIT`) narrows that window, not closes it. So a Sentinel group counts as
//! **one** member of a MultiLock or RedLock, like a standalone server: it
//! survives the loss of its primary (availability), not the loss of writes.
//! For mutual exclusion that survives a failover, use a RedLock of 3 or 5
//! independent groups (or servers): `cargo run --example failure_modes` ends
//! with a table where one Sentinel node grants the lock twice after a real
//! failover with lagging replicas, and a RedLock over three Sentinel groups,
//! the same fault on one of them, does not.
//!
//! A RedLock of three Sentinel groups (feature `sentinel`), each group one
//! member:
//!
//! ```rust,no_run
//! # #[cfg(feature = "sentinel")]
//! # async fn demo(client: multilock::Client) -> multilock::Result<()> {
//! use multilock::Node;
//!
//! let groups = [
//!     ["redis://10.0.1.1:26379", "redis://10.0.1.2:26379", "redis://10.0.1.3:26379"],
//!     ["redis://10.0.2.1:26379", "redis://10.0.2.2:26379", "redis://10.0.2.3:26379"],
//!     ["redis://10.0.3.1:26379", "redis://10.0.3.2:26379", "redis://10.0.3.3:26379"],
//! ];
//! let nodes = groups
//!     .iter()
//!     .map(|sentinels| Node::sentinel("mymaster", *sentinels).build())
//!     .collect::<Result<Vec<_>, _>>()?;
//! let red = client.red_lock_on(&nodes, "orders:42")?;
//! let guard = red.lock().await?;
//! guard.unlock().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # How a Cluster node routes and follows
//!
//! Every key of a lock shares the
//! slot of `{name}` (Redisson's naming), so each lock's requests go to one
//! primary, over that shard's own pool; a name whose braces would split its
//! keys over two slots (`a{b`) is refused when the lock is built
//! (`InvalidArgument`), not with `CROSSSLOT` at runtime. The slot map comes
//! from a vote, about once a second and at once on a `MOVED`, a `READONLY`
//! or a lost connection: every known shard and seed is asked at once for its
//! `CLUSTER SLOTS` and `CLUSTER NODES` (on one connection per node, kept
//! from one poll to the next), and each slot goes to the primary
//! with the highest config epoch, as Redis Cluster itself settles it. The
//! vote ends when more than half of the primaries it names have answered
//! (a frozen node is not waited for; one node asked under two names is one
//! vote), or every node has; a request answered `CLUSTERDOWN` waits for it
//! no longer than its response timeout. A primary cut off on the minority
//! side of a partition keeps claiming its slots at its old epoch; the first
//! answer would trust it, the vote does not, and the subscription's
//! connection starts from the shards the vote chose, never from the seeds
//! while a shard is known (`tests/suite/cluster_partition.rs` puts it first
//! among the seeds, cut off the cluster bus, and shows that once its replica
//! is promoted, no lock script reaches it and a waiter is woken on the
//! replica). Only answers that prove a request did not run are sent again, within the response timeout: `MOVED` (to the new
//! owner, at once), `ASK` (to the migration's target, after `ASKING`),
//! `TRYAGAIN`, `CLUSTERDOWN` and `READONLY` (after a pause and a fresh map). A
//! request whose connection broke is an unknown outcome and is settled by the
//! lock's rollback, as on any node: that is why redis-rs's cluster connection
//! is not used for commands (it re-sends such a request, and a new primary
//! that had the first copy replicated would count the hold twice; a test
//! checks no grant is ever counted twice across a failover). A waiting
//! acquire whose slot has no settled primary (`Unavailable::NoShard`: a
//! failover or a migration under way) asks again every 100 ms within its
//! wait. During a slot migration, a request whose keys are split between the
//! two nodes, or absent, gets `TRYAGAIN` until the migration ends; the
//! acquire declares its hold latch and the release its channel (as
//! Redisson's does), so acquiring a free lock of a migrating slot waits for
//! `SETSLOT NODE`, while a held lock keeps being renewed (`ASK` followed); a
//! release meanwhile returns `NoShard` and is retried in the background until
//! the migration has ended (`tests/suite/cluster_migration.rs`).
//! Scripts are loaded on every new connection, so a promoted replica (no
//! replicated script cache) never answers `NOSCRIPT` to a lock request. The
//! renewal batches are one slot each.
//!
//! # Sharded pub/sub
//!
//! Waiters use **sharded pub/sub** on Redis 7+ (`SSUBSCRIBE`; releases pass
//! `spublish` to the scripts, as Redisson 3.22+ does in cluster mode, so a
//! Redisson waiter hears our releases and ours hear Redisson's), on a
//! redis-rs cluster connection that carries nothing but subscriptions and
//! PING (a demoted shard's `sunsubscribe` push can otherwise be taken as a
//! command's reply). When the slot map changes hands, or a shard ends a
//! subscription we still want (the `sunsubscribe` a demoted primary sends,
//! after which redis-rs forgets it), the channel is subscribed again where its
//! slot lives now, and its waiters re-check. `ShardedPubSub::Off` keeps the
//! classic, cluster-wide `PUBLISH`/`SUBSCRIBE`: every client of a name must use
//! the same kind. Replica sync (`WAIT`) goes on the exclusive connection that
//! sent the grant, to the key's own primary (a bare `WAIT` on a cluster
//! client would go to every primary). Fencing counts every change of hands,
//! and every shard's restart, as a restart of the node. A cluster is **one**
//! member of a MultiLock or RedLock, for the same reason as a Sentinel group:
//! its failovers are asynchronous and can lose the last grants (`lost()` fires
//! for the holder). A RedLock or MultiLock of 3 or 5 clusters works
//! (`tests/suite/cluster_groups.rs`).
//!
//! # TLS
//!
//! `rediss://` seeds make every shard connection and the sharded
//! subscription TLS (`tests/suite/cluster_tls.rs`); a Sentinel node's
//! `.tls(true)` does the same for its data nodes
//! (`tests/suite/sentinel_tls.rs`). A server whose certificate a private CA
//! signed is trusted with `NodeBuilder::tls_root_cert(pem)` (any node kind),
//! or, for a URL or seed, `#insecure` skips the check. Not built here:
//! Sentinel groups and clusters in containers (their nodes announce the
//! addresses they see, which Docker's port mapping breaks; the kit starts
//! them as processes).
