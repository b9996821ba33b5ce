//! The fencing token of a won multi-node round: each granted node INCRed
//! its counter (if it had one); the token handed out is made higher than
//! every counter a quorum of surviving nodes reports, and a quorum of nodes
//! is raised to it before the guard is returned. The arithmetic, and why it
//! is enough, is [`policy::settle_token`].
//!
//! Like the round, the settlement returns as soon as a quorum answered
//! (the raises still on their way are only ever raises).

use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};

use super::policy::{self, CounterReport};
use super::{QuorumLock, QuorumPolicy};
use crate::protocol::{self, Missing, Raised};
use crate::single::HeldPart;

impl<P: QuorumPolicy> QuorumLock<P> {
    /// The token of a fenced round whose grants are `parts` (by lock
    /// index): every counter raised to the highest INCR among the grants;
    /// when a node reports a higher counter (or no counter existed
    /// anywhere), raised again to the token itself. `None` when no token
    /// can be proven higher than every earlier holder's, or a quorum did not
    /// confirm it.
    pub(super) async fn settle_token(
        &self,
        parts: &[(usize, HeldPart)],
        node_timeout: Duration,
    ) -> Option<u64> {
        let (nodes, required) = (self.locks.len(), self.quorum());
        let candidate = parts
            .iter()
            .filter_map(|(_, p)| p.token())
            .max()
            .unwrap_or(0);
        let reports = |answers: &[(usize, Raised)]| -> Vec<CounterReport> {
            answers
                .iter()
                .map(|(index, raised)| CounterReport {
                    before: raised.before,
                    granted_here: parts.iter().any(|(granted, _)| granted == index),
                })
                .collect()
        };
        // Missing counters stay missing in this first raise: the candidate
        // may be below the token, and a counter created below it would
        // count as a survivor at a later settlement.
        let first = self
            .raise_counters(candidate, Missing::Leave, node_timeout, |answers| {
                policy::settle_token(candidate, &reports(answers), nodes, required).is_some()
            })
            .await;
        let token = policy::settle_token(candidate, &reports(&first), nodes, required)?;
        let any_missing = first.iter().any(|(_, raised)| raised.before.is_none());
        let confirmed = if candidate > 0 && token == candidate && !any_missing {
            // Every answer raised its counter to at least the candidate.
            first.len()
        } else {
            // Raised again to the token, which also seeds missing counters
            // with it: a settled token, never a lower value.
            let raised_to_token = |answers: &[(usize, Raised)]| {
                answers.iter().filter(|(_, r)| r.after >= token).count()
            };
            let second = self
                .raise_counters(token, Missing::Seed, node_timeout, |answers| {
                    raised_to_token(answers) >= required
                })
                .await;
            raised_to_token(&second)
        };
        (confirmed >= required).then_some(token)
    }

    /// Raises every node's counter to at least `minimum` (a missing one is
    /// left or seeded, as `missing` says), each under `node_timeout`, until
    /// `enough` says the answers so far suffice (or every node answered or
    /// failed). The answers, by lock index.
    async fn raise_counters(
        &self,
        minimum: u64,
        missing: Missing,
        node_timeout: Duration,
        enough: impl Fn(&[(usize, Raised)]) -> bool,
    ) -> Vec<(usize, Raised)> {
        let mut raises: FuturesUnordered<_> = self
            .locks
            .iter()
            .enumerate()
            .map(|(index, lock)| async move {
                let raise = protocol::raise_token(lock.keys(), minimum, missing);
                let raised =
                    tokio::time::timeout(node_timeout, lock.node().run(lock.lane(), &raise)).await;
                (index, raised.ok().and_then(Result::ok))
            })
            .collect();
        let mut answers = Vec::with_capacity(self.locks.len());
        while let Some((index, raised)) = raises.next().await {
            if let Some(raised) = raised {
                answers.push((index, raised));
                if enough(&answers) {
                    break;
                }
            }
        }
        answers
    }
}
