//! Who holds a lock: the unit of reentrancy.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// The owner of a hold, the second half of the hash field
/// `<client-uuid>:<owner>`.
///
/// Reentrancy is per owner, like Redisson's per-thread semantics: by default
/// the owner is the current tokio task ([`tokio::task::try_id`]), so nested
/// acquisitions in one task re-enter; outside a task (for example the body of
/// `#[tokio::main]`, which is not a task) it is the current thread. An explicit
/// owner lets several tasks share a hold, or hand one over.
///
/// # Examples
///
/// ```
/// use multilock::Owner;
///
/// let worker = Owner::new("worker-7")?;
/// assert_eq!(worker.as_str(), "worker-7");
/// assert!(Owner::new("").is_err());
/// # Ok::<(), multilock::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner(Arc<str>);

impl Owner {
    /// An explicit owner. Any non-empty string; it should be unique among the
    /// owners of one client.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `id` is empty.
    pub fn new(id: impl AsRef<str>) -> Result<Owner> {
        let id = id.as_ref();
        if id.is_empty() {
            return Err(Error::invalid("owner id must not be empty"));
        }
        Ok(Owner(id.into()))
    }

    /// The current tokio task, else the current thread.
    ///
    /// Tokio reuses the id of a task that has ended. A guard that outlives
    /// the task that took it (moved into another task, say) keeps that id,
    /// and a later task given the same id would re-enter its hold: for a
    /// hold meant to outlive its task, use an explicit owner
    /// ([`Lock::with_owner`](crate::Lock::with_owner)).
    pub fn current() -> Owner {
        // Written into a buffer of the right size, not `format!`: this
        // runs for every acquire.
        use std::fmt::Write;
        let mut id = String::with_capacity(32);
        let _ = match tokio::task::try_id() {
            Some(task) => write!(id, "task-{task}"),
            None => write!(id, "thread-{}", thread_number()),
        };
        Owner(id.into())
    }

    /// The id as written in the hash field.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({})", self.0)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A process-unique number for the current thread (`ThreadId::as_u64` is
/// unstable).
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|n| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_differ() {
        let here = Owner::current();
        let there = std::thread::spawn(Owner::current).join().unwrap();
        assert_ne!(here, there);
        assert_eq!(here, Owner::current());
    }

    #[tokio::test]
    async fn tasks_differ() {
        let a = tokio::spawn(async { Owner::current() }).await.unwrap();
        let b = tokio::spawn(async { Owner::current() }).await.unwrap();
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("task-"));
    }
}
