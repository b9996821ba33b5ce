//! The algorithm of `MultiLock` and `RedLock`, read top to bottom in
//! [`QuorumLock::round`]: send the acquire to every part at once under a
//! per-node timeout; count the answers as they come, and once a quorum
//! granted, wait only a short grace for the others (a frozen node costs
//! the round almost nothing); measure how long it took on a monotonic clock;
//! keep the grants when they are still valid (and, when fenced, settle the
//! token: [`super::fencing`]), else release them all concurrently. Answers
//! that come after the round returned are adopted by its guard, or rolled
//! back. Around it, [`QuorumLock::wait_for_quorum`] repeats rounds until
//! granted or out of time, woken by unlock messages from any node.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, join_all};
use futures::stream::StreamExt;
use tokio::sync::futures::Notified;
use tokio::time::Instant;
use tracing::Instrument;

use super::fan_out::FanOut;
use super::grace::{FanOutTimer, Next};
use super::policy;
use super::{QuorumLock, QuorumPolicy};
use crate::error::{Error, FailureCause, NodeFailure, QuorumError, Result, Unavailable};
use crate::guard::{Guard, Shape};
use crate::late_parts::LateParts;
use crate::node::{Lane, Node};
use crate::owner::Owner;
use crate::single::{Attempt, HeldPart, Lock, QueueSeats};
use crate::timing;

impl<P: QuorumPolicy> QuorumLock<P> {
    /// Acquires within `wait`: the work behind `try_lock` and
    /// `try_lock_for`. Fair parts queue for `wait` (none at all for a zero
    /// wait), as a single fair lock's bounded wait does, and the waiter
    /// leaves their queues when it is over.
    pub(super) async fn acquire(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<Guard>> {
        let resolved = self.resolve_owner();
        let owner = resolved.owner.clone();
        // A re-entry of a `run_locked` scope waits for its siblings'.
        let deadline = timing::deadline(Instant::now(), wait);
        let Some(turn) = resolved.take_turn(Some(deadline)).await else {
            return Ok(None);
        };
        let wait = deadline.saturating_duration_since(Instant::now());
        let share = Some(wait);
        let parts: Vec<Lock> = self.locks.iter().map(|l| l.for_wait(share)).collect();
        let seats = QueueSeats::new(parts.iter(), &owner);
        let outcome = self.acquire_within(&owner, wait, share, lease).await;
        seats.finish(matches!(outcome, Ok(Some(_)))).await;
        outcome.map(|guard| guard.map(|guard| guard.in_turn(turn)))
    }

    /// Rounds within `wait` for `owner`, leaving the queues of fair parts
    /// as they are: a caller that tries again keeps its places. `share`:
    /// the wait fair parts queue for (`None`: each part's own, for a wait
    /// until granted).
    pub(super) async fn acquire_within(
        &self,
        owner: &Owner,
        wait: Duration,
        share: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<Guard>> {
        let parts: Vec<Lock> = self.locks.iter().map(|l| l.for_wait(share)).collect();
        let started = Instant::now();
        let deadline = timing::deadline(started, wait);
        let span = tracing::debug_span!(
            "acquire",
            kind = P::NAME,
            lock = %self.locks[0].name(),
            nodes = self.locks.len(),
            owner = %owner
        );
        async {
            let mut first_lost = None;
            let outcome = self
                .wait_for_quorum(&parts, owner, lease, deadline, &mut first_lost)
                .await;
            let elapsed = started.elapsed();
            let elapsed_us = elapsed.as_micros() as u64;
            match &outcome {
                Ok(Some(guard)) => {
                    tracing::debug!(elapsed_us, held = ?guard.nodes(), "acquired");
                    let waited = first_lost.map(|at: Instant| at.elapsed());
                    self.metrics.acquired(elapsed, waited);
                }
                Ok(None) => tracing::debug!(elapsed_us, "not acquired within the wait"),
                Err(err) => tracing::debug!(elapsed_us, error = %err, "acquire failed"),
            }
            outcome
        }
        .instrument(span)
        .await
    }

    /// Round; subscribe on every node; then round again after every wake-up
    /// until granted or past the deadline. A round lost to failures that no
    /// retry can mend (bad input, a permanent error on too many nodes) ends
    /// the wait at once.
    /// `first_lost`: set when the first round is lost (the wait that
    /// follows is measured from there).
    async fn wait_for_quorum(
        &self,
        parts: &[Lock],
        owner: &Owner,
        lease: Option<Duration>,
        deadline: Instant,
        first_lost: &mut Option<Instant>,
    ) -> Result<Option<Guard>> {
        let mut lost = match self.round(parts, owner, lease).await? {
            Round::Won(guard) => return Ok(Some(guard)),
            Round::Lost(lost) => lost,
        };
        *first_lost = Some(Instant::now());
        if Instant::now() >= deadline || lost.is_permanent(self) {
            return self.give_up(lost);
        }
        let _ = back_off_after_split(&lost, deadline).await;
        // Subscribed before the next round, so a release during it wakes us.
        let patience = self.node_timeout.min(deadline - Instant::now());
        let subscriptions = join_all(self.locks.iter().map(|lock| async move {
            let channel = lock.wake_channel(owner);
            lock.node().subscribe(&channel, patience).await
        }))
        .await;
        loop {
            let mut wakes: Vec<Pin<Box<Notified<'_>>>> = subscriptions
                .iter()
                .map(|s| {
                    let mut woken = Box::pin(s.wake().notified());
                    woken.as_mut().enable();
                    woken
                })
                .collect();
            lost = match self.round(parts, owner, lease).await? {
                Round::Won(guard) => return Ok(Some(guard)),
                Round::Lost(lost) => lost,
            };
            if Instant::now() >= deadline || lost.is_permanent(self) {
                return self.give_up(lost);
            }
            if back_off_after_split(&lost, deadline).await {
                continue;
            }
            let any_release = futures::future::select_all(wakes.iter_mut().map(|w| w.as_mut()));
            let woken = tokio::select! {
                _ = any_release => true,
                _ = sleep_within(policy::retry_delay(), deadline) => false,
            };
            if woken {
                stagger_after_wake(&lost, deadline).await;
            }
        }
    }

    /// `None`, or the error when node failures (not contention) made the
    /// quorum unreachable.
    fn give_up(&self, lost: LostRound) -> Result<Option<Guard>> {
        let errors = lost
            .failures
            .iter()
            .filter(|f| matches!(f.cause, FailureCause::Failed(_)))
            .count();
        if !policy::quorum_reachable(self.locks.len(), self.quorum(), errors) {
            Err(Error::NoQuorum(QuorumError {
                lock: self.locks[0].name().to_owned(),
                succeeded: lost.granted.len(),
                required: self.quorum(),
                nodes: self.locks.len(),
                succeeded_on: lost.granted,
                failures: lost.failures,
            }))
        } else {
            Ok(None)
        }
    }

    /// One attempt of the algorithm on `locks` (this lock's, with the
    /// acquire's queue share). Lost: every grant has been released
    /// (or is being released, if this future is dropped) and the reasons are
    /// returned. An error: the lock cannot be taken as configured.
    async fn round(&self, locks: &[Lock], owner: &Owner, lease: Option<Duration>) -> Result<Round> {
        let n = self.locks.len();
        let required = self.quorum();
        let validity_lease = lease.unwrap_or_else(|| self.locks[0].watchdog_timeout());
        // Small next to the lease the validity is measured against, whether
        // given or the watchdog's.
        let node_timeout = self
            .node_timeout
            .min(validity_lease / 10)
            .max(Duration::from_millis(1));
        self.check_independent_servers()?;

        // 1. Fan out to every node at once, under the per-node timeout
        //    (one timer for all: they leave together). A request cut off
        //    (by the timeout, or because the round is over) finishes in the
        //    background and is rolled back there (see `Lock::attempt`); a
        //    suspect node fails at once, sending nothing.
        let mut timer = FanOutTimer::new(&self.pace, Some(node_timeout), node_timeout);
        let started = timer.started();
        let mut pending: FanOut<Answer> = locks
            .iter()
            .enumerate()
            .map(|(index, lock)| ask(index, lock.clone(), owner.clone(), lease))
            .collect();

        // 2. Count the answers as they come. Stop once the quorum is out of
        //    reach (releasing now lets a competitor that split the nodes
        //    with us win, instead of both waiting out timeouts), or once it
        //    is reached and the grace for the others has passed.
        let mut answered = Answered::new(n);
        let mut quorum_after: Option<Duration> = None;
        loop {
            let (index, attempt) = match timer.next(&mut pending).await {
                Next::Answer(answer) => answer,
                Next::Done | Next::GraceOver => break,
                Next::CutOff => {
                    // A node that did not answer within the timeout becomes
                    // suspect: the next rounds skip it, at no cost, until it
                    // answers a probe. Its request goes to the background.
                    for (index, lock) in self.locks.iter().enumerate() {
                        if !answered.seen[index] {
                            lock.node().suspect(lock.lane());
                            answered.record(index, Err(timed_out(lock)), lock);
                        }
                    }
                    drop(std::mem::take(&mut pending));
                    break;
                }
            };
            answered.record(index, attempt, &self.locks[index]);
            if !policy::quorum_reachable(n, required, answered.failures.len()) {
                break;
            }
            if quorum_after.is_none() && answered.parts.len() >= required {
                quorum_after = Some(timer.quorum_reached());
            }
        }
        let elapsed = started.elapsed();
        // In the order of the locks, whatever order the answers came in.
        answered.parts.sort_unstable_by_key(|(index, _)| *index);
        let Answered {
            parts,
            mut failures,
            seen,
        } = answered;
        // Nodes still on their way are named as such.
        for (index, lock) in self.locks.iter().enumerate() {
            if !seen[index] {
                failures.push(NodeFailure {
                    node: lock.node().addr().to_owned(),
                    cause: FailureCause::NoAnswer,
                });
            }
        }
        // The answers still on their way: a grant is adopted by the guard if
        // the round wins (renewed and released with it), else released; a
        // node still silent when its request is overdue becomes suspect.
        let late = Arc::new(Mutex::new(LateParts::default()));
        if !pending.is_empty() {
            let overdue_at =
                started + policy::overdue(quorum_after.unwrap_or(elapsed), node_timeout);
            let stragglers: Vec<(usize, Node, Lane)> = seen
                .iter()
                .enumerate()
                .filter(|(_, seen)| !**seen)
                .map(|(index, _)| {
                    let lock = &self.locks[index];
                    (index, lock.node().clone(), lock.lane())
                })
                .collect();
            tokio::spawn(adopt_late_grants(
                pending,
                late.clone(),
                stragglers,
                overdue_at,
                started + node_timeout,
            ));
        }
        let lost = |parts, failures| {
            // Late grants of a lost round are released as they come.
            drop(LateParts::close(&late));
            LostRound::released(parts, failures, elapsed, node_timeout)
        };
        if let Err(err) = self.check_independent_servers() {
            // Two "nodes" granted on one server: the quorum proves nothing.
            lost(parts, failures).await;
            return Err(err);
        }

        // 3. A quorum, still valid once acquiring time and drift are paid?
        if parts.len() < required || timing::validity(validity_lease, elapsed).is_none() {
            if parts.len() >= required {
                tracing::debug!(
                    lock = %self.name(),
                    elapsed_ms = elapsed.as_millis() as u64,
                    "quorum granted too late: validity spent"
                );
            }
            return Ok(Round::Lost(lost(parts, failures).await));
        }
        let token = if self.is_fenced() {
            match self.settle_token(&parts, node_timeout).await {
                Some(token) => Some(token),
                None => {
                    tracing::debug!(lock = %self.name(), lost_for = "fencing", "no fencing token could be proven; round lost");
                    return Ok(Round::Lost(lost(parts, failures).await));
                }
            }
        } else {
            None
        };
        // Still valid after the settlement's round trips?
        if timing::validity(validity_lease, started.elapsed()).is_none() {
            tracing::debug!(lock = %self.name(), lost_for = "fencing", "validity spent while settling the fencing token; round lost");
            return Ok(Round::Lost(lost(parts, failures).await));
        }

        // 4. Won: the guard adopts the late grants.
        let shape = Shape::Quorum {
            nodes: self.addrs.clone(),
            required,
            node_timeout,
            pace: self.pace.clone(),
        };
        let parts = parts.into_iter().map(|(_, part)| part).collect();
        // One hold warning for the whole hold, whatever its parts say.
        let guard = Guard::quorum(owner.clone(), parts, late, shape, token);
        Ok(Round::Won(guard.warned_after(self.hold_warning)))
    }

    /// For a policy that needs independent servers: no two nodes may be one
    /// server under two addresses (`localhost` and `127.0.0.1`, say), as
    /// their `run_id`s tell once connected.
    fn check_independent_servers(&self) -> Result<()> {
        if !P::INDEPENDENT_SERVERS {
            return Ok(());
        }
        // Twice a round: checked again only when an id changed since the
        // servers were last found independent (the counts are read first).
        let changes: u64 = self
            .locks
            .iter()
            .map(|lock| lock.node().server_run_id_changes())
            .sum();
        if self.independent_at.load(Ordering::Acquire) == changes + 1 {
            return Ok(());
        }
        let ids: Vec<Option<Arc<str>>> = self
            .locks
            .iter()
            .map(|lock| lock.node().server_run_id())
            .collect();
        for (i, a) in ids.iter().enumerate() {
            for (j, b) in ids.iter().enumerate().skip(i + 1) {
                if a.is_some() && a == b {
                    return Err(Error::invalid(format!(
                        "nodes {} and {} are one server (run_id {}): a {} needs independent servers",
                        self.locks[i].node().addr(),
                        self.locks[j].node().addr(),
                        a.as_deref().unwrap_or_default(),
                        P::NAME
                    )));
                }
            }
        }
        self.independent_at.store(changes + 1, Ordering::Release);
        Ok(())
    }
}

/// One node's answer to a round's acquire: its index in the lock, and the
/// attempt's outcome (a grant, taken, or an error, the per-node timeout
/// included). Owned, so the answers still on their way when the round
/// returns can be handed to [`adopt_late_grants`].
type Answer = BoxFuture<'static, (usize, Result<Attempt>)>;

/// Sends the acquire to one node (the round's timer cuts it off at the
/// per-node timeout).
fn ask(index: usize, lock: Lock, owner: Owner, lease: Option<Duration>) -> Answer {
    async move { (index, lock.attempt(&owner, lease).await) }.boxed()
}

/// A request of `lock` cut off at the per-node timeout.
fn timed_out(lock: &Lock) -> Error {
    Error::NodeUnavailable {
        node: lock.node().addr().to_owned(),
        reason: Unavailable::Timeout,
        source: None,
    }
}

/// The answers a round has counted so far.
struct Answered {
    parts: Vec<(usize, HeldPart)>,
    failures: Vec<NodeFailure>,
    /// Which nodes answered, by index.
    seen: Vec<bool>,
}

impl Answered {
    fn new(nodes: usize) -> Answered {
        Answered {
            parts: Vec::with_capacity(nodes),
            failures: Vec::new(),
            seen: vec![false; nodes],
        }
    }

    fn record(&mut self, index: usize, attempt: Result<Attempt>, lock: &Lock) {
        self.seen[index] = true;
        let cause = match attempt {
            Ok(Attempt::Granted(part)) => return self.parts.push((index, part)),
            Ok(Attempt::Taken(ttl)) => FailureCause::Taken(ttl),
            // Granted, but read after its TTL could have run out: as late as
            // a timeout.
            Ok(Attempt::Expired) => FailureCause::Failed(timed_out(lock)),
            Err(err) => FailureCause::Failed(err),
        };
        // Addresses are written out for failures only.
        self.failures.push(NodeFailure {
            node: lock.node().addr().to_owned(),
            cause,
        });
    }
}

/// Waits out the answers a won round did not wait for: a grant is adopted
/// by the guard, or released at once if the guard is gone. The `stragglers`
/// still silent at `overdue_at` become suspect, so the next rounds stop
/// adding requests behind theirs; those still silent at `cut_off` (the
/// round's per-node timeout) are cut off as a round cuts them off: suspect,
/// their requests finishing in the background (see `Lock::attempt`).
async fn adopt_late_grants(
    mut pending: FanOut<Answer>,
    late: Arc<Mutex<LateParts>>,
    stragglers: Vec<(usize, Node, Lane)>,
    overdue_at: Instant,
    cut_off: Instant,
) {
    let mut unanswered = stragglers;
    let mut marked_overdue = false;
    let overdue = tokio::time::sleep_until(overdue_at);
    let cut_off = tokio::time::sleep_until(cut_off);
    tokio::pin!(overdue, cut_off);
    loop {
        tokio::select! {
            biased;
            answer = pending.next() => {
                let Some((index, attempt)) = answer else {
                    return;
                };
                unanswered.retain(|(straggler, _, _)| *straggler != index);
                if let Ok(Attempt::Granted(part)) = attempt {
                    LateParts::adopt(&late, part);
                }
            }
            _ = &mut overdue, if !marked_overdue => {
                marked_overdue = true;
                for (_, node, lane) in &unanswered {
                    node.suspect_overdue(*lane);
                }
            }
            _ = &mut cut_off => {
                for (_, node, lane) in unanswered {
                    node.suspect(lane);
                }
                return;
            }
        }
    }
}

/// How a round ended.
enum Round {
    Won(Guard),
    Lost(LostRound),
}

/// A round that did not win: the nodes that granted (all released since),
/// what the others said, and how long the fan-out took.
struct LostRound {
    granted: Vec<String>,
    failures: Vec<NodeFailure>,
    elapsed: Duration,
}

/// After a round that won some nodes but not the quorum (a split vote),
/// sleep a jittered delay, deaf to unlock messages: our own rollback has
/// just published them, and contenders that split the nodes must not retry
/// in lockstep. Returns whether it slept.
async fn back_off_after_split(lost: &LostRound, deadline: Instant) -> bool {
    if lost.granted.is_empty() {
        return false;
    }
    sleep_within(policy::retry_delay(), deadline).await;
    true
}

/// After an unlock message, before the next round: see
/// [`policy::stagger_after_wake`].
async fn stagger_after_wake(lost: &LostRound, deadline: Instant) {
    sleep_within(policy::stagger_after_wake(lost.elapsed), deadline).await;
}

/// Sleeps `nap`, or until `deadline` if that comes first.
async fn sleep_within(nap: Duration, deadline: Instant) {
    let left = deadline.saturating_duration_since(Instant::now());
    tokio::time::sleep(nap.min(left)).await;
}

impl LostRound {
    /// Whether the failures that no retry mends are enough on their own to
    /// keep the quorum out of reach.
    fn is_permanent<P: QuorumPolicy>(&self, lock: &QuorumLock<P>) -> bool {
        let permanent = self
            .failures
            .iter()
            .filter(|f| matches!(&f.cause, FailureCause::Failed(e) if e.is_permanent()))
            .count();
        permanent > 0 && !policy::quorum_reachable(lock.locks.len(), lock.quorum(), permanent)
    }

    /// Releases every grant at once, waiting at most `patience` (the
    /// per-node timeout) so a stalled node cannot stretch the caller's wait;
    /// releases still under way then finish in the background. Failures are
    /// logged; a release that was not applied goes on in the background
    /// too (see `HeldPart::release`), and each part's lease bounds the
    /// damage of one given up.
    async fn released(
        parts: Vec<(usize, HeldPart)>,
        failures: Vec<NodeFailure>,
        elapsed: Duration,
        patience: Duration,
    ) -> LostRound {
        let granted = parts
            .iter()
            .map(|(_, p)| p.node_addr().to_owned())
            .collect();
        let releases = join_all(parts.into_iter().map(|(_, part)| part.release()));
        match tokio::time::timeout(patience, releases).await {
            Ok(results) => {
                for err in results.into_iter().filter_map(Result::err) {
                    tracing::debug!(error = %err, "rollback release failed");
                }
            }
            Err(_) => tracing::debug!("rollback still under way; finishing in the background"),
        }
        LostRound {
            granted,
            failures,
            elapsed,
        }
    }
}
