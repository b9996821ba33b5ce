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
//! 2. **Seal**: a quorum of nodes holds the token, each raised to it by
//!    this settlement (the read already sealed it when nothing was at or
//!    above the guess and no node is known to have restarted; else a raise
//!    to the token, which also seeds missing counters with it). A node a
//!    rival settlement raised to the token first does not count: two
//!    holders at once (a hold lost in a restart, two locks named onto one
//!    counter) never share a token, and the one that finds its token taken
//!    seals a higher one. A restarted node is waited for (up to the node
//!    timeout), and the seal repairs it: the token is above every counter
//!    of the proof the read made, which is all a repair writes.
//! 3. **Check**: once every write of the seal landed, a quorum still holds
//!    it. A node that restarted between its seal and the hand-out would
//!    otherwise count, while a repair that read before the seal landed
//!    elsewhere could put it back below the token.
//!
//! Like the round, each step returns as soon as it has what it needs.

use std::time::Duration;

use futures::FutureExt;
use futures::stream::StreamExt;

use super::fan_out::FanOut;
use super::grace::{FanOutTimer, Next};
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
        // The nodes this settlement raised to `token` itself: a raise is
        // atomic, so of two settlements raising a node to one value only
        // the first finds it below. A token sealed this way on a quorum is
        // this holder's alone, whoever else settles the counter at once (a
        // hold lost in a restart, another lock named onto the same
        // counter): the quorums share a node.
        let claimed =
            |r: &Raised, token: u64| r.before.is_none_or(|b| b < token) && r.after >= token;
        let sealed_at = |answers: &[(usize, Raised)], token: u64| {
            answers.iter().filter(|(_, r)| claimed(r, token)).count()
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
        // What the read claimed: the nodes it raised to the guess, when
        // that is the token.
        let read_claimed = |index: usize, token: u64| {
            token == guess && read.iter().any(|(i, r)| *i == index && claimed(r, token))
        };
        let mut token = token;
        let sealed: Vec<usize> = if token == guess
            && restarted.is_empty()
            && sealed_at(&read, token) >= required
        {
            read.iter()
                .filter(|(_, r)| claimed(r, token))
                .map(|(i, _)| *i)
                .collect()
        } else {
            let mut tries = 0;
            loop {
                let seals = |answers: &[(usize, Raised)], token: u64| -> Vec<usize> {
                    answers
                        .iter()
                        .filter(|(i, r)| claimed(r, token) || read_claimed(*i, token))
                        .map(|(i, _)| *i)
                        .collect()
                };
                let (raised, _) = self
                    .raise_counters(
                        token,
                        Missing::Seed,
                        node_timeout,
                        &group,
                        Patience::Enough,
                        |answers| {
                            seals(answers, token).len() >= required
                                && restarted
                                    .iter()
                                    .all(|r| answers.iter().any(|(i, _)| i == r))
                        },
                    )
                    .await;
                let sealed = seals(&raised, token);
                if sealed.len() >= required {
                    break sealed;
                }
                // A rival raised a node to the token or past it first
                // (two holders at once): a higher token, still above every
                // counter read, by a random step so that two settlements
                // that crossed part.
                tries += 1;
                let rival = raised.iter().filter_map(|(_, r)| r.before).max();
                let next = rival.map(|rival| rival + 1 + rand::random_range(0..RIVAL_STEP));
                match (rival, next) {
                    (Some(rival), Some(next))
                        if rival >= token && tries < SEAL_TRIES && next <= LAST_TOKEN =>
                    {
                        tracing::debug!(lock = %self.name(), token, rival, "a rival settlement claimed the token first: sealing a higher one");
                        token = next;
                    }
                    _ => return None,
                }
            }
        };

        // 3. Check, now that every write of the seal has landed.
        let mut checks: FanOut<_> = sealed
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
                .boxed()
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
        // One timer for every node's timeout: they leave together.
        let mut timer = FanOutTimer::new(&self.pace, Some(node_timeout), node_timeout);
        let mut raises: FanOut<_> = self
            .locks
            .iter()
            .enumerate()
            .map(|(index, lock)| {
                async move {
                    let generation = lock.node().generation();
                    let sent_at = tokio::time::Instant::now();
                    let raise =
                        protocol::raise_token(lock.keys(), minimum, missing, book.counter_expiry);
                    let raised = lock.node().run(lock.lane(), &raise).await;
                    (index, generation, sent_at, raised.ok())
                }
                .boxed()
            })
            .collect();
        let mut answers = Vec::with_capacity(self.locks.len());
        let mut quorum_reached = false;
        loop {
            let (index, generation, sent_at, raised) = match timer.next(&mut raises).await {
                Next::Answer(answer) => answer,
                Next::Done | Next::GraceOver | Next::CutOff => return (answers, true),
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
                if patience == Patience::Grace && !quorum_reached && answers.len() >= self.quorum()
                {
                    quorum_reached = true;
                    timer.quorum_reached();
                }
            }
        }
    }
}

/// Seals tried by one settlement whose token a rival claimed first.
const SEAL_TRIES: u32 = 3;
/// The random part of the step above a rival's token.
const RIVAL_STEP: u64 = 64;
/// The last token the scripts settle exactly (2^53 - 1, see
/// `protocol::raise_token`).
const LAST_TOKEN: u64 = (1 << 53) - 1;

/// How long [`QuorumLock::raise_counters`] waits for the nodes that have
/// not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Patience {
    /// Until the answers are enough, or every node answered or failed.
    Enough,
    /// The same, or until the round's grace after a quorum answered.
    Grace,
}
