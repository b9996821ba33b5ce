//! Redisson's read-write lock: two [`Lock`]s over one hash.

use super::Lock;

/// A read-write lock, compatible with Redisson's `getReadWriteLock`: its
/// [`read`](ReadWriteLock::read) lock is shared, its
/// [`write`](ReadWriteLock::write) lock exclusive. Both are [`Lock`]s, with
/// every method and guarantee of one (reentrancy per owner, lease or
/// watchdog, `lost()`, idempotent unlock, cancel safety, fencing on the
/// write lock), and both can be parts of a [`MultiLock`](crate::MultiLock)
/// or a [`RedLock`](crate::RedLock).
///
/// The lock is a hash named `name` with `mode` (`read` or `write`), a read
/// count per reader `<client-uuid>:<owner>`, and the writer's count under
/// `<client-uuid>:<owner>:write`. Each read hold has its own expiring key
/// (`{name}:<client-uuid>:<owner>:rwlock_timeout:<n>`), so a crashed
/// reader's holds expire on their own and unblock writers; the watchdog
/// renews only this client's own. Waiters of both kinds listen on
/// `redisson_rwlock:{name}`: a write release wakes them all, a read release
/// that frees the lock wakes one.
///
/// The writer may take reads; releasing its write then leaves the lock in
/// read mode (a downgrade). A reader never upgrades: asking for the write
/// lock while holding reads of it fails at once with
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument), instead of
/// waiting for its own reads forever. Both rules are about one owner's
/// holds (see [`Owner`](crate::Owner)): acquires through halves bound to
/// one owner ([`ReadWriteLock::with_owner`]), or made inside the work of a
/// `run_locked` of either half. Without that, a read and a write of one
/// task are two owners, and the write waits for the read like any other
/// writer.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> multilock::Result<()> {
/// use multilock::{Client, Node};
/// let client = Client::new();
/// let node = Node::new("redis://127.0.0.1:6379")?;
/// let prices = client.read_write_lock(&node, "prices")?;
/// let reading = prices.read().lock().await?;   // shared with other readers
/// reading.unlock().await?;
/// let writing = prices.write().lock().await?;  // alone
/// writing.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ReadWriteLock {
    read: Lock,
    write: Lock,
}

impl ReadWriteLock {
    pub(crate) fn new(read: Lock, write: Lock) -> ReadWriteLock {
        ReadWriteLock { read, write }
    }

    /// The lock's name (the Redis key of its hash).
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// The shared lock: held by any number of readers at once, never
    /// together with another owner's write.
    pub fn read(&self) -> &Lock {
        &self.read
    }

    /// The exclusive lock: held by one writer, with no reader but the
    /// writer itself.
    pub fn write(&self) -> &Lock {
        &self.write
    }

    /// Both halves bound to `owner` ([`Lock::with_owner`]): its writes may
    /// read, and its reads are refused the write (no upgrade).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(prices: multilock::ReadWriteLock) -> multilock::Result<()> {
    /// let job = prices.with_owner(multilock::Owner::new("repricer")?);
    /// let writing = job.write().lock().await?;
    /// let reading = job.read().lock().await?; // the writer reads
    /// writing.unlock().await?;                // downgraded: still read-locked
    /// reading.unlock().await?;
    /// # Ok(()) }
    /// ```
    #[must_use = "this returns a new handle and leaves the original as it was"]
    pub fn with_owner(&self, owner: crate::Owner) -> ReadWriteLock {
        ReadWriteLock {
            read: self.read.with_owner(owner.clone()),
            write: self.write.with_owner(owner),
        }
    }
}
