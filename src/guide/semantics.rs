//! What a hold is, how long it lasts and when it ends: owners and
//! reentrancy, leases and the watchdog, [`Guard::lost`], scoped locking,
//! cancellation, waiting, and what `lock()` waits out.
//!
//! `Lock`, `MultiLock` and `RedLock` share their methods (`lock`,
//! `lock_with_lease`, `try_lock`, `try_lock_for`, `run_locked`,
//! `run_locked_for`, `force_unlock`, `is_locked`, `hold_count`,
//! `remaining_ttl`, `is_held_by_current_owner`, `with_owner`,
//! `with_fencing`, `with_max_hold`, `with_hold_warning`) and all return a [`Guard`], so
//! everything here holds for each of them (see [`DistributedLock`]). How a
//! multi-node round decides is in [`quorum`](super::quorum); the lock kinds
//! (fair, read-write) in [`lock_kinds`](super::lock_kinds); the errors in
//! [`errors`](super::errors).
//!
//! # Reentrancy is asked for, never implied
//!
//! A hold belongs to an
//! [`Owner`], the second half of Redisson's field `<client-uuid>:<owner>`.
//! By default every acquire has an owner of its own ([`Owner::unique`]), so
//! two acquires that are not nested never both hold: two futures of one task
//! (`tokio::join!(work(1), work(2))`, `select!`, a `FuturesUnordered`) wait
//! for each other like two tasks do. An acquire re-enters a hold when (a) its
//! handle is bound to that hold's owner ([`Lock::with_owner`], e.g. with
//! `guard.owner().clone()`, for sharing a hold between tasks or handing it
//! over; `Owner::current()` gives Redisson's per-thread style, per task), or
//! (b) it runs inside the work of a `run_locked`, which is the hold's
//! scope and runs as its owner (as a thread does in Redisson): code the
//! critical section calls re-enters it (and what enclosing `run_locked`s
//! hold), a future beside it does not, and futures joined inside it take
//! each lock in turns (they are siblings, not nested in each other; a
//! re-entry's own `run_locked` is the scope for what it calls, while a
//! re-entry by a bare `lock()` keeps the lock's turn until its guard goes). So a nested `lock.lock()` outside both waits for the outer
//! hold (for ever, with `lock()`): bind the owner or use `run_locked`. A
//! guard carries its owner and unlocks from any task. The "current owner"
//! queries (`hold_count`, `is_held_by_current_owner`) answer for the
//! handle's explicit owner, or inside `run_locked` its hold's owner; a
//! handle with neither says 0 / `false`. Why not the task, as before: async
//! code runs many futures in one task, and Redisson's per-thread rule then
//! lets two of them into one critical section; the wire format is the same
//! either way. **Owner ids** are any non-empty string that does not end with
//! `:write`: that suffix marks a read-write lock's writer field
//! (`<uuid>:<owner>:write`), so a reader with such an id would share its
//! field with another owner's write hold; `Owner::new` refuses it
//! (`InvalidArgument`).
//!
//! ```rust,no_run
//! # async fn demo(client: multilock::Client, node: multilock::Node) -> multilock::Result<()> {
//! let lock = client.lock(&node, "orders:42")?;
//! let outer = lock.lock().await?;
//! // Re-entered: this handle is bound to the outer hold's owner.
//! let inner = lock.with_owner(outer.owner().clone()).lock().await?;
//! inner.unlock().await?;
//! outer.unlock().await?;
//!
//! // Or scoped: code the work calls re-enters the hold.
//! lock.run_locked(|_token| async {
//!     let again = lock.lock().await?; // inside the scope: re-enters
//!     again.unlock().await
//! })
//! .await??;
//! # Ok(())
//! # }
//! ```
//!
//! # Leases
//!
//! Without a lease the watchdog renews the lock every third of the
//! watchdog timeout (one batched script call per node per tick, whatever the
//! number of locks; one bad key never spoils the batch). With a lease it
//! expires after it. A hold never shortens the key's TTL: a re-entry or a
//! partial release with a shorter lease leaves a longer hold alone, and a
//! guard's validity follows what the key holds. A guard whose hold has surely
//! run out sends no release (its unlock returns `NotHeld`), so it can never
//! release a later hold of its owner. [`Guard::extend`] extends a fixed
//! lease while the hold is still proven (never reviving an expired one);
//! `with_max_hold` ([`ClientBuilder::max_hold`] for every lock) caps how long
//! the watchdog renews, so a stuck holder cannot keep a lock forever.
//! `with_hold_warning` ([`ClientBuilder::hold_warning`] for every lock)
//! changes nothing about the hold: a guard still held that long after it
//! was handed out logs one warning (the lock, its owner, its nodes, how
//! long held) and counts one `multilock_hold_warnings_total`, once per
//! guard (a re-entry's guard is its own; a MultiLock's or RedLock's warns
//! once for the whole hold). A guard unlocked, dropped or lost before then
//! never warns, and without the setting nothing is started at all.
//!
//! # `Guard::lost`
//!
//! [`Guard::lost`] resolves once fewer nodes than the quorum (one, for a
//! `Lock`) can prove their hold: a renewal found the key gone, renewals were
//! refused or timed out on too many nodes (within one renewal period), or
//! the lease ran out. A node that answers slowly, within its timeout, still
//! proves its hold. `lost()`, [`Guard::valid_until`] and [`Guard::nodes`]
//! are one judgement: once lost, `valid_until()` is `None` and `nodes()`
//! empty, for good. A proof that broke stays broken: a renewal that gets
//! through after a pause (of this process or of a node) does not revive the
//! guard, since someone else may have held the lock in between.
//!
//! # Scoped locking
//!
//! `run_locked(|token| work)` acquires, runs the work
//! with the fencing token, and releases. If `lost()` fires first, the work
//! is dropped at its next await point and the call returns
//! [`Error::LockLost`]; a request the work had already sent may still be
//! applied, which is what the fencing token is for.
//!
//! # Cancellation
//!
//! Every async method documents its cancel safety. Dropping an
//! acquire future at any point leaves nothing held: a request in flight is
//! completed in the background and a grant is released; a rollback undoes
//! only what was applied (a re-entrant acquire that never ran cannot lower
//! the outer hold). A re-entry leaves a latch its rollback reads; a fresh
//! hold writes only Redisson's hash, and its rollback knows it by the hold
//! count against the holds the client has on record. A grant of the same
//! owner still in flight during such a rollback is rolled back and tried
//! again, never trusted. Dropping a guard releases it; renewal stops before
//! the release is sent, so no renewal outlives an unlock. A release whose
//! reply did not come, or that was not applied for a passing reason (its node
//! was down, loading its data, or its Cluster slot migrating), is retried in
//! the background for up to a minute (its caller, whose guard is spent, gets
//! the error), and until it is answered the owner's next request of
//! that lock on that node waits for it (at most the node's response
//! timeout, then a `NodeUnavailable` error): a node restarted empty has lost
//! the release's latch, so a retry landing after the owner's next grant
//! there would release the new hold (`tests/suite/late_release.rs`). A
//! release or rollback still unanswered after that minute is given up and
//! *buried* before the owner's next request there goes: its latch is written
//! to last 30 minutes (longer than TCP retransmits a segment), so a copy
//! held up in a partitioned link that lands later finds it and changes
//! nothing, where it would have taken the owner's next hold.
//!
//! # Waiting
//!
//! Waiting is driven by pub/sub: one subscription connection per node,
//! whatever the number of waiters, kept alive by a periodic PING; waiters
//! re-check when it comes back after a reconnect, and every wait is also
//! bounded by the holder's TTL, so a lost message costs time, never a hang.
//! A release wakes one local waiter, and waiters that subscribe together
//! share the attempt that follows the subscription: N tasks arriving at a
//! held lock send N + 1 attempts before they park, not 2N. A bounded wait
//! (`try_lock_for`) ends by its deadline even on a black-holed node.
//!
//! # In a service, use `try_lock_for`
//!
//! `lock()` keeps Redisson's
//! semantics, for every lock kind (reentrant, fair, read, write, MultiLock,
//! RedLock) and every node kind: it waits until granted, and a node's
//! failures are part of the wait. A connection refused or lost, a timeout,
//! a suspect node, a standalone server restarting in place, a Sentinel
//! group naming no primary yet, a Cluster shard with no primary during a
//! failover: each is waited out (the node logs each change of its health
//! once), and a fair waiter keeps its place in the queue wherever the
//! queue survived. Only permanent errors end it ([`Error::is_permanent`]:
//! a wrong password, an ACL refusal, a key of another type, a plain `ERR`
//! such as a Cluster node seeded with a server whose cluster support is
//! off), and, for a single-node lock with replica sync, a grant its
//! replicas did not acknowledge in time (`ReplicaSync`). A server busy running a script (`BUSY`), out of memory (`OOM`) or
//! refusing writes after a failed snapshot (`MISCONF`) is waited out, like
//! a node that is down. `try_lock_for(wait, lease)` does the same within
//! its wait and returns `Ok(None)` when the lock was not granted in time
//! (also when the node was down all along; a RedLock or MultiLock that
//! lost its last round to node failures returns `NoQuorum`); `try_lock()`,
//! one attempt with no wait, reports a node's failure at once. An attempt
//! in flight when the node failed is settled (rolled back exactly if it
//! may have been applied) before the wait goes on: never counted twice.
//! `tests/suite/ride_through.rs` kills and fails over Sentinel and Cluster
//! primaries, and restarts a standalone server in place, under waiters of
//! every kind, ten times each.
//!
//! ```rust,no_run
//! # async fn demo(client: multilock::Client, nodes: Vec<multilock::Node>) -> multilock::Result<()> {
//! use std::time::Duration;
//!
//! let red = client.red_lock_on(&nodes, "orders:42")?.with_fencing();
//! // Wait at most 2 s; hold for at most 10 s; the work gets the token.
//! match red.run_locked_for(Duration::from_secs(2), Some(Duration::from_secs(10)), |token| async move {
//!     token // write with it
//! })
//! .await
//! {
//!     Ok(Some(token)) => println!("done with token {token:?}"),
//!     Ok(None) => println!("not granted in time: try later"),
//!     Err(e) if e.is_permanent() => return Err(e), // configuration: fix it
//!     Err(e) => println!("try again: {e}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! [`Guard`]: crate::Guard
//! [`DistributedLock`]: crate::DistributedLock
//! [`Owner`]: crate::Owner
//! [`Owner::unique`]: crate::Owner::unique
//! [`Lock::with_owner`]: crate::Lock::with_owner
//! [`Guard::extend`]: crate::Guard::extend
//! [`ClientBuilder::max_hold`]: crate::ClientBuilder::max_hold
//! [`ClientBuilder::hold_warning`]: crate::ClientBuilder::hold_warning
//! [`Guard::lost`]: crate::Guard::lost
//! [`Guard::valid_until`]: crate::Guard::valid_until
//! [`Guard::nodes`]: crate::Guard::nodes
//! [`Error::LockLost`]: crate::Error::LockLost
//! [`Error::is_permanent`]: crate::Error::is_permanent
