//! Who holds a lock: the unit of reentrancy, and the scopes in which an
//! acquire re-enters a hold instead of waiting for it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::error::{Error, Result};

/// The suffix Redisson's read-write lock gives the writer's hash field
/// (`<client-uuid>:<owner>:write`): no owner id may end with it, or its
/// reader field would be some other owner's writer field.
const WRITER_SUFFIX: &str = ":write";

/// The owner of a hold, the second half of the hash field
/// `<client-uuid>:<owner>`.
///
/// Reentrancy is per owner, as in Redisson, where the owner is the thread.
/// Here re-entry is what the caller asks for, never what task identity
/// implies: by default every acquire has an owner of its own
/// ([`Owner::unique`]), so two acquires of one lock exclude each other even
/// when they run in one task (two futures joined with `tokio::join!`,
/// `select!`, a `FuturesUnordered`). An acquire re-enters a hold when
/// - its handle is bound to that hold's owner
///   ([`Lock::with_owner`](crate::Lock::with_owner), for example with
///   [`Guard::owner`](crate::Guard::owner)): for sharing a hold between
///   tasks, handing it over, or Redisson's per-thread style with
///   [`Owner::current`];
/// - or it runs inside the work of a `run_locked`
///   ([`Lock::run_locked`](crate::Lock::run_locked)), which runs as its
///   hold's owner, as a thread does in Redisson: code called from the
///   critical section re-enters the lock it runs under (and what enclosing
///   `run_locked`s hold). Futures joined inside the work are siblings, not
///   nested in each other: they take each lock in turns, the second
///   waiting for the first's guard to go. A re-entry's own `run_locked` is
///   the scope for what it calls in turn, so a re-entry by a bare `lock()`
///   that is still held makes a nested `lock()` of the same lock wait.
///
/// # Examples
///
/// ```
/// use multilock::Owner;
///
/// let worker = Owner::new("worker-7")?;
/// assert_eq!(worker.as_str(), "worker-7");
/// assert!(Owner::new("").is_err());
/// assert!(Owner::new("job:write").is_err()); // reserved for the writer's field
/// assert_ne!(Owner::unique(), Owner::unique());
/// # Ok::<(), multilock::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner(Arc<str>);

impl Owner {
    /// An explicit owner: any non-empty string that does not end with
    /// `:write`. It should be unique among the owners of one client.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `id` is empty, or ends with `:write`:
    /// a read-write lock writes the writer's hold under
    /// `<client-uuid>:<owner>:write`, so a reader with such an id would
    /// share its field with another owner's write hold (Redisson's format
    /// has no other way to tell them apart).
    pub fn new(id: impl AsRef<str>) -> Result<Owner> {
        let id = id.as_ref();
        if id.is_empty() {
            return Err(Error::invalid("owner id must not be empty"));
        }
        if id.ends_with(WRITER_SUFFIX) {
            return Err(Error::invalid(format!(
                "owner id {id:?} ends with {WRITER_SUFFIX:?}, which marks a read-write lock's writer field"
            )));
        }
        Ok(Owner(id.into()))
    }

    /// An owner no other call returns: what an acquire through a handle
    /// without an owner of its own holds for. Named after the task (or
    /// thread) that made it, for whoever reads the lock's hash, with a
    /// process-wide sequence number: `task-12.7`.
    pub fn unique() -> Owner {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Owner::named_after_caller(Some(n))
    }

    /// The current tokio task, else the current thread: Redisson's
    /// per-thread reentrancy, for a handle bound to it with
    /// [`Lock::with_owner`](crate::Lock::with_owner). Every acquire of
    /// such a handle in one task re-enters, sibling futures of that task
    /// included.
    ///
    /// Tokio reuses the id of a task that has ended. A guard that outlives
    /// the task that took it (moved into another task, say) keeps that id,
    /// and a later task given the same id would re-enter its hold.
    pub fn current() -> Owner {
        Owner::named_after_caller(None)
    }

    fn named_after_caller(sequence: Option<u64>) -> Owner {
        // Written into a buffer of the right size, not `format!`: this
        // runs for every acquire.
        use std::fmt::Write;
        let mut id = String::with_capacity(40);
        let _ = match tokio::task::try_id() {
            Some(task) => write!(id, "task-{task}"),
            None => write!(id, "thread-{}", thread_number()),
        };
        if let Some(n) = sequence {
            let _ = write!(id, ".{n}");
        }
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

/// One lock a `run_locked` holds: its node's id and its key.
pub(crate) type LockId = (u64, Arc<str>);

/// The hold of a `run_locked` whose work the current future runs in: its
/// owner, the locks it holds, and a turn per lock that re-entries made in
/// its work take one at a time.
struct Scope {
    owner: Owner,
    holds: Vec<LockId>,
    turns: Mutex<HashMap<LockId, Arc<Semaphore>>>,
}

impl Scope {
    /// The turn of lock `id` in this scope, made on first use.
    fn turn(&self, id: LockId) -> Arc<Semaphore> {
        let mut turns = self.turns.lock().unwrap();
        turns
            .entry(id)
            .or_insert_with(|| Arc::new(Semaphore::new(1)))
            .clone()
    }
}

tokio::task_local! {
    /// The scopes the current future runs in (innermost last). Set only
    /// while that work is polled, so a sibling future of the same task
    /// (beside the `run_locked`, in a `join!`) does not see it, nor does a
    /// task spawned from it.
    static SCOPES: Arc<Vec<Arc<Scope>>>;
}

/// Who an acquire holds for, as [`resolve`] decided: and inside a
/// `run_locked` scope, the turns it must take first.
pub(crate) struct Resolved {
    pub(crate) owner: Owner,
    /// In one order for everyone (by address), so two acquires that share
    /// locks cannot each wait for a turn the other took.
    turns: Vec<Arc<Semaphore>>,
}

/// A re-entry's turns in its `run_locked` scope, kept by its guard: two
/// futures inside one scope (joined in its work) are siblings, not nested
/// in each other, so they take a lock one after the other, never together.
/// The re-entry's own `run_locked` opens a scope of its own for what it
/// calls.
#[derive(Debug)]
pub(crate) struct Turn {
    /// Held for their drop: the turns are given back with the guard.
    _permits: Vec<OwnedSemaphorePermit>,
}

impl Resolved {
    /// Waits for this acquire's turns in its scope (at once outside one),
    /// until `deadline` (`None`: as long as it takes). `None`: the deadline
    /// came first.
    ///
    /// Cancel safe: turns not all taken are given back.
    pub(crate) async fn take_turn(&self, deadline: Option<Instant>) -> Option<Turn> {
        match deadline {
            None => Some(self.wait_turn().await),
            Some(deadline) => tokio::time::timeout_at(deadline, self.wait_turn())
                .await
                .ok(),
        }
    }

    /// [`Resolved::take_turn`] with no deadline.
    pub(crate) async fn wait_turn(&self) -> Turn {
        let mut permits = Vec::with_capacity(self.turns.len());
        for turn in &self.turns {
            // The semaphores are never closed.
            if let Ok(permit) = turn.clone().acquire_owned().await {
                permits.push(permit);
            }
        }
        Turn { _permits: permits }
    }
}

/// The owner an acquire of the locks `ids` holds for: `explicit` when the
/// handle has one. Else, inside the work of a `run_locked`, that hold's
/// owner (the innermost scope's), as a thread is in Redisson: the acquire
/// re-enters what the scopes hold, taking each lock's turn in the
/// innermost scope of that owner holding it (or, for a lock no scope
/// holds, in the outermost one of that owner), so futures joined inside a
/// scope take a lock one at a time. Else a fresh owner.
pub(crate) fn resolve<'a>(
    explicit: Option<&Owner>,
    ids: impl IntoIterator<Item = (u64, &'a str)>,
) -> Resolved {
    if let Some(owner) = explicit {
        return Resolved {
            owner: owner.clone(),
            turns: Vec::new(),
        };
    }
    let scoped = SCOPES.try_with(|scopes| {
        let owner = scopes.last()?.owner.clone();
        let mine: Vec<&Arc<Scope>> = scopes.iter().filter(|s| s.owner == owner).collect();
        let mut turns: Vec<Arc<Semaphore>> = ids
            .into_iter()
            .map(|(node, name)| {
                let holder = mine
                    .iter()
                    .rev()
                    .find(|scope| scope.holds.iter().any(|(n, k)| *n == node && **k == *name))
                    .unwrap_or(&mine[0]);
                holder.turn((node, name.into()))
            })
            .collect();
        turns.sort_by_key(|turn| Arc::as_ptr(turn) as usize);
        turns.dedup_by(|a, b| Arc::ptr_eq(a, b));
        Some(Resolved { owner, turns })
    });
    scoped.ok().flatten().unwrap_or_else(|| Resolved {
        owner: Owner::unique(),
        turns: Vec::new(),
    })
}

/// Runs `work` as the scope of `owner`'s holds of `ids`: acquires inside it
/// (without an owner of their own) hold for `owner` and re-enter those
/// holds, each lock one future at a time.
pub(crate) async fn within<T>(
    ids: impl IntoIterator<Item = LockId>,
    owner: &Owner,
    work: impl Future<Output = T>,
) -> T {
    let mut scopes: Vec<Arc<Scope>> = SCOPES
        .try_with(|scopes| scopes.to_vec())
        .unwrap_or_default();
    scopes.push(Arc::new(Scope {
        owner: owner.clone(),
        holds: ids.into_iter().collect(),
        turns: Mutex::default(),
    }));
    SCOPES.scope(Arc::new(scopes), work).await
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

    #[tokio::test]
    async fn unique_owners_differ_within_one_task() {
        let (a, b) = tokio::spawn(async { (Owner::unique(), Owner::unique()) })
            .await
            .unwrap();
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("task-"), "{a}");
        assert!(!a.as_str().ends_with(WRITER_SUFFIX));
    }

    #[test]
    fn an_owner_id_that_ends_like_a_writer_field_is_refused() {
        assert!(matches!(
            Owner::new("job:write"),
            Err(Error::InvalidArgument(_))
        ));
        assert!(Owner::new("job:write:1").is_ok());
        assert!(Owner::new("writer").is_ok());
    }

    /// Inside a scope, every lock resolves to its owner (the work runs as
    /// the hold's owner); siblings beside the scope (joined in the same
    /// task) get fresh owners.
    #[tokio::test]
    async fn a_scope_is_seen_by_its_work_only() {
        let owner = Owner::new("outer").unwrap();
        let lock = (7, Arc::<str>::from("orders"));
        let inside = within([lock.clone()], &owner, async {
            tokio::task::yield_now().await;
            (
                resolve(None, [(7, "orders")]).owner,
                resolve(None, [(7, "other")]).owner,
                resolve(None, [(8, "orders")]).owner,
            )
        });
        let beside = async {
            tokio::task::yield_now().await;
            resolve(None, [(7, "orders")]).owner
        };
        let ((same, other_name, other_node), sibling) = tokio::join!(inside, beside);
        assert_eq!(same, owner);
        assert_eq!(other_name, owner);
        assert_eq!(other_node, owner);
        assert_ne!(sibling, owner);
        let explicit = Owner::new("explicit").unwrap();
        let chosen = within([lock], &owner, async {
            resolve(Some(&explicit), [(7, "orders")]).owner
        })
        .await;
        assert_eq!(chosen, explicit);
    }

    /// Re-entries of one scope take turns: a second one waits for the
    /// first's turn (and gives up at its deadline), a nested scope has
    /// turns of its own, and outside a scope nobody waits.
    #[tokio::test(start_paused = true)]
    async fn re_entries_of_one_scope_take_turns() {
        let owner = Owner::new("outer").unwrap();
        let lock = (7, Arc::<str>::from("orders"));
        assert!(
            resolve(None, [(7, "orders")])
                .take_turn(Some(Instant::now()))
                .await
                .is_some()
        );
        within([lock.clone()], &owner, async {
            let first = resolve(None, [(7, "orders")])
                .take_turn(None)
                .await
                .unwrap();
            let second = resolve(None, [(7, "orders")]);
            let soon = Instant::now() + std::time::Duration::from_millis(10);
            assert!(
                second.take_turn(Some(soon)).await.is_none(),
                "two turns at once"
            );
            within([lock.clone()], &owner, async {
                assert!(
                    resolve(None, [(7, "orders")])
                        .take_turn(Some(Instant::now()))
                        .await
                        .is_some(),
                    "a nested scope waits for nobody"
                );
            })
            .await;
            // Another lock has a turn of its own.
            let other = resolve(None, [(7, "other")]);
            assert!(other.take_turn(Some(Instant::now())).await.is_some());
            drop(first);
            assert!(second.take_turn(Some(Instant::now())).await.is_some());
        })
        .await;
    }
}
