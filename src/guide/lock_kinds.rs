//! The lock kinds: Redisson's reentrant lock, its fair lock and its
//! read-write lock, in Redisson's format, alone or as parts of a
//! [`MultiLock`] or [`RedLock`].
//!
//! # Lock kinds
//!
//! **Lock kinds** (Redisson's family, in its format): `client.lock(..)` is
//! Redisson's `RLock`; `client.fair_lock(node, name)` is its `getFairLock`, a
//! `Lock` granted in the order its waiters asked;
//! `client.read_write_lock(node, name)` is its `getReadWriteLock`, whose
//! `read()` and `write()` are `Lock`s. Every kind works alone and as a part of
//! `client.multi_lock(..)` / `client.red_lock(..)`, with every guarantee of the guides (starting with
//! [`semantics`](super::semantics)):
//!
//! ```rust,no_run
//! async fn demo(client: multilock::Client, nodes: Vec<multilock::Node>) -> multilock::Result<()> {
//!     let tickets = client.fair_lock(&nodes[0], "tickets")?; // FIFO on one node
//!     let guard = tickets.lock().await?;
//!     guard.unlock().await?;
//!     let parts = nodes.iter().map(|n| client.fair_lock(n, "tickets")).collect::<Result<Vec<_>, _>>()?;
//!     let red = client.red_lock(parts)?; // a majority of fair queues
//!     if let Some(guard) = red.try_lock_for(std::time::Duration::from_secs(2), None).await? {
//!         guard.unlock().await?;
//!     }
//!     let prices = client.read_write_lock(&nodes[0], "prices")?;
//!     let (a, b) = (prices.read().lock().await?, prices.read().lock().await?); // readers share
//!     a.unlock().await?;
//!     b.unlock().await?;
//!     let writing = prices.write().lock().await?; // alone
//!     writing.unlock().await?;
//!     Ok(())
//! }
//! ```
//!
//! # Fair locks
//!
//! Fair locks queue their waiters in Redisson's list and deadline set
//! (`redisson_lock_queue:{name}`, `redisson_lock_timeout:{name}`); a release
//! wakes only the head, on its own channel. A waiter whose wait ends without
//! a grant (its deadline, an error, or the future dropped, at any point)
//! leaves the queue and moves the waiters behind it up: a cancelled waiter
//! never blocks the next one (Redisson #5019; 10,000 waiters cancelled at
//! random points leave nothing, `fair::ten_thousand_cancelled_waiters_leave_nothing_in_the_queue`).
//! A waiter that dies keeps its turn for its share of the queue (its own
//! wait, or `with_queue_wait`, 5 minutes by default, for a wait until
//! granted), then the queue drops it; inside a MultiLock or RedLock each
//! part queues for the acquire's own wait too (the parts are asked at once,
//! so each waits the whole of it), and a `try_lock()` with no wait does not
//! queue at all, as Redisson's `tryLock()`; waiters re-poll after the queue's estimate, so a dead head or an
//! expired holder costs time, never a hang. Inside a MultiLock or RedLock,
//! a waiter keeps its places across rounds and leaves every queue when its
//! acquire ends; a lost round releases its grants, so on those nodes it
//! queues again at the tail: fairness there is per node, best effort.
//!
//! # Read-write locks
//!
//! Read-write locks keep Redisson's hash (`mode`, a read count per
//! owner, the writer's `…:write` count) and one expiring key per read hold.
//! Reads share; a write excludes every other owner; the writer may read,
//! and releasing its write downgrades the lock to its reads. A reader never
//! upgrades: asking for the write lock while holding reads fails at once
//! with `InvalidArgument` (Redisson's would wait for itself forever). A
//! write release wakes every waiter. The watchdog renews only this client's
//! own read keys, so a crashed reader's holds expire and let writers in; a
//! read hold is trusted for its own lease, since another reader's release
//! cuts the hash down to the longest read key left. A read hold lives by its
//! timeout keys, not its hash field: a reader paused past its lease (a
//! stopped process, a GC) whose keys expired while another reader kept the
//! hash alive finds on resume that its hold is gone, however its field still
//! reads: its renewal and `extend` refuse it, `lost()` fires (it had already,
//! when the lease ran out, and the guard stays lost), `hold_count` does not
//! count it, and its unlock returns `NotHeld` (removing the stale field, so
//! it blocks no writer). A writer may already hold the lock by then. Fields
//! are told apart as Redisson does, by the timeout keys they have, never by
//! a `:write` suffix. An owner's read holds
//! are numbered, not named, so each read acquire writes its request's id
//! as its timeout key's value (Redisson writes `1` and reads only TTLs): a
//! release or rollback takes exactly its own key (Redisson takes the
//! last-numbered one, which lets an older, shorter hold's release take a
//! newer, longer hold's key; taking "the one that expires first" took an
//! expired hold's number in place of a live one), drops the keys of the
//! owner's holds that already expired, and numbers the rest 1.. again. A
//! write release that downgrades to the writer's reads gives the hash the
//! TTL of the longest live read key, and frees the lock when none is alive. A release still finishing in
//! the background (a dropped guard's, or the nodes a RedLock unlock did not
//! wait for) holds back its owner's next request on that node until it is
//! answered: a reader that drops its read guard and asks for the write lock
//! at once gets it, not "no upgrade".
//!
//! Two limits of Redisson's read-write format (a writer's lease under its
//! own renewed reads; readers beside Redisson's) are in
//! [`limits`](super::limits).
//!
//! [`MultiLock`]: crate::MultiLock
//! [`RedLock`]: crate::RedLock
