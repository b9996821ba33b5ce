//! The arithmetic of multi-node fencing, pure: which token a won round may
//! hand out, which value a repair writes, and when a node counts as
//! restarted. The settlement (`quorum::fencing`), the repairs
//! ([`super::repair`]) and the model checker ([`super::model`]) all decide
//! with these functions, so the checked protocol is the shipped one.
//!
//! # Why a token is higher than every earlier one
//!
//! A token is handed out only once a quorum of nodes holds it (the seal),
//! checked after every write of the seal had landed. Any later holder reads
//! the counters of at least [`witnesses_needed`] *witnesses* (counters
//! present and vouched for by their node: sealed or repaired since the
//! server last started); a quorum and that many nodes always share one.
//! So while that shared node kept its counter, or lost it and was repaired
//! since (a repair writes the highest of as many witnesses, which share a
//! node with every seal), the later token is higher: a node that lost its
//! counter lost its vouch with it, so it witnesses nothing until then. That holds as long as
//! at most `nodes - required` nodes lose their counters between two
//! completed repairs: the nodes of a seal cannot all lose theirs.

/// One node's fencing counter, as one request of a round or a repair saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CounterReport {
    /// The counter the request found; `None` when missing.
    pub(crate) value: Option<u64>,
    /// The node vouched for its counter: a seal or a repair wrote it
    /// since the server last started.
    pub(crate) intact: bool,
}

impl CounterReport {
    fn is_witness(&self) -> bool {
        self.intact && self.value.is_some()
    }
}

/// How many trusted counters a settlement or a repair must read: enough to
/// share a node with every quorum (`nodes - required + 1`: N/2+1 for a
/// RedLock of an odd number of nodes, one for a MultiLock, whose every
/// grant raises every node).
pub(crate) fn witnesses_needed(nodes: usize, required: usize) -> usize {
    nodes - required + 1
}

/// A settled fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Proven above every earlier token by enough witnesses.
    Proven(u64),
    /// Too few nodes had a trusted counter (the name is new, or its
    /// counters were lost beyond what the protocol tolerates), and a quorum
    /// answered, the others given their grace. The token is above every
    /// counter read and at least the wall-clock floor, so it does not fall
    /// back to 1 (see [`settle_token`] for what it assumes).
    Floor(u64),
}

impl Settled {
    /// The token.
    pub(crate) fn token(self) -> u64 {
        match self {
            Settled::Proven(token) | Settled::Floor(token) => token,
        }
    }
}

/// The token a won round may hand out, from the counters its read found
/// (at most one report per node), or `None` when nothing can be settled
/// yet: too few witnesses, and either fewer than a quorum answered, or
/// not every node answered and the read still waits for the others
/// (`waited_out` is false).
///
/// The token is above every counter read, so it never equals a token
/// someone else handed out (a value can be a rival's seal as well as a
/// guess of ours), and at least `minimum` (what the read raised the
/// counters to: then the read itself sealed it). `floor`: the wall-clock
/// floor (see [`crate::timing::token_floor`]), used only when there is no
/// proof.
///
/// Without a proof, a quorum of answers suffices once the others had their
/// grace (`waited_out`): every earlier token was sealed on a quorum, which
/// shares a node with the answers, so the token is above it unless that
/// node lost its counter; then the floor is, as long as clocks are closer
/// than the time since that token and fewer than one grant a microsecond
/// was made. Waiting for every node would protect only against a
/// clock-skewed counter on the nodes that did not answer, at the price of
/// a name that stalls for as long as one node is down.
pub(crate) fn settle_token(
    reports: &[CounterReport],
    nodes: usize,
    required: usize,
    minimum: u64,
    floor: u64,
    waited_out: bool,
) -> Option<Settled> {
    let above = reports
        .iter()
        .filter_map(|r| r.value.map(|v| v + 1))
        .max()
        .unwrap_or(0)
        .max(minimum);
    let witnesses = reports.iter().filter(|r| r.is_witness()).count();
    if witnesses >= witnesses_needed(nodes, required) {
        Some(Settled::Proven(above.max(1)))
    } else if reports.len() >= nodes || (waited_out && reports.len() >= required) {
        Some(Settled::Floor(above.max(floor).max(1)))
    } else {
        None
    }
}

/// What a repair writes on a node that lost its counter, from the
/// counters of the other nodes: the highest of them, once enough
/// witnesses answered. `Some(None)`: every other node answered and none
/// has a counter, so there is nothing to restore. `None`: too little is
/// known (yet, or for good: then a seal repairs the node).
pub(crate) fn repair_value(
    others: &[CounterReport],
    nodes: usize,
    required: usize,
) -> Option<Option<u64>> {
    let witnesses = others.iter().filter(|r| r.is_witness()).count();
    let highest = others.iter().filter_map(|r| r.value).max();
    if witnesses >= witnesses_needed(nodes, required) {
        Some(highest)
    } else if others.len() + 1 >= nodes && highest.is_none() {
        Some(None)
    } else {
        // Too few witnesses: the highest counter present may be below an
        // earlier token (its seal's nodes all lost theirs), and writing it
        // would make this node a witness of a value that proves nothing.
        // The node waits for more witnesses, or for a seal (the floor's,
        // if it comes to that) to repair it.
        None
    }
}

/// Whether a node's counter says the node lost its data since this client
/// last saw it: missing where a value was seen, or lower than it. (A
/// changed `run_id` says so too; the node tells that on connecting.)
pub(crate) fn counter_says_restarted(last_seen: Option<u64>, now: Option<u64>) -> bool {
    match (last_seen, now) {
        (Some(_), None) => true,
        (Some(seen), Some(now)) => now < seen,
        (None, _) => false,
    }
}

/// Whether a node's counter should be repaired: it says the node restarted
/// ([`counter_says_restarted`]), or it is missing where the client saw the
/// name's counter on another node (a node a restart emptied before this
/// client ever saw its counter, or one no seal reached: either way, a
/// repair makes it a witness, and writing the highest of enough witnesses
/// is never wrong).
pub(crate) fn counter_needs_repair(
    last_seen: Option<u64>,
    now: Option<u64>,
    seen_elsewhere: bool,
) -> bool {
    counter_says_restarted(last_seen, now) || (now.is_none() && seen_elsewhere)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(value: Option<u64>, intact: bool) -> CounterReport {
        CounterReport { value, intact }
    }

    #[test]
    fn witnesses_share_a_node_with_every_quorum() {
        for nodes in 1..=7usize {
            for required in [nodes, nodes / 2 + 1] {
                let w = witnesses_needed(nodes, required);
                assert!(w + required > nodes, "{nodes} {required}");
            }
        }
        assert_eq!(witnesses_needed(5, 3), 3);
        assert_eq!(witnesses_needed(4, 3), 2);
        assert_eq!(witnesses_needed(3, 3), 1);
    }

    #[test]
    fn a_token_exceeds_every_counter_reported() {
        let reports = [
            report(Some(7), true),
            report(Some(8), true),
            report(Some(6), true),
            report(Some(100), false),
        ];
        assert_eq!(
            settle_token(&reports, 5, 3, 8, 0, false),
            Some(Settled::Proven(101))
        );
        // The usual case: the read raised every counter to the guess, and
        // nothing was above it.
        let calm = [
            report(Some(7), true),
            report(Some(7), true),
            report(Some(6), true),
        ];
        assert_eq!(
            settle_token(&calm, 5, 3, 8, 0, false),
            Some(Settled::Proven(8))
        );
        // A value equal to the guess is a rival's token, maybe: above it.
        let rival = [
            report(Some(8), true),
            report(Some(7), true),
            report(Some(6), true),
        ];
        assert_eq!(
            settle_token(&rival, 5, 3, 8, 0, false),
            Some(Settled::Proven(9))
        );
    }

    #[test]
    fn restarted_or_missing_counters_prove_nothing() {
        let two_restarted = [
            report(Some(9), true),
            report(Some(9), true),
            report(Some(40), false),
        ];
        assert_eq!(settle_token(&two_restarted, 5, 3, 1, 0, false), None);
        let missing = [
            report(None, true),
            report(Some(9), true),
            report(Some(9), true),
            report(None, true),
        ];
        assert_eq!(settle_token(&missing, 5, 3, 1, 0, false), None);
    }

    #[test]
    fn with_every_node_answering_the_floor_takes_over() {
        let fresh = [report(None, true); 3];
        assert_eq!(
            settle_token(&fresh, 3, 2, 1, 0, false),
            Some(Settled::Floor(1))
        );
        assert_eq!(
            settle_token(&fresh, 3, 2, 1, 5_000, false),
            Some(Settled::Floor(5_000))
        );
        let some = [
            report(None, true),
            report(Some(7_000), true),
            report(None, true),
        ];
        assert_eq!(
            settle_token(&some, 3, 2, 1, 5_000, false),
            Some(Settled::Floor(7_001))
        );
        assert_eq!(settle_token(&fresh[..2], 3, 2, 1, 0, false), None);
    }

    #[test]
    fn without_a_proof_a_quorum_suffices_once_the_others_had_their_grace() {
        let fresh = [report(None, true); 3];
        // 3 of 5 answered, none has a counter: a new name, or one lost.
        assert_eq!(settle_token(&fresh, 5, 3, 1, 5_000, false), None);
        assert_eq!(
            settle_token(&fresh, 5, 3, 1, 5_000, true),
            Some(Settled::Floor(5_000))
        );
        // Fewer than a quorum never settles.
        assert_eq!(settle_token(&fresh[..2], 5, 3, 1, 5_000, true), None);
        // One counter left, above the floor: the token is above it.
        let one_left = [
            report(Some(9_000), true),
            report(None, false),
            report(Some(20), false),
        ];
        assert_eq!(
            settle_token(&one_left, 5, 3, 1, 5_000, true),
            Some(Settled::Floor(9_001))
        );
        // A proof needs no waiting.
        let proven = [report(Some(9), true); 3];
        assert_eq!(
            settle_token(&proven, 5, 3, 1, 5_000, false),
            Some(Settled::Proven(10))
        );
    }

    #[test]
    fn a_repair_needs_witnesses() {
        let others = [report(Some(9), true), report(Some(12), false)];
        assert_eq!(repair_value(&others, 5, 3), None);
        let enough = [
            report(Some(9), true),
            report(Some(12), false),
            report(Some(11), true),
            report(Some(3), true),
        ];
        assert_eq!(repair_value(&enough, 5, 3), Some(Some(12)));
        // Every other node answered, too few witnesses: the highest
        // present (11) may be below an earlier token. No repair.
        let lost = [
            report(Some(9), true),
            report(Some(12), false),
            report(Some(11), true),
            report(None, true),
        ];
        assert_eq!(repair_value(&lost, 5, 3), None);
        let empty = [report(None, true); 2];
        assert_eq!(repair_value(&empty, 3, 2), Some(None));
    }

    #[test]
    fn a_counter_that_went_back_says_restarted() {
        assert!(counter_says_restarted(Some(5), None));
        assert!(counter_says_restarted(Some(5), Some(4)));
        assert!(!counter_says_restarted(Some(5), Some(5)));
        assert!(!counter_says_restarted(None, None));
        assert!(!counter_says_restarted(None, Some(1)));
    }

    #[test]
    fn a_missing_counter_is_filled_in_once_the_name_was_seen_elsewhere() {
        assert!(counter_needs_repair(None, None, true));
        assert!(!counter_needs_repair(None, None, false));
        assert!(!counter_needs_repair(None, Some(3), true));
        assert!(counter_needs_repair(Some(5), None, false));
    }

    /// Every sequence of a seal and a later settlement on 5 nodes: the
    /// seal's quorum holds 50, other nodes at most 40, any minority lost
    /// its counter (and a client may know it); whatever answers, a token
    /// settled is above 50: proven, or from every node's counters, or from
    /// a quorum's and the floor.
    #[test]
    fn tokens_increase_while_a_minority_loses_its_counters() {
        let (n, q) = (5, 3);
        for seal in 0u32..(1 << n) {
            if (seal.count_ones() as usize) < q {
                continue;
            }
            for lost in 0u32..(1 << n) {
                if lost.count_ones() as usize > n - q {
                    continue;
                }
                // Waited out, a quorum of answers settles from the floor,
                // which is past every token handed out (its assumption).
                for (known, waited_out, floor) in [
                    (0, false, 0),
                    (lost, false, 0),
                    (0, true, 51),
                    (lost, true, 51),
                ] {
                    for answered in 0u32..(1 << n) {
                        let reports: Vec<CounterReport> = (0..n)
                            .filter(|i| answered & (1 << i) != 0)
                            .map(|i| {
                                let value = if lost & (1 << i) != 0 {
                                    None
                                } else if seal & (1 << i) != 0 {
                                    Some(50)
                                } else {
                                    Some(40)
                                };
                                report(value, known & (1 << i) == 0)
                            })
                            .collect();
                        if let Some(settled) = settle_token(&reports, n, q, 1, floor, waited_out) {
                            assert!(
                                settled.token() > 50,
                                "seal {seal:05b}, lost {lost:05b}, answered {answered:05b}: {settled:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
