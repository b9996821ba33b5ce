//! Known limits: read before relying on RedLock. What no lock here can
//! prevent, and what to do about each.
//!
//! # Clocks
//!
//! Validity is measured on this process's monotonic clock (a
//! wall-clock jump here changes nothing), but keys expire on each server's
//! clock: a server clock jumping forward expires a key early. Keep NTP
//! slewing, not stepping; fencing catches the stale write that follows.
//!
//! # Restarts without persistence
//!
//! A node that restarts empty forgets the
//! keys it held, and a second client can then win a majority (the failover
//! suite and `history_checker -- --restarts immediate` show it). Remedy:
//! keep a restarted node out for longer than the longest lease (delayed
//! restart), or run it with AOF `appendfsync always`.
//!
//! # A writer's lease under its own renewed reads
//!
//! Redisson's format
//! gives the hash one TTL. A writer that also reads under the watchdog
//! keeps the hash alive through its read renewals, so a write taken with
//! a fixed lease that runs out stays in the hash (and excludes other
//! readers) for as long as those reads are renewed; the client knows the
//! write is over and sends nothing for it. Release the write, or take it
//! under the watchdog too.
//!
//! # Readers beside Redisson's
//!
//! Redisson's read renewal sets the hash's
//! TTL to its own lease, not to at least it: a Redisson reader that renews
//! and then dies can cut the hash (and our readers' fields in it) down to
//! its lease, while our read guard trusts its own timeout key. Keep read
//! leases of ours no longer than Redisson's `lockWatchdogTimeout` where both
//! read one lock, or read under the watchdog (our renewals restore the
//! hash's TTL every third of the timeout).
//!
//! # Process pauses
//!
//! A holder paused (GC, swap, a stopped VM) past its lease
//! still believes it holds the lock. No lock can prevent that; a **fencing
//! token** lets the resource reject the late write: enable `with_fencing()` and
//! have the storage refuse tokens lower than the highest it has seen
//! (how tokens are made, and what they guarantee: [`fencing`](super::fencing)).
