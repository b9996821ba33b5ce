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

use super::policy::{self, CounterReport};
use super::{QuorumLock, QuorumPolicy};
use crate::error::{Error, FailureCause, NodeFailure, QuorumError, Result, Unavailable};
use crate::guard::{Guard, Shape};
use crate::owner::Owner;
use crate::protocol::{self, Raised};
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
    /// until granted or past the deadline. A round lost to failures that no
    /// retry can mend (bad input, a permanent error on too many nodes) ends
    /// the wait at once.
    async fn wait_for_quorum(
        &self,
        owner: &Owner,
        lease: Option<Duration>,
        deadline: Instant,
    ) -> Result<Option<Guard>> {
        let mut lost = match self.round(owner, lease).await? {
            Round::Won(guard) => return Ok(Some(guard)),
            Round::Lost(lost) => lost,
        };
        if Instant::now() >= deadline || lost.is_permanent(self) {
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
            lost = match self.round(owner, lease).await? {
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
                succeeded: lost.granted,
                required: self.quorum(),
                nodes: self.locks.len(),
                failures: lost.failures,
            }))
        } else {
            Ok(None)
        }
    }

    /// One attempt of the algorithm. Lost: every grant has been released
    /// (or is being released, if this future is dropped) and the reasons are
    /// returned. An error: the lock cannot be taken as configured.
    async fn round(&self, owner: &Owner, lease: Option<Duration>) -> Result<Round> {
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
        if let Err(err) = self.check_independent_servers() {
            // Two "nodes" granted on one server: the quorum proves nothing.
            LostRound::released(parts, failures, elapsed, node_timeout).await;
            return Err(err);
        }

        // 3. A quorum, still valid once acquiring time and drift are paid?
        if parts.len() < required || timing::validity(validity_lease, elapsed).is_none() {
            if parts.len() >= required {
                tracing::debug!(
                    elapsed_ms = elapsed.as_millis() as u64,
                    "quorum granted too late: validity spent"
                );
            }
            return Ok(Round::Lost(
                LostRound::released(parts, failures, elapsed, node_timeout).await,
            ));
        }
        let token = if self.is_fenced() {
            match self.settle_token(&parts, node_timeout).await {
                Some(token) => Some(token),
                None => {
                    tracing::debug!("no fencing token could be proven; round lost");
                    return Ok(Round::Lost(
                        LostRound::released(parts, failures, elapsed, node_timeout).await,
                    ));
                }
            }
        } else {
            None
        };
        // Still valid after the settlement's round trips?
        if timing::validity(validity_lease, started.elapsed()).is_none() {
            tracing::debug!("validity spent while settling the fencing token");
            return Ok(Round::Lost(
                LostRound::released(parts, failures, elapsed, node_timeout).await,
            ));
        }
        let parts = parts.into_iter().map(|(_, part)| part).collect();
        let shape = Shape::Quorum {
            nodes: n,
            required,
            node_timeout,
        };
        Ok(Round::Won(Guard::quorum(
            owner.clone(),
            parts,
            shape,
            token,
        )))
    }

    /// The token of a fenced round (see [`policy::settle_token`]): every
    /// node's counter raised to the highest INCR among the grants; when a
    /// node reports a higher counter than that, every node raised again to
    /// above it. `None` when no token can be proven higher than every
    /// earlier holder's, or a quorum did not confirm it.
    async fn settle_token(
        &self,
        parts: &[(usize, HeldPart)],
        node_timeout: Duration,
    ) -> Option<u64> {
        let candidate = parts.iter().filter_map(|(_, p)| p.token).max().unwrap_or(0);
        let raised = self.raise_counters(candidate, node_timeout).await;
        let reports: Vec<CounterReport> = raised
            .iter()
            .filter_map(|(index, raised)| {
                raised.map(|raised| CounterReport {
                    before: raised.before,
                    granted_here: parts.iter().any(|(granted, _)| granted == index),
                })
            })
            .collect();
        let token = policy::settle_token(candidate, &reports, self.locks.len(), self.quorum())?;
        let confirmed = if token == candidate.max(1) && candidate > 0 {
            raised.iter().filter(|(_, r)| r.is_some()).count()
        } else {
            // A node was ahead, or every counter was missing: raise again to
            // the token itself.
            let again = self.raise_counters(token, node_timeout).await;
            again
                .iter()
                .filter(|(_, r)| r.is_some_and(|r| r.after >= token))
                .count()
        };
        (confirmed >= self.quorum()).then_some(token)
    }

    /// Raises every node's fencing counter to at least `minimum`; each
    /// node's answer, `None` where it failed or was late.
    async fn raise_counters(
        &self,
        minimum: u64,
        node_timeout: Duration,
    ) -> Vec<(usize, Option<Raised>)> {
        join_all(
            self.locks
                .iter()
                .enumerate()
                .map(|(index, lock)| async move {
                    let raise = protocol::raise_token(lock.keys(), minimum);
                    let raised = tokio::time::timeout(node_timeout, lock.node().run(&raise)).await;
                    (index, raised.ok().and_then(Result::ok))
                }),
        )
        .await
    }

    /// For a policy that needs independent servers: no two nodes may be one
    /// server under two addresses (`localhost` and `127.0.0.1`, say), as
    /// their `run_id`s tell once connected.
    fn check_independent_servers(&self) -> Result<()> {
        if !P::INDEPENDENT_SERVERS {
            return Ok(());
        }
        let ids: Vec<Option<String>> = self
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
        Ok(())
    }
}

/// How a round ended.
enum Round {
    Won(Guard),
    Lost(LostRound),
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
    /// logged (each part's lease bounds the damage).
    async fn released(
        parts: Vec<(usize, HeldPart)>,
        failures: Vec<NodeFailure>,
        elapsed: Duration,
        patience: Duration,
    ) -> LostRound {
        let granted = parts.len();
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
