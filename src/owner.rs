//! Who holds a lock: the unit of reentrancy, and the scopes in which an
//! acquire re-enters a hold instead of waiting for it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
/// - or it runs inside the work of a `run_locked` of that lock
///   ([`Lock::run_locked`](crate::Lock::run_locked)): code called from the
///   critical section re-enters the lock it runs under. Re-entries of one
///   such scope take turns: two futures joined inside the work are
///   siblings, not nested in each other, so the second waits for the
///   first's guard to go (and a re-entry's own `run_locked` is the scope
///   for what it calls in turn).
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
/// locks, its owner, and the turn its re-entries take one at a time.
struct Scope {
    id: LockId,
    owner: Owner,
    turn: Arc<Semaphore>,
}

tokio::task_local! {
    /// The scopes the current future runs in (innermost last). Set only
    /// while that work is polled, so a sibling future of the same task
    /// (beside the `run_locked`, in a `join!`) does not see it.
    static SCOPES: Arc<Vec<Arc<Scope>>>;
}

/// Who an acquire holds for, as [`resolve`] decided: and when it re-enters
/// a `run_locked` scope, the turn it must take first.
pub(crate) struct Resolved {
    pub(crate) owner: Owner,
    turn: Option<Arc<Semaphore>>,
}

/// A re-entry's turn in its `run_locked` scope, kept by its guard: two
/// futures inside one scope (joined in its work) are siblings, not nested
/// in each other, so they re-enter one after the other, never together.
/// The re-entry's own `run_locked` opens a scope of its own for what it
/// calls.
#[derive(Debug)]
pub(crate) struct Turn(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

impl Resolved {
    /// Waits for this acquire's turn in its scope (at once outside one),
    /// until `deadline` (`None`: as long as it takes). `None`: the deadline
    /// came first.
    ///
    /// Cancel safe: a turn not yet taken is not kept.
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
        match &self.turn {
            // The semaphore is never closed.
            Some(turn) => Turn(turn.clone().acquire_owned().await.ok()),
            None => Turn(None),
        }
    }
}

/// The owner an acquire of the locks `ids` holds for: `explicit` when the
/// handle has one; else the owner of the innermost `run_locked` scope
/// holding one of them (the acquire re-enters it, in its turn); else a
/// fresh one.
pub(crate) fn resolve<'a>(
    explicit: Option<&Owner>,
    ids: impl IntoIterator<Item = (u64, &'a str)> + Clone,
) -> Resolved {
    if let Some(owner) = explicit {
        return Resolved {
            owner: owner.clone(),
            turn: None,
        };
    }
    let scoped = SCOPES.try_with(|scopes| {
        scopes.iter().rev().find_map(|scope| {
            let (node, name) = &scope.id;
            ids.clone()
                .into_iter()
                .any(|(n, k)| n == *node && k == &**name)
                .then(|| Resolved {
                    owner: scope.owner.clone(),
                    turn: Some(scope.turn.clone()),
                })
        })
    });
    scoped.ok().flatten().unwrap_or_else(|| Resolved {
        owner: Owner::unique(),
        turn: None,
    })
}

/// Runs `work` as the scope of `owner`'s holds of `ids`: acquires of those
/// locks inside it (without an owner of their own) re-enter, one at a
/// time.
pub(crate) async fn within<T>(
    ids: impl IntoIterator<Item = LockId>,
    owner: &Owner,
    work: impl Future<Output = T>,
) -> T {
    let mut scopes: Vec<Arc<Scope>> = SCOPES
        .try_with(|scopes| scopes.to_vec())
        .unwrap_or_default();
    let turn = Arc::new(Semaphore::new(1));
    scopes.extend(ids.into_iter().map(|id| {
        Arc::new(Scope {
            id,
            owner: owner.clone(),
            turn: turn.clone(),
        })
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

    /// Inside a scope, its locks resolve to its owner; siblings beside the
    /// scope (joined in the same task) and other locks get fresh owners.
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
        assert_ne!(other_name, owner);
        assert_ne!(other_node, owner);
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
            drop(first);
            assert!(second.take_turn(Some(Instant::now())).await.is_some());
        })
        .await;
    }
}
