//! What `cargo bench --bench locks` measures and what it shows on any
//! machine: wire cost per operation, multi-node latency, readers, hand-off,
//! a frozen minority, and Redis Cluster.
//!
//! # The benchmark
//!
//! `cargo bench --bench locks` starts 5 `redis-server` processes and measures, on
//! the same processes in the same run, this crate, **rslock** and **the limit**:
//! a bare redis-rs connection sending **Redisson 3.24+'s** lock protocol
//! (written from its wire facts: the acquire, the unlock that reads and writes
//! its latch, and the client's `DEL` of the latch after the reply, sent without
//! waiting for its answer as Netty writes it), to all nodes at once when there
//! are several. The crate's own scripts on the same bare
//! connections are a second reference, and the servers' CPU per operation
//! (`INFO cpu`) is printed beside the figures. Section (g) puts every server
//! behind the test kit's latency proxy at 0.2, 0.5 and 1 ms one-way, where a
//! 2-core machine's CPU no longer hides the round trips. It prints a summary
//! and writes the full tables to `target/bench/results.md` and latency CDFs to
//! `target/bench/latency_cdf.svg`.
//!
//! # What it shows
//!
//! What it shows, on any machine:
//!
//! - An uncontended lock+unlock is two script calls per node, nothing else on
//!   the wire (no PING per pool checkout); Redisson 3.24+ sends three. The
//!   server runs 10 commands for it (the two calls and those inside them)
//!   against Redisson's 12: a fresh hold writes the hash and its TTL only, and
//!   each release deletes the latches of the node's earlier releases (the `DEL`
//!   Redisson's client sends as a command of its own). Section (c) compares
//!   the servers' CPU per lock+unlock at one load for every contender: in a
//!   closed loop on a machine whose cores the client shares with the server,
//!   a client that does more per operation feeds the server fewer commands
//!   per wake-up, and each costs it more.
//!   Connections use TCP_NODELAY, as Redisson's do, and a node's requests
//!   pipeline on one shared connection (`NodeBuilder::shared_connections`
//!   raises it for a client whose own CPU is the limit). A request that
//!   finds others in flight on its connection is handed to one task per
//!   connection that passes on all that queued at once, so they leave in one
//!   write, as redis-rs's cluster connection does for every request; a lone
//!   request goes straight to the connection and pays no hop. With 64 tasks
//!   through a cluster that cut the client's CPU per lock+unlock by a quarter
//!   to a third (`BENCHMARKS.md`). A connection under Nagle's algorithm
//!   (below) sends every request straight: the kernel coalesces its writes,
//!   and the hop would only add its own cost.
//! - The client's own CPU per lock+unlock is about a bare connection's with
//!   the same socket (`cargo run --release --example client_cpu`: 64 tasks
//!   on their own locks, against a redis-rs connection sending Redisson's
//!   protocol). The socket matters more than the code: on loopback most of a
//!   client's CPU is the kernel's work per packet, and a connection with
//!   TCP_NODELAY sends a packet per request where Nagle's algorithm (redis-rs's
//!   default) coalesces them. `NodeBuilder::tcp_nodelay(false)` turns it on
//!   for a client whose CPU is the limit, at the cost of up to a round trip
//!   per request while an earlier one is unacknowledged.
//! - A multi-node acquire costs about the slowest node, not the sum: requests go
//!   to every node at once.
//! - Readers of one read-write lock do not wait for each other: 64 readers of
//!   one name get as many reads per second as a bare connection sending the
//!   same scripts, and 2.5× what Redisson's own read-lock scripts get (its read
//!   unlock reads every reader's timeout key). A read still costs the server
//!   more than a reentrant lock+unlock, since Redisson's format keeps a timeout
//!   key per read hold and the hash's TTL in step with them, and all readers
//!   share one hash. Where the server's CPU is the bound (loopback on 2 cores),
//!   reads per second are about two thirds of what as many independent locks
//!   get; with the server 0.5 ms away, 0.9×.
//! - A waiter gets a released lock about one round trip after the release
//!   (pub/sub), not after a polling delay; 10,000 waiting tasks on one node use
//!   one subscription connection; 10,000 held locks cost one batched renewal
//!   call per node per tick per 500 locks.
//! - A RedLock with a minority of its masters frozen (SIGSTOP: what a network
//!   black hole looks like) or dead costs about what it costs healthy, and
//!   contenders keep their healthy throughput: once a node is suspect, rounds
//!   neither send to it nor wait for it (section (f) of the benchmark measures
//!   it against the healthy state and against rslock, which pays the node
//!   timeout on every lock and unlock while a node is frozen).
//! - rslock is faster uncontended: its protocol is lighter than Redisson's
//!   (`SET NX PX` against a hash, an unlock latch and a PUBLISH). Compatibility
//!   with Redisson services is the price, and the pub/sub hand-off is what it
//!   buys: under contention rslock either sleeps through its retry delay or
//!   spins and burns several times the Redis CPU.
//! - On a Redis Cluster (section (i), a cluster of 3 primaries and 3 replicas),
//!   a lock+unlock through `Node::cluster` takes about what a bare redis-rs
//!   `ClusterConnection` sending the same scripts takes: its request goes
//!   straight to the shard's connection, without the cluster client's task
//!   hop. Many concurrent tasks get fewer lock+unlocks per second than that
//!   client, which batches its writes per shard.
//!
//! Dated figures of full runs, with the machine they ran on, are in
//! `BENCHMARKS.md` (in the repository).
