//! The fenced quorum protocol, model-checked with stateright.
//!
//! Nodes, clients and the network are explicit: every request is a message
//! that can land in any order, or be lost (its reply reaches the client as
//! it lands: a client acts on what it hears, in the order requests landed;
//! an answer it stopped waiting for is stale whenever it comes); nodes crash
//! (losing their counters and lock keys) and come back empty under a new
//! epoch (their `run_id`); a client may give up on answers still on their
//! way at any moment (its timeouts), and a holder's lease may end at any
//! moment. The clients decide with the crate's own rules
//! ([`super::rules`]). Properties:
//!
//! - tokens of successive grants strictly increase;
//! - no two holders at once;
//! - once a name was fenced, while at most `nodes - required` nodes are
//!   impaired (down, or restarted and not yet repaired), a fenced grant
//!   stays possible: from every quiet state, a client that tries, with
//!   nothing failing, gets one.
//!
//! Faults follow the guarantee's condition: a node may crash only while the
//! clients have no background work that could progress (every restart
//! noticed, every repair done or blocked) and at most `nodes - required`
//! nodes stay impaired; a crashed node comes back only once the rounds that
//! held the lock there are over (Redlock's delayed restart). The same model
//! runs the design this crate had before ([`Design::Lazy`]), and the checker
//! finds its defect (see the tests in [`super`]).

use std::hash::Hash;

use stateright::{Checker, Model, Property};

use super::rules::{self, CounterReport};

/// Which protocol the clients run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Design {
    /// Before the fix: a token is settled by raising every counter, and a
    /// restarted node's counter is seeded only by a later settlement; no
    /// restart detection, no check after the raise.
    Lazy,
    /// The shipped protocol: restarts detected (epoch, missing or lower
    /// counter) and repaired at once to the highest counter of enough
    /// witnesses, left out of proofs until then; a token sealed on a
    /// quorum and checked there before it is handed out.
    Eager,
}

/// The bounds of one check.
#[derive(Debug, Clone)]
pub(super) struct Fenced {
    pub(super) design: Design,
    pub(super) nodes: usize,
    pub(super) clients: usize,
    /// Grants the clients may make between them.
    pub(super) grants: u8,
    /// Node crashes (each loses the node's data).
    pub(super) crashes: u8,
    /// Messages the network may lose.
    pub(super) drops: u8,
    /// Rounds the clients may start between them (each INCRs counters:
    /// the state space is finite only with a bound).
    pub(super) rounds: u8,
    /// Repairs the clients may start between them.
    pub(super) repairs: u8,
    /// Start from a name fenced once (every counter at 1, seen by both
    /// clients) instead of a fresh one.
    pub(super) fenced_once: bool,
    /// Let nodes crash beyond the guarantee's condition (more than
    /// `nodes - required` impaired at once): tokens must still never go
    /// back (the floor takes over), liveness is not claimed.
    pub(super) beyond: bool,
}

impl Fenced {
    fn required(&self) -> usize {
        self.nodes / 2 + 1
    }

    fn tolerated(&self) -> usize {
        self.nodes - self.required()
    }
}

type Mask = u8;

fn bit(n: usize) -> Mask {
    1 << n
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Node {
    up: bool,
    epoch: u8,
    counter: Option<u64>,
    /// The lock's holds here, `(client, round)`, all of one client (its
    /// hash field: one hold per acquire that landed; a rollback or a
    /// release names its round and takes that hold only).
    holds: Vec<(u8, u8)>,
    /// The holds when it crashed: it comes back only once their rounds
    /// are over.
    crashed_holds: Vec<(u8, u8)>,
}

/// What a client learned from one node in the phase under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Answer {
    Pending,
    /// Gave up on it.
    None,
    Granted(Option<u64>),
    Taken(Option<u64>),
    /// A raise (or a read): the counter before it and after it.
    Counter(Option<u64>, Option<u64>),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Phase {
    Idle,
    Acquiring,
    /// Eager: every counter read and raised to the guess (one above the
    /// highest counter the grants reported), once the quorum is complete.
    Reading {
        guess: u64,
    },
    /// Lazy: raising every counter (stage 1: to the candidate; stage 2:
    /// to the token).
    Raising {
        stage: u8,
        candidate: u64,
        token: u64,
    },
    Sealing {
        token: u64,
    },
    Checking {
        token: u64,
    },
    Holding {
        token: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Repair {
    Reading { target: u8 },
    Writing { target: u8, epoch: u8 },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Client {
    phase: Phase,
    /// The request batch under way: replies to older ones are stale.
    seq: u8,
    /// The round under way: its acquires' hold id.
    round: u8,
    answers: Vec<Answer>,
    /// The round's acquire answers, kept for the settlement.
    acquired: Vec<Answer>,
    known_epoch: Vec<Option<u8>>,
    last_seen: Vec<Option<u64>>,
    unrepaired: Mask,
    repair: Option<Repair>,
    repair_seq: u8,
    repair_answers: Vec<Answer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Body {
    /// `round`: the hold id.
    Acquire { round: u8 },
    /// Raise to `min`, creating a missing counter at `min` if `seed`. A
    /// read is a raise to 0 that creates nothing.
    Raise { min: u64, seed: bool },
    AcquireReply {
        granted: bool,
        round: u8,
        counter: Option<u64>,
        epoch: u8,
    },
    /// A raise's reply: the counter before and after it.
    CounterReply {
        before: Option<u64>,
        after: Option<u64>,
        epoch: u8,
    },
}

/// One message; `repair`: a repair's request or its reply.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Msg {
    client: u8,
    node: u8,
    seq: u8,
    repair: bool,
    body: Body,
}

impl Msg {
    fn to_node(&self) -> bool {
        matches!(self.body, Body::Acquire { .. } | Body::Raise { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct State {
    nodes: Vec<Node>,
    clients: Vec<Client>,
    /// In flight, sorted: a multiset, any of which may come next.
    net: Vec<Msg>,
    crashes_left: u8,
    drops_left: u8,
    grants_left: u8,
    rounds_left: u8,
    repairs_left: u8,
    /// The highest token handed out so far.
    last_token: u64,
    /// A token was handed out that was not above every earlier one.
    inverted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Action {
    Deliver(usize),
    Drop(usize),
    Start(u8),
    /// The client goes on with the quorum of answers it has.
    ReturnAtQuorum(u8),
    Release(u8),
    /// The client's lease runs out: its keys expire everywhere.
    Expire(u8),
    /// The client sees a node's new epoch (a reconnect after a restart).
    Notice(u8, u8),
    /// The client starts repairing a node it knows restarted.
    StartRepair(u8, u8),
    Crash(u8),
    Revive(u8),
}

impl Fenced {
    fn send(&self, state: &mut State, msg: Msg) {
        // A request to a node that is down fails at once (refused): it
        // never lands, not even on the node once it is back.
        if !state.nodes[msg.node as usize].up {
            return;
        }
        let at = state.net.binary_search(&msg).unwrap_or_else(|at| at);
        state.net.insert(at, msg);
    }

    fn to_node(&self, state: &mut State, client: u8, node: usize, body: Body) {
        let seq = state.clients[client as usize].seq;
        self.send(
            state,
            Msg {
                client,
                node: node as u8,
                seq,
                repair: false,
                body,
            },
        );
    }

    fn deliver(&self, state: &mut State, msg: Msg) {
        if msg.to_node() {
            self.deliver_to_node(state, msg);
        } else {
            self.deliver_to_client(state, msg);
        }
    }

    // -----------------------------------------------------------------
    // Faults and background work

    /// Down, or restarted and not yet noticed or repaired by a client.
    fn impaired(&self, state: &State, node: usize) -> bool {
        let n = &state.nodes[node];
        !n.up
            || (self.design == Design::Eager
                && state.clients.iter().any(|c| {
                    c.unrepaired & bit(node) != 0
                        || c.known_epoch[node].is_some_and(|e| e != n.epoch)
                }))
    }

    fn impaired_count(&self, state: &State) -> usize {
        (0..self.nodes).filter(|&n| self.impaired(state, n)).count()
    }

    /// No background work that could progress: every restart of a node
    /// that is up noticed, and no repair under way or able to start.
    fn background_quiet(&self, state: &State) -> bool {
        if self.design == Design::Lazy {
            return true;
        }
        !state.net.iter().any(|m| m.repair)
            && state.clients.iter().all(|c| {
                c.repair.is_none()
                    && (0..self.nodes).all(|n| {
                        !state.nodes[n].up
                            || c.known_epoch[n].is_none_or(|e| e == state.nodes[n].epoch)
                    })
                    && (0..self.nodes).all(|t| !self.repair_can_progress(state, c, t))
            })
    }

    /// Whether `client` could repair `target` now.
    fn repair_can_progress(&self, state: &State, client: &Client, target: usize) -> bool {
        if client.unrepaired & bit(target) == 0 {
            return false;
        }
        let others_up = (0..self.nodes)
            .filter(|&n| n != target && state.nodes[n].up)
            .count();
        let trusted_up = (0..self.nodes)
            .filter(|&n| n != target && state.nodes[n].up && client.unrepaired & bit(n) == 0)
            .count();
        let none_has_one = (0..self.nodes).all(|n| n == target || state.nodes[n].counter.is_none());
        state.nodes[target].up
            && (trusted_up >= rules::witnesses_needed(self.nodes, self.required())
                || (others_up + 1 == self.nodes && none_has_one))
    }

    /// What a reply from `node` says of a restart (the Eager design
    /// watches: a new epoch, or a counter missing or lower than seen).
    fn observe(&self, client: &mut Client, node: usize, epoch: u8, counter: Option<u64>) {
        if self.design == Design::Lazy {
            return;
        }
        let seen_elsewhere = (0..self.nodes).any(|n| n != node && client.last_seen[n].is_some());
        if client.known_epoch[node].is_some_and(|known| known != epoch)
            || rules::counter_needs_repair(client.last_seen[node], counter, seen_elsewhere)
        {
            client.unrepaired |= bit(node);
        }
        client.known_epoch[node] = Some(epoch);
        if client.unrepaired & bit(node) == 0 {
            client.last_seen[node] = client.last_seen[node].max(counter);
        }
    }

    fn notice(&self, state: &mut State, client: u8, node: u8) {
        let epoch = state.nodes[node as usize].epoch;
        let c = &mut state.clients[client as usize];
        if c.known_epoch[node as usize].is_some_and(|e| e != epoch) {
            c.unrepaired |= bit(node as usize);
        }
        c.known_epoch[node as usize] = Some(epoch);
    }

    fn start_repair(&self, state: &mut State, client: u8, target: usize) {
        let c = &mut state.clients[client as usize];
        c.repair_seq = c.repair_seq.wrapping_add(1);
        let seq = c.repair_seq;
        c.repair = Some(Repair::Reading {
            target: target as u8,
        });
        c.repair_answers = vec![Answer::Pending; self.nodes];
        c.repair_answers[target] = Answer::None;
        for node in (0..self.nodes).filter(|&n| n != target) {
            self.send(
                state,
                Msg {
                    client,
                    node: node as u8,
                    seq,
                    repair: true,
                    body: Body::Raise {
                        min: 0,
                        seed: false,
                    },
                },
            );
        }
    }

    fn repair_reply(
        &self,
        state: &mut State,
        client: u8,
        msg: &Msg,
        epoch: u8,
        counter: Option<u64>,
    ) {
        let node = msg.node as usize;
        let c = &mut state.clients[client as usize];
        if msg.seq != c.repair_seq {
            return;
        }
        match c.repair.clone() {
            Some(Repair::Reading { target }) => {
                c.repair_answers[node] = Answer::Counter(counter, counter);
                self.repair_progress(state, client, target as usize, false);
            }
            Some(Repair::Writing {
                target,
                epoch: expected,
            }) if node == target as usize => {
                c.repair = None;
                // Repaired only if the node did not restart again meanwhile.
                if epoch == expected && c.known_epoch[node] == Some(epoch) {
                    c.unrepaired &= !bit(node);
                    c.last_seen[node] = counter;
                }
            }
            _ => {}
        }
    }

    fn repair_progress(&self, state: &mut State, client: u8, target: usize, gave_up: bool) {
        let c = &mut state.clients[client as usize];
        let reports: Vec<CounterReport> = (0..self.nodes)
            .filter(|&n| n != target)
            .filter_map(|n| match c.repair_answers[n] {
                Answer::Counter(_, value) => Some(CounterReport {
                    value,
                    intact: c.unrepaired & bit(n) == 0,
                }),
                _ => None,
            })
            .collect();
        let pending = c.repair_answers.contains(&Answer::Pending);
        match rules::repair_value(&reports, self.nodes, self.required()) {
            Some(value) => {
                let Some(epoch) = c.known_epoch[target] else {
                    c.repair = None;
                    return;
                };
                c.repair_seq = c.repair_seq.wrapping_add(1);
                let seq = c.repair_seq;
                c.repair = Some(Repair::Writing {
                    target: target as u8,
                    epoch,
                });
                self.send(
                    state,
                    Msg {
                        client,
                        node: target as u8,
                        seq,
                        repair: true,
                        body: Body::Raise {
                            min: value.unwrap_or(0),
                            seed: value.is_some(),
                        },
                    },
                );
            }
            None if gave_up || !pending => c.repair = None,
            None => {}
        }
    }

    // -----------------------------------------------------------------
    // Rounds

    fn next_phase(&self, state: &mut State, client: u8, phase: Phase) {
        let c = &mut state.clients[client as usize];
        c.phase = phase;
        c.seq = c.seq.wrapping_add(1);
        c.answers = vec![Answer::Pending; self.nodes];
    }

    fn broadcast(&self, state: &mut State, client: u8, body: Body) {
        for node in 0..self.nodes {
            self.to_node(state, client, node, body.clone());
        }
    }

    fn start(&self, state: &mut State, client: u8) {
        self.next_phase(state, client, Phase::Acquiring);
        let c = &mut state.clients[client as usize];
        c.round = c.round.wrapping_add(1);
        let round = c.round;
        self.broadcast(state, client, Body::Acquire { round });
    }

    /// The round is over (lost, released or expired): every hold it may
    /// have left is released.
    ///
    /// The release is applied at once, and an acquire of the round still
    /// on its way is refused when it lands: what the crate's rollback does
    /// (its tombstone). A release that is itself late only keeps the lock
    /// longer, which `Expire` covers.
    fn end_round(&self, state: &mut State, client: u8) {
        let round = state.clients[client as usize].round;
        for node in &mut state.nodes {
            node.holds.retain(|hold| *hold != (client, round));
        }
        state
            .net
            .retain(|m| !(m.client == client && m.body == Body::Acquire { round }));
        let c = &mut state.clients[client as usize];
        c.phase = Phase::Idle;
        c.seq = c.seq.wrapping_add(1);
    }

    fn hand_out(&self, state: &mut State, client: u8, token: u64) {
        if token <= state.last_token {
            state.inverted = true;
        }
        state.last_token = state.last_token.max(token);
        state.clients[client as usize].phase = Phase::Holding { token };
        state.grants_left = state.grants_left.saturating_sub(1);
    }

    /// What the read found: each counter before the read raised it.
    fn reports(&self, client: &Client, answers: &[Answer]) -> Vec<CounterReport> {
        answers
            .iter()
            .enumerate()
            .filter_map(|(node, answer)| {
                let Answer::Counter(before, _) = *answer else {
                    return None;
                };
                Some(CounterReport {
                    value: before,
                    intact: client.unrepaired & bit(node) == 0,
                })
            })
            .collect()
    }

    /// Moves the round on once every answer came, or the client gave up on
    /// the rest.
    fn progress(&self, state: &mut State, client: u8, gave_up: bool) {
        let c = &state.clients[client as usize];
        if c.answers.contains(&Answer::Pending) && !gave_up {
            return;
        }
        let answers: Vec<Answer> = c
            .answers
            .iter()
            .map(|a| {
                if *a == Answer::Pending {
                    Answer::None
                } else {
                    *a
                }
            })
            .collect();
        let (nodes, required) = (self.nodes, self.required());
        match c.phase.clone() {
            Phase::Acquiring => {
                let granted = answers
                    .iter()
                    .filter(|a| matches!(a, Answer::Granted(_)))
                    .count();
                if granted < required {
                    return self.end_round(state, client);
                }
                state.clients[client as usize].acquired = answers.clone();
                let candidate = answers
                    .iter()
                    .filter_map(|a| match a {
                        Answer::Granted(v) => *v,
                        _ => None,
                    })
                    .max()
                    .unwrap_or(0);
                // Counters are read only now that the quorum is complete:
                // an acquire's reply may predate the previous holder's seal
                // (it held other nodes then), a read sent after the last
                // grant cannot.
                match self.design {
                    Design::Eager => {
                        let guess = candidate + 1;
                        self.next_phase(state, client, Phase::Reading { guess });
                        self.broadcast(
                            state,
                            client,
                            Body::Raise {
                                min: guess,
                                seed: false,
                            },
                        );
                    }
                    Design::Lazy => {
                        self.next_phase(
                            state,
                            client,
                            Phase::Raising {
                                stage: 1,
                                candidate,
                                token: 0,
                            },
                        );
                        self.broadcast(
                            state,
                            client,
                            Body::Raise {
                                min: candidate,
                                seed: false,
                            },
                        );
                    }
                }
            }
            Phase::Reading { guess } => {
                let reports = self.reports(&state.clients[client as usize], &answers);
                // The floor's assumption: the wall clock is past every
                // token handed out.
                let floor = state.last_token + 1;
                let Some(settled) = rules::settle_token(&reports, nodes, required, guess, floor)
                else {
                    return self.end_round(state, client);
                };
                let token = settled.token();
                let c = &state.clients[client as usize];
                // A node known to have restarted is sealed (and so repaired).
                if token == guess && c.unrepaired == 0 {
                    // Nothing was at or above the guess: the read sealed it.
                    self.check_seal(state, client, token, &answers);
                } else {
                    self.next_phase(state, client, Phase::Sealing { token });
                    self.broadcast(
                        state,
                        client,
                        Body::Raise {
                            min: token,
                            seed: true,
                        },
                    );
                }
            }
            Phase::Sealing { token } => self.check_seal(state, client, token, &answers),
            Phase::Checking { token } => {
                let held = answers
                    .iter()
                    .filter(|a| matches!(a, Answer::Counter(_, Some(v)) if *v >= token))
                    .count();
                if held >= required {
                    self.hand_out(state, client, token);
                } else {
                    self.end_round(state, client);
                }
            }
            Phase::Raising {
                stage,
                candidate,
                token,
            } => self.lazy_raise(state, client, &answers, stage, candidate, token),
            Phase::Idle | Phase::Holding { .. } => {}
        }
    }

    /// A seal's answers: once a quorum holds the token, check on those
    /// nodes, after every write of the seal landed, that it is still there
    /// (a node that restarted since would not count).
    fn check_seal(&self, state: &mut State, client: u8, token: u64, answers: &[Answer]) {
        let acked: Vec<bool> = answers
            .iter()
            .map(|a| matches!(a, Answer::Counter(_, Some(v)) if *v >= token))
            .collect();
        if acked.iter().filter(|a| **a).count() < self.required() {
            return self.end_round(state, client);
        }
        self.next_phase(state, client, Phase::Checking { token });
        for (node, acked) in acked.into_iter().enumerate() {
            if acked {
                self.to_node(
                    state,
                    client,
                    node,
                    Body::Raise {
                        min: 0,
                        seed: false,
                    },
                );
            } else {
                state.clients[client as usize].answers[node] = Answer::None;
            }
        }
    }

    /// The settlement before the fix (`quorum/fencing.rs` and
    /// `policy::settle_token` then): raise every counter to the candidate
    /// (the grants' highest INCR), leaving missing ones missing; once a
    /// quorum of surviving counters, or every node, answered, the token is
    /// above every counter; raise again to the token (seeding missing
    /// counters) unless every answer already holds it.
    fn lazy_raise(
        &self,
        state: &mut State,
        client: u8,
        answers: &[Answer],
        stage: u8,
        candidate: u64,
        token: u64,
    ) {
        let (nodes, required) = (self.nodes, self.required());
        let acquired = state.clients[client as usize].acquired.clone();
        let answered: Vec<(usize, Option<u64>)> = answers
            .iter()
            .enumerate()
            .filter_map(|(n, a)| match a {
                // Stage 1 reads what was there, stage 2 what it left.
                Answer::Counter(before, after) => {
                    Some((n, if stage == 1 { *before } else { *after }))
                }
                _ => None,
            })
            .collect();
        if stage == 1 {
            let surviving = answered.iter().filter(|(_, b)| b.is_some()).count();
            if surviving < required && answered.len() < nodes {
                return self.end_round(state, client);
            }
            let above = answered
                .iter()
                .filter_map(|(n, before)| {
                    let ours = matches!(acquired[*n], Answer::Granted(_));
                    before.map(|b| if ours { b } else { b + 1 })
                })
                .max()
                .unwrap_or(0);
            let token = candidate.max(above).max(1);
            let any_missing = answered.iter().any(|(_, b)| b.is_none());
            if candidate > 0 && token == candidate && !any_missing {
                if answered.len() >= required {
                    self.hand_out(state, client, token);
                } else {
                    self.end_round(state, client);
                }
            } else {
                self.next_phase(
                    state,
                    client,
                    Phase::Raising {
                        stage: 2,
                        candidate,
                        token,
                    },
                );
                self.broadcast(
                    state,
                    client,
                    Body::Raise {
                        min: token,
                        seed: true,
                    },
                );
            }
        } else {
            let raised = answered
                .iter()
                .filter(|(_, after)| after.is_some_and(|a| a >= token))
                .count();
            if raised >= required {
                self.hand_out(state, client, token);
            } else {
                self.end_round(state, client);
            }
        }
    }

    /// Whether an answer `client` waits for (in its round, or its
    /// repair's) can no longer come: its request was lost, or died with
    /// its node.
    fn cannot_come(&self, state: &State, client: u8, node: usize, repair: bool) -> bool {
        let c = &state.clients[client as usize];
        let seq = if repair { c.repair_seq } else { c.seq };
        !state.net.iter().any(|m| {
            m.client == client && m.node as usize == node && m.repair == repair && m.seq == seq
        })
    }

    /// Clients waiting only for answers that cannot come stop waiting (their
    /// timeouts): when exactly does not matter, as they only wait
    /// meanwhile, and what they send next can land as late as any message.
    fn give_up_on_lost_answers(&self, state: &mut State) {
        loop {
            let mut moved = false;
            for client in 0..self.clients as u8 {
                let c = &state.clients[client as usize];
                let stuck = |answers: &[Answer], repair: bool| {
                    let pending: Vec<usize> = (0..self.nodes)
                        .filter(|&n| answers[n] == Answer::Pending)
                        .collect();
                    !pending.is_empty()
                        && pending
                            .iter()
                            .all(|&n| self.cannot_come(state, client, n, repair))
                };
                let waiting = !matches!(c.phase, Phase::Idle | Phase::Holding { .. });
                if waiting && stuck(&c.answers, false) {
                    self.progress(state, client, true);
                    moved = true;
                } else if let Some(Repair::Reading { target }) = c.repair.clone()
                    && stuck(&c.repair_answers, true)
                {
                    self.repair_progress(state, client, target as usize, true);
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
    }

    // -----------------------------------------------------------------
    // Delivery

    fn deliver_to_node(&self, state: &mut State, msg: Msg) {
        let n = &mut state.nodes[msg.node as usize];
        if !n.up {
            return;
        }
        let reply = match msg.body {
            Body::Acquire { round } => {
                let granted = n.holds.iter().all(|(c, _)| *c == msg.client);
                if granted {
                    n.holds.push((msg.client, round));
                    n.holds.sort_unstable();
                    // Before the fix, a quorum's grant INCRed the counter
                    // where it existed; now the settlement alone writes it.
                    if self.design == Design::Lazy
                        && let Some(counter) = n.counter.as_mut()
                    {
                        *counter += 1;
                    }
                }
                let counter = match self.design {
                    Design::Eager => n.counter,
                    // Before the fix only a grant reported its counter.
                    Design::Lazy if granted => n.counter,
                    Design::Lazy => None,
                };
                Body::AcquireReply {
                    granted,
                    round,
                    counter,
                    epoch: n.epoch,
                }
            }
            Body::Raise { min, seed } => {
                let before = n.counter;
                n.counter = match before {
                    Some(c) => Some(c.max(min)),
                    None if seed => Some(min),
                    None => None,
                };
                Body::CounterReply {
                    before,
                    after: n.counter,
                    epoch: n.epoch,
                }
            }
            Body::AcquireReply { .. } | Body::CounterReply { .. } => unreachable!(),
        };
        // The reply reaches the client in the same step: what a client
        // decides depends on the order in which requests land, never on
        // how long a reply travels (an answer it gave up on is stale
        // whenever it comes).
        self.deliver_to_client(state, Msg { body: reply, ..msg });
    }

    fn deliver_to_client(&self, state: &mut State, msg: Msg) {
        let client = msg.client;
        let node = msg.node as usize;
        let (epoch, counter) = match msg.body {
            Body::AcquireReply { epoch, counter, .. } => (epoch, counter),
            // What was there tells of a restart.
            Body::CounterReply { epoch, before, .. } => (epoch, before),
            _ => unreachable!(),
        };
        self.observe(&mut state.clients[client as usize], node, epoch, counter);
        if msg.repair {
            let after = match msg.body {
                Body::CounterReply { after, .. } => after,
                _ => counter,
            };
            return self.repair_reply(state, client, &msg, epoch, after);
        }
        let c = &mut state.clients[client as usize];
        if let (Phase::Sealing { token }, Body::CounterReply { after, .. }) = (&c.phase, &msg.body)
        {
            // A seal that landed on a restarted node repaired it: the token
            // is above every counter of a proof read before it.
            if msg.seq == c.seq
                && after.is_some_and(|a| a >= *token)
                && self.design == Design::Eager
            {
                c.unrepaired &= !bit(node);
                c.last_seen[node] = *after;
            }
        }
        if msg.seq != c.seq || c.answers[node] != Answer::Pending {
            // Stale: an answer it stopped waiting for. A grant among them
            // is a hold of the round, adopted by its guard or released
            // with the round.
            return;
        }
        let answer = match msg.body {
            Body::AcquireReply { granted: true, .. } => Answer::Granted(counter),
            Body::AcquireReply { granted: false, .. } => Answer::Taken(counter),
            Body::CounterReply { before, after, .. } => Answer::Counter(before, after),
            _ => unreachable!(),
        };
        c.answers[node] = answer;
        self.progress(state, client, false);
    }

    // -----------------------------------------------------------------
    // Liveness

    /// From a quiet state: does a client that tries, with every message
    /// delivered and nothing failing, get a fenced grant?
    fn grant_possible(&self, state: &State) -> bool {
        let mut s = state.clone();
        // The background work first: notice restarts, repair.
        for _ in 0..200 {
            if !s.net.is_empty() {
                let msg = s.net.remove(0);
                self.deliver(&mut s, msg);
                continue;
            }
            let mut acted = false;
            if self.design == Design::Eager {
                for c in 0..self.clients {
                    for n in 0..self.nodes {
                        if s.nodes[n].up
                            && s.clients[c].known_epoch[n].is_some_and(|e| e != s.nodes[n].epoch)
                        {
                            self.notice(&mut s, c as u8, n as u8);
                            acted = true;
                        }
                    }
                    if let Some(Repair::Reading { target }) = s.clients[c].repair.clone() {
                        self.repair_progress(&mut s, c as u8, target as usize, true);
                        acted = true;
                    } else if s.clients[c].repair.is_none()
                        && let Some(target) = (0..self.nodes)
                            .find(|&t| self.repair_can_progress(&s, &s.clients[c], t))
                    {
                        self.start_repair(&mut s, c as u8, target);
                        acted = true;
                    }
                }
            }
            if !acted {
                break;
            }
        }
        // Then a round by client 0, answered by the nodes that are up.
        if s.clients[0].phase != Phase::Idle {
            return true;
        }
        self.start(&mut s, 0);
        for _ in 0..400 {
            match s.clients[0].phase {
                Phase::Holding { .. } => return true,
                Phase::Idle => return false,
                _ => {}
            }
            if s.net.is_empty() {
                self.progress(&mut s, 0, true);
            } else {
                let msg = s.net.remove(0);
                self.deliver(&mut s, msg);
            }
        }
        false
    }
}

impl Model for Fenced {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let start = self.fenced_once.then_some(1);
        let node = Node {
            up: true,
            epoch: 0,
            counter: start,
            holds: Vec::new(),
            crashed_holds: Vec::new(),
        };
        let client = Client {
            phase: Phase::Idle,
            seq: 0,
            round: 0,
            answers: vec![Answer::None; self.nodes],
            acquired: vec![Answer::None; self.nodes],
            known_epoch: vec![self.fenced_once.then_some(0); self.nodes],
            last_seen: vec![start; self.nodes],
            unrepaired: 0,
            repair: None,
            repair_seq: 0,
            repair_answers: vec![Answer::None; self.nodes],
        };
        vec![State {
            nodes: vec![node; self.nodes],
            clients: vec![client; self.clients],
            net: Vec::new(),
            crashes_left: self.crashes,
            drops_left: self.drops,
            grants_left: self.grants,
            rounds_left: self.rounds,
            repairs_left: self.repairs,
            last_token: start.unwrap_or(0),
            inverted: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for i in 0..state.net.len() {
            if i > 0 && state.net[i] == state.net[i - 1] {
                continue;
            }
            actions.push(Action::Deliver(i));
            if state.drops_left > 0 {
                actions.push(Action::Drop(i));
            }
        }
        for (i, c) in state.clients.iter().enumerate() {
            let i = i as u8;
            match c.phase {
                Phase::Idle if state.grants_left > 0 && state.rounds_left > 0 => {
                    actions.push(Action::Start(i));
                }
                Phase::Holding { .. } => {
                    actions.push(Action::Release(i));
                    actions.push(Action::Expire(i));
                }
                // The settlement returns once a quorum answered (the seal,
                // and the read before it): the other answers come late.
                // (A lease that ends during the settlement loses the round,
                // validity being checked again after it: as far as tokens
                // go, a round that is lost.)
                Phase::Reading { .. } | Phase::Sealing { .. } | Phase::Raising { .. } => {
                    let answered = c.answers.iter().filter(|a| **a != Answer::Pending).count();
                    if answered >= self.required() && answered < self.nodes {
                        actions.push(Action::ReturnAtQuorum(i));
                    }
                }
                _ => {}
            }
            if self.design == Design::Eager {
                for (n, node) in state.nodes.iter().enumerate() {
                    if node.up && c.known_epoch[n].is_some_and(|e| e != node.epoch) {
                        actions.push(Action::Notice(i, n as u8));
                    }
                }
                if c.repair.is_none() && state.repairs_left > 0 {
                    for target in (0..self.nodes).filter(|&t| c.unrepaired & bit(t) != 0) {
                        actions.push(Action::StartRepair(i, target as u8));
                    }
                }
            }
        }
        for (n, node) in state.nodes.iter().enumerate() {
            if node.up {
                let impaired_after =
                    self.impaired_count(state) + usize::from(!self.impaired(state, n));
                if state.crashes_left > 0
                    && self.background_quiet(state)
                    && (self.beyond || impaired_after <= self.tolerated())
                {
                    actions.push(Action::Crash(n as u8));
                }
            } else {
                let rounds_over = node.crashed_holds.iter().all(|(c, round)| {
                    let c = &state.clients[*c as usize];
                    c.round != *round || c.phase == Phase::Idle
                });
                if rounds_over {
                    actions.push(Action::Revive(n as u8));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Deliver(i) => {
                let msg = s.net.remove(i);
                self.deliver(&mut s, msg);
            }
            Action::Drop(i) => {
                s.net.remove(i);
                s.drops_left -= 1;
            }
            Action::ReturnAtQuorum(c) => self.progress(&mut s, c, true),
            Action::Start(c) => {
                s.rounds_left -= 1;
                self.start(&mut s, c);
            }
            Action::Release(c) => self.end_round(&mut s, c),
            Action::Expire(c) => {
                for node in &mut s.nodes {
                    node.holds.retain(|(holder, _)| *holder != c);
                }
                self.end_round(&mut s, c);
            }
            Action::Notice(c, n) => self.notice(&mut s, c, n),
            Action::StartRepair(c, target) => {
                s.repairs_left -= 1;
                self.start_repair(&mut s, c, target as usize);
            }
            Action::Crash(n) => {
                let node = &mut s.nodes[n as usize];
                node.crashed_holds = std::mem::take(&mut node.holds);
                node.up = false;
                node.counter = None;
                s.crashes_left -= 1;
                // Requests still queued on its connections die with it.
                s.net.retain(|m| m.node != n);
            }
            Action::Revive(n) => {
                let node = &mut s.nodes[n as usize];
                node.up = true;
                node.epoch += 1;
                node.crashed_holds.clear();
            }
        }
        self.give_up_on_lost_answers(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("tokens strictly increase", |_, s: &State| !s.inverted),
            Property::always("no two holders", |_, s: &State| {
                s.clients
                    .iter()
                    .filter(|c| matches!(c.phase, Phase::Holding { .. }))
                    .count()
                    <= 1
            }),
            Property::always(
                "a fenced grant stays possible while a quorum is intact",
                |m: &Fenced, s: &State| {
                    let quiet = s.net.is_empty()
                        && s.clients.iter().all(|c| c.phase == Phase::Idle)
                        && m.background_quiet(s);
                    // A name's first token needs every node to answer (a
                    // missing counter cannot be told from a lost one): the
                    // claim is for names fenced once.
                    !quiet
                        || s.last_token == 0
                        || m.impaired_count(s) > m.tolerated()
                        || m.grant_possible(s)
                },
            ),
            Property::sometimes("a token handed out after two restarts", |_, s: &State| {
                s.nodes.iter().map(|n| n.epoch).sum::<u8>() >= 2
                    && s.clients
                        .iter()
                        .any(|c| matches!(c.phase, Phase::Holding { .. }))
            }),
        ]
    }
}

/// The state with its clients and its nodes renamed: the least of all
/// renamings stands for them all (clients are alike, and so are nodes), so
/// the checker visits each class of states once.
fn canonical(state: &State) -> State {
    let nodes = state.nodes.len();
    let clients = state.clients.len();
    let node_orders = permutations(nodes);
    let client_orders = permutations(clients);
    let mut best: Option<State> = None;
    for nodes_to in &node_orders {
        for clients_to in &client_orders {
            let renamed = rename(state, nodes_to, clients_to);
            if best.as_ref().is_none_or(|b| renamed < *b) {
                best = Some(renamed);
            }
        }
    }
    best.expect("one renaming at least")
}

/// Every order of `0..n`, as `to[old] = new`.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for smaller in permutations(n - 1) {
        for at in 0..n {
            let mut order: Vec<usize> = smaller
                .iter()
                .map(|&i| if i >= at { i + 1 } else { i })
                .collect();
            order.push(at);
            all.push(order);
        }
    }
    all
}

/// `state` with node `i` renamed `nodes_to[i]` and client `c` renamed
/// `clients_to[c]`.
fn rename(state: &State, nodes_to: &[usize], clients_to: &[usize]) -> State {
    let client = |c: u8| clients_to[c as usize] as u8;
    let node = |n: u8| nodes_to[n as usize] as u8;
    let per_node = |v: &[Answer]| -> Vec<Answer> {
        let mut out = v.to_vec();
        for (i, a) in v.iter().enumerate() {
            out[nodes_to[i]] = *a;
        }
        out
    };
    let mask = |m: Mask| -> Mask {
        (0..nodes_to.len())
            .filter(|&i| m & bit(i) != 0)
            .fold(0, |acc, i| acc | bit(nodes_to[i]))
    };
    // Only equality with a client's current request batch, round and
    // repair matters: the current one is 0, any older one 1.
    let relabel = |current: u8, value: u8| u8::from(value != current);
    let holds = |h: &[(u8, u8)]| -> Vec<(u8, u8)> {
        let mut h: Vec<(u8, u8)> = h
            .iter()
            .map(|(c, r)| (client(*c), relabel(state.clients[*c as usize].round, *r)))
            .collect();
        h.sort_unstable();
        h
    };
    let mut nodes = state.nodes.clone();
    for (i, n) in state.nodes.iter().enumerate() {
        nodes[nodes_to[i]] = Node {
            holds: holds(&n.holds),
            crashed_holds: holds(&n.crashed_holds),
            ..n.clone()
        };
    }
    let mut clients = state.clients.clone();
    for (i, c) in state.clients.iter().enumerate() {
        let mut known_epoch = c.known_epoch.clone();
        let mut last_seen = c.last_seen.clone();
        for n in 0..nodes_to.len() {
            known_epoch[nodes_to[n]] = c.known_epoch[n];
            last_seen[nodes_to[n]] = c.last_seen[n];
        }
        clients[clients_to[i]] = Client {
            answers: per_node(&c.answers),
            acquired: per_node(&c.acquired),
            repair_answers: per_node(&c.repair_answers),
            known_epoch,
            last_seen,
            unrepaired: mask(c.unrepaired),
            repair: c.repair.clone().map(|r| match r {
                Repair::Reading { target } => Repair::Reading {
                    target: node(target),
                },
                Repair::Writing { target, epoch } => Repair::Writing {
                    target: node(target),
                    epoch,
                },
            }),
            seq: 0,
            round: 0,
            repair_seq: 0,
            ..c.clone()
        };
    }
    let mut net: Vec<Msg> = state
        .net
        .iter()
        .map(|m| {
            let c = &state.clients[m.client as usize];
            let seq = if m.repair {
                relabel(c.repair_seq, m.seq)
            } else {
                relabel(c.seq, m.seq)
            };
            let body = match m.body {
                Body::Acquire { round } => Body::Acquire {
                    round: relabel(c.round, round),
                },
                ref other => other.clone(),
            };
            Msg {
                client: client(m.client),
                node: node(m.node),
                seq,
                body,
                ..m.clone()
            }
        })
        .collect();
    net.sort_unstable();
    State {
        nodes,
        clients,
        net,
        ..state.clone()
    }
}

/// A path, one line per step: the action, then each node (`*` down,
/// epoch, counter, holds) and each client (phase, unrepaired nodes).
pub(super) fn describe(path: stateright::Path<State, Action>) -> String {
    let mut lines = Vec::new();
    for (state, action) in path.into_vec() {
        let nodes: Vec<String> = state
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "{}e{} c{} h{:?}",
                    if n.up { "" } else { "*" },
                    n.epoch,
                    n.counter.map_or("-".into(), |c| c.to_string()),
                    n.holds
                )
            })
            .collect();
        let clients: Vec<String> = state
            .clients
            .iter()
            .map(|c| format!("{:?} r{:03b}", c.phase, c.unrepaired))
            .collect();
        lines.push(format!(
            "[{}] [{}] net {} last {}",
            nodes.join(" | "),
            clients.join(" | "),
            state.net.len(),
            state.last_token
        ));
        if let Some(action) = action {
            lines.push(format!("  -> {action:?}"));
        }
    }
    lines.join("\n")
}

/// Checks every state within the bounds, depth first (a breadth-first
/// queue of states this size does not fit in memory), on two threads,
/// reporting progress on stderr. It stops once `finish` holds of the
/// properties found failing.
pub(super) fn check(model: Fenced, finish: stateright::HasDiscoveries) -> impl Checker<Fenced> {
    let mut stderr = std::io::stderr();
    let mut reporter = stateright::report::WriteReporter::new(&mut stderr);
    model
        .checker()
        .threads(2)
        .symmetry_fn(canonical)
        .finish_when(finish)
        .spawn_dfs()
        .join_and_report(&mut reporter)
}
