//! Faults and background work: crashes, revivals, restarts noticed, repairs.

use super::*;

impl Fenced {
    // -----------------------------------------------------------------
    // Faults and background work

    /// Whether `client` counts the counter of `node` as a witness, when
    /// the node says whether it vouched for it.
    pub(super) fn trusts(&self, client: &Client, node: usize, vouched: bool) -> bool {
        match self.trust {
            Trust::Book => client.unrepaired & bit(node) == 0,
            // The crate also leaves out nodes the client saw restart and
            // has not repaired: fewer witnesses, and the same token
            // whenever it proves one, so what holds here holds there.
            Trust::Vouched => vouched,
        }
    }

    /// Down, or restarted and not yet repaired: noticed and not repaired
    /// by a client (`Trust::Book`), or not vouched for since
    /// (`Trust::Vouched`).
    pub(super) fn impaired(&self, state: &State, node: usize) -> bool {
        let n = &state.nodes[node];
        if self.trust == Trust::Vouched && self.design == Design::Eager {
            return !n.up || n.lost;
        }
        !n.up
            || (self.design == Design::Eager
                && state.clients.iter().any(|c| {
                    c.unrepaired & bit(node) != 0
                        || c.known_epoch[node].is_some_and(|e| e != n.epoch)
                }))
    }

    pub(super) fn impaired_count(&self, state: &State) -> usize {
        (0..self.nodes).filter(|&n| self.impaired(state, n)).count()
    }

    /// No background work that could progress: every restart of a node
    /// that is up noticed, and no repair under way or able to start.
    pub(super) fn background_quiet(&self, state: &State) -> bool {
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
    pub(super) fn repair_can_progress(
        &self,
        state: &State,
        client: &Client,
        target: usize,
    ) -> bool {
        if client.unrepaired & bit(target) == 0 {
            return false;
        }
        let others_up = (0..self.nodes)
            .filter(|&n| n != target && state.nodes[n].up)
            .count();
        let trusted_up = (0..self.nodes)
            .filter(|&n| {
                let node = &state.nodes[n];
                n != target && node.up && self.trusts(client, n, node.vouched == Some(node.epoch))
            })
            .count();
        let none_has_one = (0..self.nodes).all(|n| n == target || state.nodes[n].counter.is_none());
        state.nodes[target].up
            && (trusted_up >= rules::witnesses_needed(self.nodes, self.required())
                || (others_up + 1 == self.nodes && none_has_one))
    }

    /// What a reply from `node` says of a restart (the Eager design
    /// watches: a new epoch, or a counter missing or lower than seen).
    pub(super) fn observe(
        &self,
        client: &mut Client,
        node: usize,
        epoch: u8,
        counter: Option<u64>,
    ) {
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

    pub(super) fn notice(&self, state: &mut State, client: u8, node: u8) {
        let epoch = state.nodes[node as usize].epoch;
        let c = &mut state.clients[client as usize];
        if c.known_epoch[node as usize].is_some_and(|e| e != epoch) {
            c.unrepaired |= bit(node as usize);
        }
        c.known_epoch[node as usize] = Some(epoch);
    }

    pub(super) fn start_repair(&self, state: &mut State, client: u8, target: usize) {
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
                        vouch: false,
                        on_epoch: None,
                    },
                },
            );
        }
    }

    pub(super) fn repair_reply(
        &self,
        state: &mut State,
        client: u8,
        msg: &Msg,
        epoch: u8,
        counter: Option<u64>,
        vouched: bool,
    ) {
        let node = msg.node as usize;
        let c = &mut state.clients[client as usize];
        if msg.seq != c.repair_seq {
            return;
        }
        match c.repair.clone() {
            Some(Repair::Reading { target }) => {
                c.repair_answers[node] = Answer::Counter(counter, counter, vouched);
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

    pub(super) fn repair_progress(
        &self,
        state: &mut State,
        client: u8,
        target: usize,
        gave_up: bool,
    ) {
        let c = &state.clients[client as usize];
        let reports: Vec<CounterReport> = (0..self.nodes)
            .filter(|&n| n != target)
            .filter_map(|n| match c.repair_answers[n] {
                Answer::Counter(_, value, vouched) => Some(CounterReport {
                    value,
                    intact: self.trusts(c, n, vouched),
                }),
                _ => None,
            })
            .collect();
        let c = &mut state.clients[client as usize];
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
                            vouch: true,
                            // The repair read the witnesses for this run
                            // of the target: a restart since voids it.
                            on_epoch: (!self.unguarded_repairs).then_some(epoch),
                        },
                    },
                );
            }
            None if gave_up || !pending => c.repair = None,
            None => {}
        }
    }
}
