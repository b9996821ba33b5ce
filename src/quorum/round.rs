//! The algorithm of `MultiLock` and `RedLock`, read top to bottom in
//! [`QuorumLock::round`]: send the acquire to every part at once under a
//! per-node timeout; measure how long it took on a monotonic clock; keep the
//! grants when a quorum granted within the validity window (and, when fenced,
//! settle the token), else release them all concurrently. Around it,
//! [`QuorumLock::wait_for_quorum`] repeats rounds until granted or out of
//! time, woken by unlock messages from any node.

use std::pin::Pin;
use std::time::Duration;

use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::futures::Notified;
use tokio::time::Instant;
use tracing::Instrument;

use super::{QuorumLock, QuorumPolicy, policy};
use crate::error::{Error, FailureCause, NodeFailure, QuorumError, Result, Unavailable};
use crate::guard::{Guard, Shape};
use crate::owner::Owner;
use crate::protocol;
use crate::single::{Attempt, HeldPart};
use crate::timing;

impl<P: QuorumPolicy> QuorumLock<P> {
    /// Acquires within `wait`: the work behind every public acquire method.
    pub(super) async fn acquire(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<Guard>> {
        let owner = self.owner();
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
            let outcome = self.wait_for_quorum(&owner, lease, deadline).await;
            let elapsed_us = started.elapsed().as_micros() as u64;
            match &outcome {
                Ok(Some(guard)) => tracing::debug!(elapsed_us, held = ?guard.nodes(), "acquired"),
                Ok(None) => tracing::debug!(elapsed_us, "not acquired within the wait"),
                Err(err) => tracing::debug!(elapsed_us, error = %err, "acquire failed"),
            }
            outcome
        }
        .instrument(span)
        .await
    }

    /// Round; subscribe on every node; then round again after every wake-up
    /// until granted or past the deadline.
    async fn wait_for_quorum(
        &self,
        owner: &Owner,
        lease: Option<Duration>,
        deadline: Instant,
    ) -> Result<Option<Guard>> {
        let mut lost = match self.round(owner, lease).await {
            Ok(guard) => return Ok(Some(guard)),
            Err(lost) => lost,
        };
        if Instant::now() >= deadline {
            return self.give_up(lost);
        }
        let _ = back_off_after_split(&lost, deadline).await;
        // Subscribed before the next round, so a release during it wakes us.
        let patience = self.node_timeout.min(deadline - Instant::now());
        let subscriptions = join_all(
            self.locks
                .iter()
                .map(|lock| lock.node().subscribe(&lock.keys().channel, patience)),
        )
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
            lost = match self.round(owner, lease).await {
                Ok(guard) => return Ok(Some(guard)),
                Err(lost) => lost,
            };
            if Instant::now() >= deadline {
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
                succeeded: lost.granted,
                required: self.quorum(),
                failures: lost.failures,
            }))
        } else {
            Ok(None)
        }
    }

    /// One attempt of the algorithm. On failure every grant has been
    /// released (or is being released, if this future is dropped) and the
    /// reasons are returned.
    async fn round(
        &self,
        owner: &Owner,
        lease: Option<Duration>,
    ) -> std::result::Result<Guard, LostRound> {
        let n = self.locks.len();
        let required = self.quorum();
        let validity_lease = lease.unwrap_or_else(|| self.locks[0].watchdog_timeout());
        // Small next to the lease the validity is measured against, whether
        // given or the watchdog's.
        let node_timeout = self
            .node_timeout
            .min(validity_lease / 10)
            .max(Duration::from_millis(1));

        // 1. Fan out to every node at once, each under its own timeout. A
        //    request cut off (by its timeout, or because the round is over)
        //    finishes in the background and is rolled back there (see
        //    `Lock::attempt`).
        let started = Instant::now();
        let mut attempts: FuturesUnordered<_> = self
            .locks
            .iter()
            .enumerate()
            .map(|(index, lock)| async move {
                let attempt =
                    match tokio::time::timeout(node_timeout, lock.attempt(owner, lease)).await {
                        Ok(attempt) => attempt,
                        Err(_) => Err(Error::NodeUnavailable {
                            node: lock.node().addr().to_owned(),
                            reason: Unavailable::Timeout,
                            source: None,
                        }),
                    };
                (index, lock, attempt)
            })
            .collect();

        // 2. Count the answers as they come. Once the quorum is out of reach,
        //    stop waiting for slow nodes: releasing now lets a competitor that
        //    split the nodes with us win instead of both waiting out timeouts.
        let mut parts = Vec::with_capacity(n);
        let mut failures = Vec::new();
        while let Some((index, lock, attempt)) = attempts.next().await {
            let node = lock.node().addr().to_owned();
            match attempt {
                Ok(Attempt::Granted(part)) => parts.push((index, part)),
                Ok(Attempt::Taken(ttl)) => failures.push(NodeFailure {
                    node,
                    cause: FailureCause::Taken(ttl),
                }),
                Err(err) => failures.push(NodeFailure {
                    node,
                    cause: FailureCause::Failed(err),
                }),
            }
            if !policy::quorum_reachable(n, required, failures.len()) {
                break;
            }
        }
        drop(attempts);
        let elapsed = started.elapsed();
        // In the order of the locks, whatever order the answers came in.
        parts.sort_unstable_by_key(|(index, _)| *index);
        let parts: Vec<HeldPart> = parts.into_iter().map(|(_, part)| part).collect();

        // 3. A quorum, still valid once acquiring time and drift are paid?
        let validity = timing::validity(validity_lease, elapsed);
        if parts.len() >= required {
            if let Some(validity) = validity {
                let token = if self.is_fenced() {
                    match self.settle_token(&parts, node_timeout).await {
                        Some(token) => Some(token),
                        None => {
                            return Err(LostRound::released(
                                parts,
                                failures,
                                elapsed,
                                node_timeout,
                            )
                            .await);
                        }
                    }
                } else {
                    None
                };
                // Every key was set after `started`, so each lives until at
                // least `started + lease`; less the drift, that is
                // `started + elapsed + validity` (the Redlock paper's T2 + validity).
                let valid_until = lease.map(|_| started + elapsed + validity);
                let shape = Shape::Quorum { nodes: n, required };
                return Ok(Guard::quorum(
                    owner.clone(),
                    parts,
                    shape,
                    valid_until,
                    token,
                ));
            }
            tracing::debug!(
                elapsed_ms = elapsed.as_millis() as u64,
                "quorum granted too late: validity spent"
            );
        }

        // 4. No: release every grant, concurrently.
        Err(LostRound::released(parts, failures, elapsed, node_timeout).await)
    }

    /// The token of a fenced round: the highest INCR among the grants, then
    /// every node's counter raised to it. `None` when fewer than a quorum of
    /// nodes confirmed the raise (the token would not be safe).
    async fn settle_token(&self, parts: &[HeldPart], node_timeout: Duration) -> Option<u64> {
        let token = parts.iter().filter_map(|p| p.token).max()?;
        let raises = join_all(self.locks.iter().map(|lock| async move {
            let raise = protocol::raise_token(lock.keys(), token);
            let raised = tokio::time::timeout(node_timeout, lock.node().run(&raise)).await;
            matches!(raised, Ok(Ok(_)))
        }))
        .await;
        let confirmed = raises.into_iter().filter(|ok| *ok).count();
        (confirmed >= self.quorum()).then_some(token)
    }
}

/// A round that did not win: how many nodes granted (all released since),
/// what the others said, and how long the fan-out took.
struct LostRound {
    granted: usize,
    failures: Vec<NodeFailure>,
    elapsed: Duration,
}

/// After a round that won some nodes but not the quorum (a split vote),
/// sleep a jittered delay, deaf to unlock messages: our own rollback has
/// just published them, and contenders that split the nodes must not retry
/// in lockstep. Returns whether it slept.
async fn back_off_after_split(lost: &LostRound, deadline: Instant) -> bool {
    if lost.granted == 0 {
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
    /// Releases every grant at once, waiting at most `patience` (the
    /// per-node timeout) so a stalled node cannot stretch the caller's wait;
    /// releases still under way then finish in the background. Failures are
    /// logged (each part's lease bounds the damage).
    async fn released(
        parts: Vec<HeldPart>,
        failures: Vec<NodeFailure>,
        elapsed: Duration,
        patience: Duration,
    ) -> LostRound {
        let granted = parts.len();
        let releases = join_all(parts.into_iter().map(HeldPart::release));
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
