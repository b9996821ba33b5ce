//! Fencing tokens: how a [`Lock`], a [`MultiLock`] and a [`RedLock`] hand
//! them out, what they guarantee across node restarts and failovers, and
//! what they cost. A lock cannot stop a paused holder from writing late
//! (see [`limits`](super::limits)); a token lets the resource refuse the
//! late write.
//!
//! ```rust,no_run
//! # async fn demo(client: multilock::Client, nodes: Vec<multilock::Node>) -> multilock::Result<()> {
//! let red = client.red_lock_on(&nodes, "orders:42")?.with_fencing();
//! let guard = red.lock().await?;
//! let token = guard.fencing_token(); // Some(..) when fenced: pass it with every write
//! // The storage refuses a token lower than the highest it has seen.
//! println!("writing with token {token:?}");
//! guard.unlock().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Fencing tokens, exactly
//!
//! A single-node lock's token is Redisson's:
//! an INCR of `redisson_lock_token:{name}` on acquire (a missing counter
//! starts at the wall-clock floor below, not at 1). A RedLock or MultiLock
//! settles its token after winning: it reads every node's counter, hands
//! out a value above every counter read, and returns the guard only once a
//! quorum holds that value, each node raised to it by this settlement
//! (checked after every write landed). A node a rival settlement raised to
//! the same value first does not count (the raise is atomic, and two
//! quorums share a node), so two holders at once never share a token:
//! holds lost in a restart, or two locks whose names give one counter key
//! (`shared` and `{shared}` are two locks with one
//! `redisson_lock_token:{shared}`, by Redisson's naming). The one that
//! finds its token taken seals a higher one, a random step above the
//! rival's (`fencing::concurrent`).
//!
//! # Vouches and repairs
//!
//! A counter proves something only when its node **vouches** for it: the
//! seal and every repair write, beside the counter, the `run_id` and
//! replication ID of the server they wrote on and the value they left
//! (`multilock_token_vouch:{name}`, in the counter's slot, expiring with
//! it), and the settlement reads the vouch with the counter, in one
//! script, against what the server reports there. A restart, empty or
//! from a stale dump, a Sentinel or Cluster failover (the promoted replica
//! has its own `run_id`), a failback (a primary demoted, resynced and
//! promoted again gets a new replication ID), and a counter set back below
//! what was vouched for (deleted and INCRed, or restored by hand) leave it
//! unvouched, whoever reads it: a client that never saw the node, or
//! forgot the name, cannot take a stale counter as proof, and clients
//! accept each other's seals and repairs. Each client also watches the
//! nodes of the names it has fenced: a node whose `run_id` changed, or
//! whose counter is missing or lower than the client last saw, is repaired
//! at once in the background (it does not wait for a grant), to the highest
//! vouched counter of enough nodes, for every name it has fenced there
//! lately (deferring, for at most a second, to a settlement of the same
//! name under way in this client, whose raises its witnesses could miss),
//! writing only while the node's data is still what it was when the
//! witnesses were read (the same `run_id` and replication ID, read first
//! on the server that holds the counter); a settlement that finds an unvouched counter repairs it with its
//! seal.
//! Replies are read in the order they arrive: a lower reading sent before
//! a higher one was read proves no restart and witnesses nothing.
//!
//! # The guarantee
//!
//! The guarantee, in three parts:
//! - **Inside the proof** (at most N − quorum nodes lose their counters
//!   between two completed repairs, *or fail to answer the settlement*,
//!   counted together: 2 of 5 for a RedLock; a MultiLock, whose every node
//!   holds every token, needs just one intact node answering): tokens of a
//!   name strictly increase, proven by the vouched counters alone, whether a node restarted empty or from a dump older than its
//!   last seal (RDB snapshots, an AOF not synced on every write), and
//!   whichever client asks. `history_checker -- --restarts rolling` kills
//!   and restarts empty one of five nodes about every 3 s, and the model in
//!   `src/fencing/model/` checks the protocol over restarts (empty and from
//!   stale snapshots), lost and reordered messages, and clients new to the
//!   nodes (CI runs both).
//! - **Beyond it** (a new name, or a name whose counters were lost on more
//!   nodes than that), the token comes from the **wall-clock floor**
//!   (microseconds since the Unix epoch) and stays above every counter the
//!   settlement read. It is taken once a quorum answered and the others had
//!   the round's grace (twice the time the quorum took), never by waiting
//!   for every node: a dead master costs a new name that grace, not the
//!   lock. No earlier token exceeds the floor unless a name was granted
//!   more than once per microsecond, or clients' clocks disagree by more
//!   than the time since that name's previous token was settled (every
//!   earlier token sits on a quorum, which shares a node with the quorum
//!   that answered: the clock matters only where that node lost its
//!   counter). So with 2 of 5 counters lost and a third node frozen or
//!   unreachable during a settlement, that token rests on the clock: a
//!   settlement does not wait for a witness that does not answer (the
//!   price would be a name stalled while a node is down). The client logs
//!   a warning when a name it fenced lately (its book forgets a name idle
//!   for 10 s) falls back to the floor, and at debug level otherwise (a
//!   new name, or one idle before all its counters were lost: no client
//!   can tell the two apart then), and counts every floor grant in the
//!   `multilock_fencing_floor_total` metric. Counters written before
//!   vouches existed (an older version of this crate, or set by hand) are
//!   unvouched: each such name's next token comes from the floor once, and
//!   its seal vouches from then on.
//! - **Available while a quorum answers**, inside the proof and beyond it:
//!   a fenced grant never waits for a dead or restarted minority.
//!   `history_checker -- --restarts storm` restarts nodes empty while they
//!   count as up at once (a name's counters may survive on one node), and
//!   `-- --locks fresh` takes a new name on every acquire with a node dead
//!   throughout; the storm fails on a name 3 s without a grant while its
//!   rounds kept being lost for want of a token (5 s for any cause: a key a
//!   release could not reach lives out its lease), the fresh run on a first
//!   grant 3 s after the first try (CI runs both for 60 s; figures in
//!   BENCHMARKS.md). The model checks this too,
//!   for new names, clients that never saw a node, names first fenced
//!   while a node is down, clients that forgot a name,
//!   and restarts beyond the condition; it finds the stalls of the earlier
//!   design, whose floor waited for every node.
//!
//! # Persistence
//!
//! Persistence: any. A restart, with or without a dump, costs a node its
//! vouches until a repair or a seal writes them again; it counts under the
//! condition above until then. The scripts read the `run_id` with
//! `INFO server` (the client already needs it, on connecting): an ACL user
//! for fenced locks needs `INFO`. A counter or a vouch evicted under
//! `maxmemory` is a counter lost, under the same condition: give fenced
//! masters `noeviction`, or memory to spare. What the vouch cannot see:
//! the counter *and* its vouch put back together on the same running
//! server (a `DUMP`/`RESTORE` of both keys by hand, `DEBUG RELOAD` of an
//! older dump): that replays the node's own word, so the node vouches for
//! a counter below tokens it held, and the proof can fail with that one
//! node alone (an audit reproduced a token handed out again). Restore a
//! fenced master through a restart, never by rewriting both keys live.
//!
//! # Counter expiry and memory
//!
//! A RedLock's or MultiLock's counter key (`redisson_lock_token:{name}`
//! on each node) and its vouch (two keys per name and node) expire when no
//! grant of the name renewed them for 30 days
//! (`ClientBuilder::fencing_counter_expiry`, `None` for never), so names
//! used once (`orders:{id}`) do not pile up (Redisson #6510 found 25
//! million); the name then starts again at the floor, above its old
//! tokens. A single-node lock's counter never expires: it is Redisson's
//! `RFencedLock` counter, which a Redisson client INCRs without renewing
//! and would restart at 1. For that reason, set `None` too when a Redisson
//! `RFencedLock` fences the same name on one of a quorum lock's nodes.
//!
//! What a client remembers is bounded by what it uses: a name no request
//! touched for 10 s is forgotten (unless its repair is pending), and the
//! client then knows it as a client that never fenced it does, which the
//! guarantee above allows for (the model checks it: tokens never go
//! back, and grants go on). What it costs is the proof: a forgotten name
//! is not repaired eagerly after a restart, its next grant repairs it, so
//! a restart and a death while it is idle can leave it to the floor for
//! that grant. Its background work holds
//! nodes weakly: once every `Node` and lock on a server is dropped, the
//! client keeps no connection to it (`cargo run --release --example
//! fenced_names`: memory over 100,000 fenced names, in BENCHMARKS.md).
//!
//! [`Lock`]: crate::Lock
//! [`MultiLock`]: crate::MultiLock
//! [`RedLock`]: crate::RedLock
