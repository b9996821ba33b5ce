//! The fenced quorum protocol, model-checked with stateright.
//!
//! Nodes, clients and the network are explicit: every request is a message
//! that can land in any order, or be lost (its reply reaches the client as
//! it lands: a client acts on what it hears, in the order requests landed;
//! an answer it stopped waiting for is stale whenever it comes); nodes crash
//! (losing their counters and lock keys) and come back under a new epoch
//! (their `run_id`), empty or with the counter and vouch of a snapshot
//! they took earlier (a restart from a stale dump); a client may give up
//! on answers still on their way at any moment (its timeouts), and a
//! holder's lease may end at any moment. The clients decide with the
//! crate's own rules ([`super::rules`]), counting as witnesses the
//! counters their node vouches for (sealed or repaired under its current
//! epoch: [`Trust::Vouched`]). Properties:
//!
//! - tokens of successive grants strictly increase;
//! - no token is handed out twice, also to the holders of two locks named
//!   onto one counter, whose settlements run at once;
//! - no two holders at once (of one lock);
//! - while a quorum of nodes is up, a fenced grant stays possible: from
//!   every quiet state, a client that tries, with nothing failing, gets
//!   one. That holds for a name no client fenced yet, for clients that
//!   never saw a node or forgot the name, and beyond the proof's condition
//!   (more than `nodes - required` nodes impaired: down, or restarted and
//!   not yet repaired), where the wall-clock floor, taken from a quorum's
//!   answers, settles the token.
//!
//! The floor is modelled by its assumption: the wall clock is past every
//! token settled so far (handed out, in a client's hands, or on a node).
//!
//! Faults follow the guarantee's condition: a node may crash only while the
//! clients have no background work that could progress (every restart
//! noticed, every repair done or blocked) and at most `nodes - required`
//! nodes stay impaired (unless the bounds go `beyond`); a crashed node
//! comes back only once the rounds that held the lock there are over
//! (Redlock's delayed restart). The same model runs the designs this crate
//! had before ([`Design::Lazy`], [`FloorAfter::EveryNode`] and
//! [`Trust::Book`]), and the checker finds their defects (see the tests in
//! [`super`]).

use std::hash::Hash;

use stateright::{Checker, Model, Property};

use super::rules::{self, CounterReport};

mod faults;
mod rounds;
mod traces;

use traces::canonical;
pub(super) use traces::describe;

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

/// Which counters a client counts as witnesses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Trust {
    /// Before the vouch: those of nodes the client's own book has not seen
    /// restart. A client new to a node (or that forgot the name) trusts a
    /// counter a stale dump brought back.
    Book,
    /// The shipped protocol: those the node vouches for, read with the
    /// counter: written by a seal or a repair under the node's current
    /// epoch (its `run_id`), a vouch lost or outdated by any restart,
    /// whoever sees it.
    Vouched,
}

/// When a settlement without a proof may take the wall-clock floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum FloorAfter {
    /// Before the availability fix: once every node answered (a name stalls
    /// for as long as one node is down).
    EveryNode,
    /// The shipped protocol: once a quorum answered and the client gave up
    /// waiting for the others (the round's grace).
    Quorum,
}

/// The bounds of one check.
#[derive(Debug, Clone)]
pub(super) struct Fenced {
    pub(super) design: Design,
    pub(super) trust: Trust,
    /// A repair's write applies (and vouches) whatever the target's epoch
    /// (the design before the guard), not only on the run it was meant for.
    pub(super) unguarded_repairs: bool,
    /// Two locks named onto one counter (Redisson's key naming gives
    /// `shared` and `{shared}` one): each client holds a lock of its own,
    /// so their settlements may run at once.
    pub(super) shared_counter: bool,
    /// A seal counts every node that holds its token, also one a rival's
    /// raise put there (the design before the fix), not only the nodes it
    /// raised to it itself.
    pub(super) unclaimed_seals: bool,
    pub(super) floor_after: FloorAfter,
    pub(super) nodes: usize,
    pub(super) clients: usize,
    /// Grants the clients may make between them.
    pub(super) grants: u8,
    /// Node crashes (each loses the node's data, back to its last
    /// snapshot if it took one).
    pub(super) crashes: u8,
    /// Snapshots the nodes may take between them: a node that crashes
    /// comes back with the counter of its last one (a restart from a
    /// stale dump), not empty.
    pub(super) snapshots: u8,
    /// Messages the network may lose.
    pub(super) drops: u8,
    /// Rounds the clients may start between them (each INCRs counters:
    /// the state space is finite only with a bound).
    pub(super) rounds: u8,
    /// Repairs the clients may start between them.
    pub(super) repairs: u8,
    /// Times the clients may forget the name between them (the client's
    /// book forgets a name idle for a while: what it knew of the nodes'
    /// counters and restarts, except a repair still pending).
    pub(super) forgets: u8,
    /// Start from a name fenced once (every counter at 1, seen by both
    /// clients) instead of a fresh one (no counter, clients that never saw
    /// a node).
    pub(super) fenced_once: bool,
    /// Nodes down from the start (the name is first fenced without them;
    /// they may come back).
    pub(super) down: usize,
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
    /// The epoch a seal or a repair last vouched for the counter under.
    vouched: Option<u8>,
    /// The counter and its vouch at its last snapshot, what a restart
    /// brings back.
    saved: Option<u64>,
    saved_vouched: Option<u8>,
    /// Restarted since a seal or a repair last vouched for its counter
    /// (`Trust::Vouched`: what impairs it).
    lost: bool,
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
    /// A raise (or a read): the counter before it and after it, and
    /// whether the node vouched for it (before).
    Counter(Option<u64>, Option<u64>, bool),
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
        /// The nodes the read raised to the token (it was the guess).
        read_claimed: Mask,
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
    /// Raise to `min`, creating a missing counter at `min` if `seed`, and
    /// vouching for it if `vouch` (a seal's settled token, a repair's
    /// value). A read is a raise to 0 that creates nothing.
    /// `on_epoch`: applied only while the node is on that epoch (a
    /// repair's write, for the run it read the witnesses for).
    Raise {
        min: u64,
        seed: bool,
        vouch: bool,
        on_epoch: Option<u8>,
    },
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
        vouched: bool,
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
    forgets_left: u8,
    snapshots_left: u8,
    /// The highest token handed out so far.
    last_token: u64,
    /// A token was handed out that was not above every earlier one.
    inverted: bool,
    /// Two locks on one counter: the tokens handed out so far, sorted.
    handed: Vec<u64>,
    /// A token was handed out again.
    repeated: bool,
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
    /// The idle client forgets the name, but for the repairs it still owes.
    Forget(u8),
    /// The node saves its data: a later crash brings it back to this.
    Snapshot(u8),
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
            vouched: (self.trust == Trust::Vouched && self.fenced_once).then_some(0),
            saved: None,
            saved_vouched: None,
            lost: false,
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
        let mut nodes = vec![node; self.nodes];
        for node in &mut nodes[..self.down] {
            node.up = false;
            node.counter = None;
        }
        vec![State {
            nodes,
            clients: vec![client; self.clients],
            net: Vec::new(),
            crashes_left: self.crashes,
            drops_left: self.drops,
            grants_left: self.grants,
            rounds_left: self.rounds,
            repairs_left: self.repairs,
            forgets_left: self.forgets,
            snapshots_left: self.snapshots,
            last_token: start.unwrap_or(0),
            inverted: false,
            handed: Vec::new(),
            repeated: false,
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
                let knows = (0..self.nodes).any(|n| {
                    c.unrepaired & bit(n) == 0
                        && (c.known_epoch[n].is_some() || c.last_seen[n].is_some())
                });
                if state.forgets_left > 0 && c.phase == Phase::Idle && c.repair.is_none() && knows {
                    actions.push(Action::Forget(i));
                }
            }
        }
        for (n, node) in state.nodes.iter().enumerate() {
            if node.up
                && state.snapshots_left > 0
                && (node.saved, node.saved_vouched) != (node.counter, node.vouched)
            {
                actions.push(Action::Snapshot(n as u8));
            }
            if node.up {
                let impaired_after =
                    self.impaired_count(state) + usize::from(!self.impaired(state, n));
                // A repair's write to it on its way: it may restart first.
                let repair_writing = state.clients.iter().any(|c| {
                    matches!(c.repair, Some(Repair::Writing { target, .. }) if target as usize == n)
                });
                if state.crashes_left > 0
                    && (self.background_quiet(state) || repair_writing)
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
            Action::Forget(c) => {
                s.forgets_left -= 1;
                let c = &mut s.clients[c as usize];
                for n in (0..self.nodes).filter(|&n| c.unrepaired & bit(n) == 0) {
                    c.known_epoch[n] = None;
                    c.last_seen[n] = None;
                }
            }
            Action::Crash(n) => {
                let node = &mut s.nodes[n as usize];
                node.crashed_holds = std::mem::take(&mut node.holds);
                node.up = false;
                node.counter = None;
                node.vouched = None;
                s.crashes_left -= 1;
                // Requests still queued on its connections die with it,
                // but for a repair's write: one whose witnesses were read
                // before the crash may still be sent after it, on a new
                // connection.
                s.net.retain(|m| {
                    m.node != n || (m.repair && matches!(m.body, Body::Raise { vouch: true, .. }))
                });
            }
            Action::Snapshot(n) => {
                let node = &mut s.nodes[n as usize];
                node.saved = node.counter;
                node.saved_vouched = node.vouched;
                s.snapshots_left -= 1;
            }
            Action::Revive(n) => {
                let node = &mut s.nodes[n as usize];
                node.up = true;
                node.counter = node.saved;
                node.vouched = node.saved_vouched;
                node.epoch += 1;
                node.lost = self.trust == Trust::Vouched;
                node.crashed_holds.clear();
            }
        }
        self.give_up_on_lost_answers(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("tokens strictly increase", |_, s: &State| !s.inverted),
            Property::always("no token handed out twice", |_, s: &State| !s.repeated),
            Property::always("no two holders", |m: &Fenced, s: &State| {
                m.shared_counter
                    || s.clients
                        .iter()
                        .filter(|c| matches!(c.phase, Phase::Holding { .. }))
                        .count()
                        <= 1
            }),
            Property::always(
                "a fenced grant stays possible while a quorum is up",
                |m: &Fenced, s: &State| {
                    let quiet = s.net.is_empty()
                        && s.clients.iter().all(|c| c.phase == Phase::Idle)
                        && m.background_quiet(s);
                    let up = s.nodes.iter().filter(|n| n.up).count();
                    // The lazy design was only ever claimed live inside
                    // the condition, for names fenced once.
                    let claimed = match m.design {
                        Design::Lazy => s.last_token > 0 && m.impaired_count(s) <= m.tolerated(),
                        Design::Eager => true,
                    };
                    !quiet || up < m.required() || !claimed || m.grant_possible(s)
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

/// Checks every state within the bounds, depth first (a breadth-first
/// queue of states this size does not fit in memory), on two threads,
/// reporting progress on stderr. It stops once `finish` holds of the
/// properties found failing, or (with `cap`) once it visited that many
/// states.
pub(super) fn check(
    model: Fenced,
    finish: stateright::HasDiscoveries,
    cap: Option<usize>,
) -> impl Checker<Fenced> {
    let mut stderr = std::io::stderr();
    let mut reporter = stateright::report::WriteReporter::new(&mut stderr);
    let checker = model
        .checker()
        .threads(2)
        .symmetry_fn(canonical)
        .finish_when(finish);
    let checker = match cap {
        Some(states) => checker.target_state_count(states),
        None => checker,
    };
    checker.spawn_dfs().join_and_report(&mut reporter)
}
