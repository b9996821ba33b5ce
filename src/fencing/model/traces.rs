//! The states up to renaming (symmetry), and traces a person can read.

use super::*;

/// The state with its clients and its nodes renamed: the least of all
/// renamings stands for them all (clients are alike, and so are nodes), so
/// the checker visits each class of states once.
pub(super) fn canonical(state: &State) -> State {
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
/// epoch, counter, the epoch it was vouched for under, its snapshot's
/// counter if it took one, holds) and each client (phase, unrepaired nodes).
pub(in crate::fencing) fn describe(path: stateright::Path<State, Action>) -> String {
    let mut lines = Vec::new();
    for (state, action) in path.into_vec() {
        let nodes: Vec<String> = state
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "{}e{} c{}{}{} h{:?}",
                    if n.up { "" } else { "*" },
                    n.epoch,
                    n.counter.map_or("-".into(), |c| c.to_string()),
                    n.vouched.map_or(String::new(), |v| format!(" v{v}")),
                    n.saved.map_or(String::new(), |s| format!(" s{s}")),
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
