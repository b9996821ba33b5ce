//! Proof of holding: the [`Guard`] every lock type returns, made of one
//! [`HeldPart`] per node that granted. A multi-node guard also adopts the
//! grants its round received after it returned ([`LateParts`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::error::{Error, FailureCause, NodeFailure, QuorumError, Result, Unavailable};
use crate::hold_warning::{HoldWarning, Named};
use crate::late_parts::LateParts;
use crate::metrics;
use crate::owner::{Owner, Turn};
use crate::quorum::grace::Pace;
use crate::single::{self, HeldPart, PartView};
use crate::timing;

mod quorum_release;
use quorum_release::release_at_quorum;

/// Proof that a lock is held: returned by every acquire of [`Lock`](crate::Lock),
/// [`MultiLock`](crate::MultiLock) and [`RedLock`](crate::RedLock).
///
/// [`Guard::unlock`] releases and reports errors; dropping the guard releases
/// in the background (best effort, on the current tokio runtime). A guard is
/// `Send + 'static`: it can move into another task, and unlocking through it
/// works from any task, since it carries its owner.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
/// let guard = lock.lock().await?;
/// tokio::select! {
///     _ = guard.lost() => { /* stop: someone else may hold it now */ }
///     _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
/// }
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping a Guard releases the lock at once"]
pub struct Guard {
    owner: Owner,
    name: Arc<str>,
    parts: Vec<HeldPart>,
    /// Grants of this guard's round that arrived after it was made.
    late: Option<Arc<Mutex<LateParts>>>,
    shape: Shape,
    token: Option<u64>,
    /// Fewer parts than the quorum could prove their hold, as `lost()`,
    /// `valid_until()` or `nodes()` saw: the guard never claims the lock
    /// again (its parts' proof only breaks for good; this also keeps a late
    /// grant from reviving it).
    lost: AtomicBool,
    /// A re-entry of a `run_locked` scope keeps the scope's turn while it
    /// lives.
    turn: Option<Turn>,
    /// Its hold warning, aborted with it (`None`: no warning is set).
    warning: Option<HoldWarning>,
}

/// What kind of lock a guard holds.
#[derive(Debug, Clone)]
pub(crate) enum Shape {
    /// A single-node [`Lock`](crate::Lock): errors are its node's own.
    Single,
    /// A multi-node lock held while `required` of its `nodes` (addresses,
    /// in the lock's order) are; each node's request gets `node_timeout`;
    /// its fan-outs keep `pace`.
    Quorum {
        nodes: Arc<[String]>,
        required: usize,
        node_timeout: Duration,
        pace: Arc<Pace>,
    },
}

impl Shape {
    fn required(&self) -> usize {
        match self {
            Shape::Single => 1,
            Shape::Quorum { required, .. } => *required,
        }
    }

    /// The lock's nodes (none named for a single-node lock: its errors are
    /// its node's own).
    fn nodes(&self) -> Vec<String> {
        match self {
            Shape::Single => Vec::new(),
            Shape::Quorum { nodes, .. } => nodes.to_vec(),
        }
    }
}

/// The nodes of `nodes` this guard never held (not in `held`), as failures
/// of a quorum operation: they count neither for it nor against it.
fn never_granted(nodes: &[String], held: &[String]) -> Vec<NodeFailure> {
    nodes
        .iter()
        .filter(|node| !held.contains(node))
        .map(|node| NodeFailure {
            node: node.clone(),
            cause: FailureCause::NeverGranted,
        })
        .collect()
}

impl Guard {
    /// The guard of a single-node hold.
    pub(crate) fn single(owner: Owner, part: HeldPart) -> Guard {
        let hold_warning = part.lock.hold_warning();
        Guard {
            name: part.lock.keys().name.clone(),
            token: part.token(),
            owner,
            parts: vec![part],
            late: None,
            shape: Shape::Single,
            lost: AtomicBool::new(false),
            turn: None,
            warning: None,
        }
        .warned_after(hold_warning)
    }

    /// The guard of a multi-node hold: `parts` are the nodes that granted in
    /// time, `late` receives the grants that come after, `shape` says how
    /// many must stay held.
    pub(crate) fn quorum(
        owner: Owner,
        parts: Vec<HeldPart>,
        late: Arc<Mutex<LateParts>>,
        shape: Shape,
        token: Option<u64>,
    ) -> Guard {
        Guard {
            owner,
            name: parts
                .first()
                .map(|p| p.lock.keys().name.clone())
                .unwrap_or_default(),
            parts,
            late: Some(late),
            shape,
            token,
            lost: AtomicBool::new(false),
            turn: None,
            warning: None,
        }
    }

    /// This guard, keeping `turn` (its scope's, when it re-entered one)
    /// until it is released or dropped.
    pub(crate) fn in_turn(mut self, turn: Turn) -> Guard {
        self.turn = Some(turn);
        self
    }

    /// This guard, warning once if it is still held `after` from now
    /// ([`HoldWarning`], judged as `lost()` is); `None`: nothing is made.
    pub(crate) fn warned_after(mut self, after: Option<Duration>) -> Guard {
        let Some(after) = after else { return self };
        let parts: Vec<PartView> = self.parts.iter().filter_map(HeldPart::view).collect();
        let (late, required) = (
            self.late.as_ref().map(Arc::downgrade),
            self.shape.required(),
        );
        let held = move || {
            let late = late.as_ref().and_then(Weak::upgrade);
            let views = parts
                .into_iter()
                .chain(late.iter().flat_map(|l| LateParts::views(l)));
            let proven = single::proven(views.collect(), required, Instant::now());
            proven
                .iter()
                .map(|(part, _)| part.node_addr().to_owned())
                .collect()
        };
        let kind = self
            .parts
            .first()
            .map_or(metrics::SINGLE, |p| p.lock.kind());
        let named = Named {
            lock: self.name.clone(),
            owner: self.owner.clone(),
            kind,
        };
        self.warning = HoldWarning::start(after, named, held);
        self
    }

    /// Every part held now, the adopted late ones included.
    fn views(&self) -> Vec<PartView> {
        let mut views: Vec<PartView> = self.parts.iter().filter_map(HeldPart::view).collect();
        views.extend(self.late.iter().flat_map(|late| LateParts::views(late)));
        views
    }

    /// The parts that prove their hold at `now`, with until when (later
    /// than `now`); none once the guard is lost. The one judge behind
    /// `lost()`, `valid_until()` and `nodes()`, so the three agree: when
    /// fewer than the quorum prove their hold, the guard is lost for good.
    fn proven(&self, now: Instant) -> Vec<(PartView, Instant)> {
        if self.lost.load(Ordering::Acquire) {
            return Vec::new();
        }
        let proven = single::proven(self.views(), self.shape.required(), now);
        if proven.is_empty() {
            self.mark_lost();
        }
        proven
    }

    /// Records that the guard is lost: from now on it proves nothing, and a
    /// late grant is released instead of adopted.
    fn mark_lost(&self) {
        if self.lost.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(late) = &self.late {
            LateParts::mark_lost(late);
        }
        tracing::debug!(lock = %self.name, "the guard can no longer prove its hold: lost");
    }

    /// Releases the lock.
    ///
    /// Renewal stops before anything is sent, so no renewal outlives the
    /// unlock. A part already known to be over (a renewal found it gone, a
    /// later fresh grant of the same owner proved it over, or the key's TTL
    /// has surely run out) sends nothing and counts as [`Error::NotHeld`]:
    /// releasing its field could lower a later hold of the same owner. The
    /// key's TTL is what the key really holds: a re-entry that extended it
    /// extends this guard too.
    ///
    /// A multi-node lock releases every node at once and returns once a
    /// quorum of them confirmed and the others answered, or after a grace
    /// scaled to how long the quorum took (twice that, plus a millisecond,
    /// and at most the per-node timeout); the others finish in the background
    /// (bounded: a release that gets no answer is retried on its connection
    /// for at most a minute, then the key ends with its lease).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let guard = lock.lock().await?;
    /// match guard.unlock().await {
    ///     Ok(()) => {}
    ///     Err(multilock::Error::NotHeld { .. }) => { /* it had expired or was taken away */ }
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lock expired or was taken from this owner
    /// (for a multi-node lock: when so many of its nodes said the hold was
    /// gone that the nodes left, released or unconfirmed, are fewer than a
    /// quorum: it was not held on a quorum at the end);
    /// [`Error::NodeUnavailable`] when the node could not be reached, or
    /// a Cluster node's slot was migrating (a retried release is
    /// idempotent: it returns the first result), or [`Error::Redis`] for the
    /// server's refusal: unless that refusal is permanent
    /// ([`Error::is_permanent`]), the release goes on in the background
    /// until the node answers it, for at most a minute; for a
    /// multi-node lock, [`Error::NoQuorum`] when fewer than a quorum
    /// confirmed the release and node failures leave it open whether the
    /// lock was held on a quorum, naming every node: what it answered, and
    /// [`FailureCause::NeverGranted`] for the nodes this guard never held
    /// (they count neither way).
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future does not leave the lock held: the
    /// releases go on in the background.
    pub async fn unlock(mut self) -> Result<()> {
        // A hold being released is not held too long.
        drop(self.warning.take());
        let mut parts = std::mem::take(&mut self.parts);
        if let Some(late) = self.late.take() {
            parts.extend(LateParts::close(&late));
        }
        let (nodes, required, node_timeout, pace) = match &self.shape {
            // A single-node lock reports its node's error as it is.
            Shape::Single => {
                return match parts.pop() {
                    Some(part) => part.release().await.map(drop),
                    None => Err(Error::invalid("the guard holds nothing")),
                };
            }
            Shape::Quorum {
                nodes,
                required,
                node_timeout,
                pace,
            } => (nodes.clone(), *required, *node_timeout, pace.clone()),
        };
        release_at_quorum(
            self.name.as_ref(),
            parts,
            &nodes,
            required,
            node_timeout,
            &pace,
        )
        .await
    }

    /// Extends a guard taken with a fixed lease to at least `lease` from
    /// now, as an acquire would grant it: on every node that still surely
    /// holds, at once (a multi-node lock waits at most its per-node timeout
    /// for each), and only if a quorum of them extended within the new
    /// validity (`lease` less the time it took and the clock drift). A TTL
    /// is never shortened, and a hold that is over is never revived.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// use std::time::Duration;
    /// let guard = lock.lock_with_lease(Duration::from_secs(10)).await?;
    /// // ... the work takes longer than planned ...
    /// guard.extend(Duration::from_secs(10)).await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a guard renewed by the watchdog (it
    /// needs no extension) or a lease out of bounds (see
    /// [`Lock::lock_with_lease`](crate::Lock::lock_with_lease));
    /// [`Error::NotHeld`] when the lock is no longer held (a single node),
    /// or the guard is lost ([`Guard::lost`]: it is never revived), or
    /// the node's error; for a multi-node lock, [`Error::NoQuorum`] naming
    /// each node that did not extend, when fewer than a quorum did in time.
    /// The parts that did extend keep their longer TTL.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave some nodes extended and others not: the
    /// guard then reports the validity it had, which the keys outlast.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        let views = self.views();
        if views.iter().any(|p| !p.has_lease()) {
            return Err(Error::invalid(
                "extend() is for guards with a fixed lease; the watchdog renews this one",
            ));
        }
        if self.proven(Instant::now()).is_empty() {
            // Lost (or never proven since): a guard that could not prove its
            // hold is never revived.
            return Err(Error::NotHeld {
                lock: self.name.to_string(),
                nodes: views.iter().map(|p| p.node_addr().to_owned()).collect(),
            });
        }
        let (node_timeout, required, nodes) = match &self.shape {
            Shape::Single => {
                timing::check_lease(lease)?;
                let Some(part) = views.first() else {
                    return Err(Error::invalid("the guard holds nothing"));
                };
                return part.extend(lease).await.map(drop);
            }
            Shape::Quorum {
                node_timeout,
                required,
                nodes,
                ..
            } => ((*node_timeout).min(lease / 10), *required, nodes.len()),
        };
        timing::check_lease(lease)?;
        let started = Instant::now();
        let results = futures::future::join_all(views.iter().map(|part| async move {
            let extended = tokio::time::timeout(node_timeout, part.extend(lease)).await;
            let outcome = extended.unwrap_or_else(|_| {
                Err(Error::NodeUnavailable {
                    node: part.node_addr().to_owned(),
                    reason: Unavailable::Timeout,
                    source: None,
                })
            });
            (part.node_addr().to_owned(), outcome)
        }))
        .await;
        let elapsed = started.elapsed();
        let mut extended = Vec::new();
        let held: Vec<String> = results.iter().map(|(node, _)| node.clone()).collect();
        let mut failures = never_granted(&self.shape.nodes(), &held);
        for (node, outcome) in results {
            match outcome {
                Ok(_) => extended.push(node),
                Err(err) => failures.push(NodeFailure {
                    node,
                    cause: FailureCause::Failed(err),
                }),
            }
        }
        if extended.len() >= required && timing::validity(lease, elapsed).is_some() {
            return Ok(());
        }
        Err(Error::NoQuorum(QuorumError {
            lock: self.name.to_string(),
            succeeded: extended.len(),
            required,
            nodes,
            succeeded_on: extended,
            failures,
        }))
    }

    /// Resolves when the lock is known to be gone, or can no longer be
    /// proven held: when fewer nodes than the quorum (one, for a single-node
    /// lock) can still *prove* their hold.
    ///
    /// A node proves its hold while its key surely lives (its last grant
    /// or renewal, plus the TTL that set, less clock drift, has not passed),
    /// and every renewal since the grant was answered and found the hold (a
    /// read hold: one of its timeout keys). So `lost()` fires within one
    /// renewal period (a third of the watchdog timeout) once renewals are
    /// refused or time out on too many nodes, at once when a renewal finds
    /// the key gone, and when a fixed lease runs out. A node that answers
    /// slowly, within its response timeout, proves its hold. A renewal
    /// that a server refused untried while keeping its data (`BUSY`, `OOM`,
    /// `MISCONF`) breaks nothing: the hold stands on its last proof until
    /// that runs out or a later renewal lands. Late grants the guard
    /// adopted count from their arrival.
    ///
    /// A proof that broke stays broken, and a lost guard stays lost: a
    /// renewal that gets through after a pause (of this process, or of the
    /// node) does not revive it, since someone else may have held the
    /// lock in between. From then on [`Guard::valid_until`] is `None` and
    /// [`Guard::nodes`] empty; the guard still releases what is left of
    /// its hold when unlocked or dropped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let guard = lock.lock().await?;
    /// tokio::select! {
    ///     _ = guard.lost() => { /* stop writing: the lock may be someone else's */ }
    ///     _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
    /// }
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        loop {
            // Judged afresh after every part that stops proving its hold:
            // a late grant adopted meanwhile counts.
            let proven = self.proven(Instant::now());
            if proven.is_empty() {
                return;
            }
            let mut part_lost: FuturesUnordered<_> =
                proven.iter().map(|(part, _)| part.lost()).collect();
            part_lost.next().await;
        }
    }

    /// The fencing token, when the lock was made with fencing on
    /// ([`Lock::with_fencing`](crate::Lock::with_fencing)). Tokens strictly increase across successive
    /// holders (and a re-entrant acquire gets a newer one, as in Redisson);
    /// pass it with every write the lock protects.
    pub fn fencing_token(&self) -> Option<u64> {
        self.token
    }

    /// The owner this hold belongs to.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The addresses of the nodes that still prove their hold: granted
    /// (late grants the guard adopted included), within their lease, and
    /// with every renewal since the grant answered and finding the hold
    /// (see [`Guard::lost`]). Empty once the guard is lost: then fewer
    /// than the quorum proved their hold, and it never claims the lock
    /// again.
    pub fn nodes(&self) -> Vec<String> {
        self.proven(Instant::now())
            .iter()
            .map(|(part, _)| part.node_addr().to_owned())
            .collect()
    }

    /// The lock's name (the first one, for a MultiLock of several names).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The instant after which the lock may be held by someone else: the
    /// latest instant until which a quorum of its nodes surely still hold
    /// it. On each node that is what the key holds (the TTL its last grant
    /// or renewal set, counted from when that request was sent, less an
    /// allowance for clock drift), so it moves forward with every renewal
    /// and with a re-entry that extended the key. `None` once too many
    /// nodes can no longer prove their hold: once [`Guard::lost`] has fired
    /// (or could have), this is `None` for good, as [`Guard::nodes`] is
    /// empty.
    ///
    /// Measured on the monotonic clock only: a jump of the wall clock
    /// changes nothing here (a jump of a *server's* clock does: see the
    /// crate's known limits).
    pub fn valid_until(&self) -> Option<std::time::Instant> {
        let mut proven: Vec<Instant> = self
            .proven(Instant::now())
            .into_iter()
            .map(|(_, until)| until)
            .collect();
        proven.sort_unstable_by(|a, b| b.cmp(a));
        proven
            .get(self.shape.required().checked_sub(1)?)
            .map(|t| t.into_std())
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("name", &self.name())
            .field("owner", &self.owner)
            .field("nodes", &self.nodes())
            .field("shape", &self.shape)
            .field("fencing_token", &self.token)
            .finish()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Adopted late parts go with the guard (their drop releases them),
        // and a grant still on its way is released when it arrives.
        if let Some(late) = self.late.take() {
            drop(LateParts::close(&late));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Client, Lock, MultiLock, Node, RedLock};

    fn send_sync_static<T: Send + Sync + 'static>() {}
    fn send<T: Send>(_: &T) {}
    fn consumes_guard_into_send_static<F, Fut>(_: F)
    where
        F: FnOnce(Guard) -> Fut,
        Fut: Future + Send + 'static,
    {
    }

    /// Guards move into spawned tasks; handles are shared between them; the
    /// futures of every acquire can be spawned (compile-time checks, run as a
    /// test so a regression fails the suite, not a dead function).
    #[test]
    fn guards_handles_and_futures_move_between_tasks() {
        send_sync_static::<Guard>();
        send_sync_static::<Lock>();
        send_sync_static::<MultiLock>();
        send_sync_static::<RedLock>();
        send_sync_static::<Client>();
        send_sync_static::<Node>();
        consumes_guard_into_send_static(Guard::unlock);

        let client = Client::new();
        let node = Node::new("redis://127.0.0.1:1").unwrap();
        let lock = client.lock(&node, "x").unwrap();
        let red = client.red_lock_on(&[node], "x").unwrap();
        let wait = Duration::ZERO;
        send(&lock.lock());
        send(&lock.lock_with_lease(wait));
        send(&lock.try_lock());
        send(&lock.try_lock_for(wait, None));
        send(&lock.force_unlock());
        send(&red.lock());
        send(&red.try_lock_for(wait, None));
        send(&red.force_unlock());
    }
}
