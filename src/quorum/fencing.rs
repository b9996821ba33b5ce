//! The fencing token of a won multi-node round, in three steps (the
//! protocol the model in `crate::fencing` checks):
//!
//! 1. **Read**: once the quorum is complete, read every counter, raising
//!    it to a guess (one above the highest counter the grants reported).
//!    Read only now: an acquire's own reply may predate the previous
//!    holder's seal (it held other nodes then); a read sent after the last
//!    grant cannot. The token is above every counter read (so it never
//!    equals a rival's) and proven above every earlier token by enough
//!    witnesses ([`rules::settle_token`]: counters their node vouches for,
//!    read with them, see `protocol::raise_token`), or, when too few counters
//!    survive, taken from the wall-clock floor once every node answered or
//!    a quorum did and the others had the round's grace (a dead master
//!    costs the grace, never the name).
//! 2. **Seal**: a quorum of nodes holds the token (the read already sealed
//!    it when nothing was at or above the guess and no node is known to
//!    have restarted; else a raise to the token, which also seeds missing
//!    counters with it). A restarted node is waited for (up to the node
//!    timeout), and the seal repairs it: the token is above every counter
//!    of the proof the read made, which is all a repair writes.
//! 3. **Check**: once every write of the seal landed, a quorum still holds
//!    it. A node that restarted between its seal and the hand-out would
//!    otherwise count, while a repair that read before the seal landed
//!    elsewhere could put it back below the token.
//!
//! Like the round, each step returns as soon as it has what it needs.

use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};

use super::policy::grace;
use super::{QuorumLock, QuorumPolicy};
use crate::fencing::rules::{self, CounterReport, Settled};
use crate::fencing::{Group, Part};
use crate::protocol::{self, Missing, Raised};
use crate::single::HeldPart;

impl<P: QuorumPolicy> QuorumLock<P> {
    /// The token of a fenced round whose grants are `parts` (by lock
    /// index); `None` when none can be proven, or a quorum did not keep it.
    pub(super) async fn settle_token(
        &self,
        parts: &[(usize, HeldPart)],
        node_timeout: Duration,
    ) -> Option<u64> {
        let (nodes, required) = (self.locks.len(), self.quorum());
        let book = self.locks[0].core().fencing.clone();
        let group = Group::new(
            self.locks
                .iter()
                .map(|lock| Part {
                    node: lock.node().clone(),
                    keys: lock.keys().clone(),
                    lane: lock.lane(),
                })
                .collect(),
            required,
        );
        book.watch(&group);
        let _settling = book.settling(&self.locks[0].keys().name);
        // The grants reported their counters (a quorum's acquire does not
        // INCR: only the settlement writes them).
        let guess = parts
            .iter()
            .filter_map(|(_, p)| p.token())
            .max()
            .unwrap_or(0)
            + 1;

        // 1. Read (and raise to the guess).
        let reports = |answers: &[(usize, Raised)]| -> Vec<CounterReport> {
            answers
                .iter()
                .map(|(index, raised)| CounterReport {
                    value: raised.before,
                    // Vouched for by its node, and not seen restarting by
                    // this client since it last repaired it.
                    intact: raised.vouched && book.is_intact(&group.parts[*index]),
                })
                .collect()
        };
        let sealed_at = |answers: &[(usize, Raised)], token: u64| {
            answers.iter().filter(|(_, r)| r.after >= token).count()
        };
        let floor = crate::timing::token_floor();
        let settle = |answers: &[(usize, Raised)], waited_out| {
            rules::settle_token(&reports(answers), nodes, required, guess, floor, waited_out)
        };
        let (read, waited_out) = self
            .raise_counters(
                guess,
                Missing::Leave,
                node_timeout,
                &group,
                Patience::Grace,
                |answers| {
                    settle(answers, false).is_some_and(|settled| {
                        settled.token() != guess || sealed_at(answers, guess) >= required
                    })
                },
            )
            .await;
        let settled = settle(&read, waited_out)?;
        let token = settled.token();
        if let Settled::Floor(_) = settled {
            let answered = read.len();
            let new_name = !book.has_seen(self.name());
            if new_name {
                tracing::debug!(lock = %self.name(), token, answered, nodes, "first fenced grant: the token starts at the wall-clock floor");
            } else {
                tracing::warn!(lock = %self.name(), token, answered, nodes, "too few of this lock's fencing counters are vouched for (lost, restored from a stale dump, or written before vouches) to prove a token: it continues from the wall-clock floor");
            }
            crate::metrics::fencing_floor(new_name);
        }

        // 2. Seal.
        // Every node known to have restarted, whether it answered the read
        // or not, and every node whose counter the read found not vouched
        // for: the seal repairs it (a grant with every node up leaves
        // every node repaired, even if the round returned at quorum).
        let restarted: Vec<usize> = (0..nodes)
            .filter(|&index| {
                !book.is_intact(&group.parts[index])
                    || read.iter().any(|(i, r)| *i == index && !r.vouched)
            })
            .collect();
        let sealed: Vec<usize> =
            if token == guess && restarted.is_empty() && sealed_at(&read, token) >= required {
                read.iter()
                    .filter(|(_, r)| r.after >= token)
                    .map(|(i, _)| *i)
                    .collect()
            } else {
                let (raised, _) = self
                    .raise_counters(
                        token,
                        Missing::Seed,
                        node_timeout,
                        &group,
                        Patience::Enough,
                        |answers| {
                            sealed_at(answers, token) >= required
                                && restarted
                                    .iter()
                                    .all(|r| answers.iter().any(|(i, _)| i == r))
                        },
                    )
                    .await;
                raised
                    .iter()
                    .filter(|(_, r)| r.after >= token)
                    .map(|(i, _)| *i)
                    .collect()
            };
        if sealed.len() < required {
            return None;
        }

        // 3. Check, now that every write of the seal has landed.
        let mut checks: FuturesUnordered<_> = sealed
            .iter()
            .map(|&index| {
                let lock = &self.locks[index];
                async move {
                    let read = protocol::read_token(lock.keys());
                    let counter =
                        tokio::time::timeout(node_timeout, lock.node().run(lock.lane(), &read))
                            .await;
                    counter.ok().and_then(Result::ok).flatten()
                }
            })
            .collect();
        let mut kept = 0;
        while let Some(counter) = checks.next().await {
            if counter.is_some_and(|c| c >= token) {
                kept += 1;
                if kept >= required {
                    return Some(token);
                }
            }
        }
        tracing::debug!(lock = %self.name(), token, "the seal did not hold on a quorum");
        None
    }

    /// Raises every node's counter to at least `minimum` (a missing one is
    /// left or seeded, as `missing` says), each under `node_timeout`, until
    /// `enough` says the answers so far suffice, every node answered or
    /// failed, or (with [`Patience::Grace`]) a quorum answered and the
    /// others had the round's grace. Every answer tells the client's book
    /// what the node held; a seal (`Missing::Seed`: `minimum` is a settled
    /// token) that landed on a restarted node repairs it. The answers, by
    /// lock index, and whether the raise waited the others out (it did not
    /// stop because `enough` said so).
    async fn raise_counters(
        &self,
        minimum: u64,
        missing: Missing,
        node_timeout: Duration,
        group: &Group,
        patience: Patience,
        enough: impl Fn(&[(usize, Raised)]) -> bool,
    ) -> (Vec<(usize, Raised)>, bool) {
        let book = &self.locks[0].core().fencing;
        let mut raises: FuturesUnordered<_> = self
            .locks
            .iter()
            .enumerate()
            .map(|(index, lock)| async move {
                let generation = lock.node().generation();
                let sent_at = tokio::time::Instant::now();
                let raise =
                    protocol::raise_token(lock.keys(), minimum, missing, book.counter_expiry);
                let raised =
                    tokio::time::timeout(node_timeout, lock.node().run(lock.lane(), &raise)).await;
                (index, generation, sent_at, raised.ok().and_then(Result::ok))
            })
            .collect();
        let mut answers = Vec::with_capacity(self.locks.len());
        let started = tokio::time::Instant::now();
        let mut grace_ends = None;
        loop {
            let next = match grace_ends {
                None => raises.next().await,
                Some(ends) => match tokio::time::timeout_at(ends, raises.next()).await {
                    Ok(next) => next,
                    Err(_) => return (answers, true),
                },
            };
            let Some((index, generation, sent_at, raised)) = next else {
                return (answers, true);
            };
            if let Some(raised) = raised {
                book.observe(&group.parts[index], group, raised.before, sent_at);
                if missing == Missing::Seed && raised.after >= minimum {
                    book.sealed(&group.parts[index], generation, Some(raised.after));
                }
                answers.push((index, raised));
                if enough(&answers) {
                    return (answers, false);
                }
                if patience == Patience::Grace
                    && grace_ends.is_none()
                    && answers.len() >= self.quorum()
                {
                    grace_ends = Some(tokio::time::Instant::now() + grace(started.elapsed()));
                }
            }
        }
    }
}

/// How long [`QuorumLock::raise_counters`] waits for the nodes that have
/// not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Patience {
    /// Until the answers are enough, or every node answered or failed.
    Enough,
    /// The same, or until the round's grace after a quorum answered.
    Grace,
}
