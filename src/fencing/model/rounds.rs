//! A client's rounds: acquire, read, seal, check; message delivery; and
//! the liveness question (can a quiet state still grant?).

use super::*;

impl Fenced {
    // -----------------------------------------------------------------
    // Rounds

    pub(super) fn next_phase(&self, state: &mut State, client: u8, phase: Phase) {
        let c = &mut state.clients[client as usize];
        c.phase = phase;
        c.seq = c.seq.wrapping_add(1);
        c.answers = vec![Answer::Pending; self.nodes];
    }

    pub(super) fn broadcast(&self, state: &mut State, client: u8, body: Body) {
        for node in 0..self.nodes {
            self.to_node(state, client, node, body.clone());
        }
    }

    pub(super) fn start(&self, state: &mut State, client: u8) {
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
    pub(super) fn end_round(&self, state: &mut State, client: u8) {
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

    /// The floor's assumption: the wall clock is past every token settled
    /// so far, whether handed out, still in a client's hands or only on a
    /// node (derived from the state rather than kept in it: a field would
    /// multiply the states).
    fn wall_clock_floor(&self, state: &State) -> u64 {
        let in_hands = state.clients.iter().filter_map(|c| match c.phase {
            Phase::Sealing { token, .. } | Phase::Checking { token } | Phase::Holding { token } => {
                Some(token)
            }
            _ => None,
        });
        let on_nodes = state.nodes.iter().filter_map(|n| n.counter);
        in_hands.chain(on_nodes).fold(state.last_token, u64::max) + 1
    }

    pub(super) fn hand_out(&self, state: &mut State, client: u8, token: u64) {
        if self.shared_counter {
            // Two locks: their tokens need not rise in hand-out order
            // (settled at once), but never repeat.
            match state.handed.binary_search(&token) {
                Ok(_) => state.repeated = true,
                Err(at) => state.handed.insert(at, token),
            }
        } else if token <= state.last_token {
            state.inverted = true;
        }
        state.last_token = state.last_token.max(token);
        state.clients[client as usize].phase = Phase::Holding { token };
        state.grants_left = state.grants_left.saturating_sub(1);
    }

    /// What the read found: each counter before the read raised it.
    pub(super) fn reports(&self, client: &Client, answers: &[Answer]) -> Vec<CounterReport> {
        answers
            .iter()
            .enumerate()
            .filter_map(|(node, answer)| {
                let Answer::Counter(before, _, vouched) = *answer else {
                    return None;
                };
                Some(CounterReport {
                    value: before,
                    intact: self.trusts(client, node, vouched),
                })
            })
            .collect()
    }

    /// Moves the round on once every answer came, or the client gave up on
    /// the rest.
    pub(super) fn progress(&self, state: &mut State, client: u8, gave_up: bool) {
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
                                vouch: false,
                                on_epoch: None,
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
                                vouch: false,
                                on_epoch: None,
                            },
                        );
                    }
                }
            }
            Phase::Reading { guess } => {
                let reports = self.reports(&state.clients[client as usize], &answers);
                let floor = self.wall_clock_floor(state);
                let waited_out = gave_up && self.floor_after == FloorAfter::Quorum;
                let Some(settled) =
                    rules::settle_token(&reports, nodes, required, guess, floor, waited_out)
                else {
                    return self.end_round(state, client);
                };
                let token = settled.token();
                let c = &state.clients[client as usize];
                // A node known to have restarted is sealed (and so repaired),
                // and so is a token the read did not leave on a quorum (a
                // missing counter stays missing: a new name's).
                let sealed = answers.iter().filter(|a| self.seals(a, token)).count();
                let untrusted = answers
                    .iter()
                    .any(|a| matches!(a, Answer::Counter(_, _, false)))
                    && self.trust == Trust::Vouched;
                if token == guess && c.unrepaired == 0 && !untrusted && sealed >= required {
                    // Nothing was at or above the guess: the read sealed it.
                    self.check_seal(state, client, token, &answers, 0);
                } else {
                    let read_claimed = (0..nodes)
                        .filter(|&n| self.seals(&answers[n], token))
                        .fold(0, |mask, n| mask | bit(n));
                    self.next_phase(
                        state,
                        client,
                        Phase::Sealing {
                            token,
                            read_claimed,
                        },
                    );
                    self.broadcast(
                        state,
                        client,
                        Body::Raise {
                            min: token,
                            seed: true,
                            vouch: true,
                            on_epoch: None,
                        },
                    );
                }
            }
            Phase::Sealing {
                token,
                read_claimed,
            } => self.check_seal(state, client, token, &answers, read_claimed),
            Phase::Checking { token } => {
                let held = answers
                    .iter()
                    .filter(|a| matches!(a, Answer::Counter(_, Some(v), _) if *v >= token))
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

    /// Whether a raise's answer seals `token` for this client: the node
    /// holds it, and this raise put it there (`quorum::fencing`'s claim).
    fn seals(&self, answer: &Answer, token: u64) -> bool {
        match *answer {
            Answer::Counter(before, Some(after), _) => {
                after >= token && (self.unclaimed_seals || before.is_none_or(|b| b < token))
            }
            _ => false,
        }
    }

    /// A seal's answers: once a quorum holds the token, check on those
    /// nodes, after every write of the seal landed, that it is still there
    /// (a node that restarted since would not count).
    /// `read_claimed`: nodes the read already raised to the token.
    pub(super) fn check_seal(
        &self,
        state: &mut State,
        client: u8,
        token: u64,
        answers: &[Answer],
        read_claimed: Mask,
    ) {
        let acked: Vec<bool> = (0..self.nodes)
            .map(|n| self.seals(&answers[n], token) || read_claimed & bit(n) != 0)
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
                        vouch: false,
                        on_epoch: None,
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
    pub(super) fn lazy_raise(
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
                Answer::Counter(before, after, _) => {
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
                        vouch: false,
                        on_epoch: None,
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
    pub(super) fn cannot_come(&self, state: &State, client: u8, node: usize, repair: bool) -> bool {
        let c = &state.clients[client as usize];
        let seq = if repair { c.repair_seq } else { c.seq };
        !state.net.iter().any(|m| {
            m.client == client && m.node as usize == node && m.repair == repair && m.seq == seq
        })
    }

    /// Clients waiting only for answers that cannot come stop waiting (their
    /// timeouts): when exactly does not matter, as they only wait
    /// meanwhile, and what they send next can land as late as any message.
    pub(super) fn give_up_on_lost_answers(&self, state: &mut State) {
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

    pub(super) fn deliver_to_node(&self, state: &mut State, msg: Msg) {
        let n = &mut state.nodes[msg.node as usize];
        if !n.up {
            return;
        }
        let reply = match msg.body {
            Body::Acquire { round } => {
                // Two locks on one counter: each client holds its own.
                let granted = self.shared_counter || n.holds.iter().all(|(c, _)| *c == msg.client);
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
            Body::Raise {
                min,
                seed,
                vouch,
                on_epoch,
            } => {
                let before = n.counter;
                if on_epoch.is_some_and(|epoch| epoch != n.epoch) {
                    // Meant for a run of the server that ended: not
                    // applied.
                    let reply = Body::CounterReply {
                        before,
                        after: before,
                        epoch: n.epoch,
                        vouched: false,
                    };
                    return self.deliver_to_client(state, Msg { body: reply, ..msg });
                }
                let vouched = n.vouched == Some(n.epoch);
                n.counter = match before {
                    Some(c) => Some(c.max(min)),
                    None if seed => Some(min),
                    None => None,
                };
                if vouch && self.trust == Trust::Vouched && n.counter.is_some() {
                    n.vouched = Some(n.epoch);
                    n.lost = false;
                }
                Body::CounterReply {
                    before,
                    after: n.counter,
                    epoch: n.epoch,
                    vouched,
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

    pub(super) fn deliver_to_client(&self, state: &mut State, msg: Msg) {
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
            let vouched = matches!(msg.body, Body::CounterReply { vouched: true, .. });
            return self.repair_reply(state, client, &msg, epoch, after, vouched);
        }
        let c = &mut state.clients[client as usize];
        if let (Phase::Sealing { token, .. }, Body::CounterReply { after, .. }) =
            (&c.phase, &msg.body)
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
            Body::CounterReply {
                before,
                after,
                vouched,
                ..
            } => Answer::Counter(before, after, vouched),
            _ => unreachable!(),
        };
        c.answers[node] = answer;
        self.progress(state, client, false);
    }

    // -----------------------------------------------------------------
    // Liveness

    /// From a quiet state: does a client that tries, with every message
    /// delivered and nothing failing, get a fenced grant?
    pub(super) fn grant_possible(&self, state: &State) -> bool {
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
