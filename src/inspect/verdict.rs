//! The verdict over a lock's nodes: held by whom, free, split, or not
//! known while too few nodes answered. Pure counting, one place.

use super::NodeInspection;

/// Who holds a lock, judged from its nodes' answers against its quorum.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// No node holds it, and the nodes that did not answer are too few to
    /// make up a quorum: no one can hold it.
    Free,
    /// Held on a quorum: by one owner, or (a read lock) by every reader
    /// listed. Holds on fewer nodes (an owner's leftovers) are not listed.
    Held(Vec<Claim>),
    /// Holds exist, but no owner has a quorum, and none could have one
    /// counting the nodes that did not answer: a lock being acquired or
    /// released, or the leftovers of a failed round that a TTL or a
    /// rollback will clear.
    Split(Vec<Claim>),
    /// Too few nodes told their state to judge: an owner, or the lock's
    /// absence, might have a quorum counting them. Names the nodes that
    /// gave no state: no answer within the timeout, or an error in its
    /// place (for example `WRONGTYPE`: the name holds something that is no
    /// lock there; each node's error is in its
    /// [`NodeInspection::state`](super::NodeInspection::state)).
    Unknown {
        /// The addresses of the nodes that gave no state.
        unanswered: Vec<String>,
    },
}

/// One owner's holds: the field and the nodes it holds on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim {
    /// The holder's hash field (`<client-uuid>:<owner>`, `:write` after a
    /// writer's).
    pub field: String,
    /// The addresses of the nodes the field holds on.
    pub nodes: Vec<String>,
}

impl Verdict {
    /// The verdict over `nodes` for a lock held on `quorum` of them.
    pub(crate) fn judge(quorum: usize, nodes: &[NodeInspection]) -> Verdict {
        let mut claims: Vec<Claim> = Vec::new();
        let mut unanswered = Vec::new();
        for node in nodes {
            let state = match &node.state {
                Ok(state) => state,
                Err(_) => {
                    unanswered.push(node.node.clone());
                    continue;
                }
            };
            for holder in &state.holders {
                match claims.iter_mut().find(|claim| claim.field == holder.field) {
                    Some(claim) => claim.nodes.push(node.node.clone()),
                    None => claims.push(Claim {
                        field: holder.field.clone(),
                        nodes: vec![node.node.clone()],
                    }),
                }
            }
        }
        let held: Vec<Claim> = claims
            .iter()
            .filter(|claim| claim.nodes.len() >= quorum)
            .cloned()
            .collect();
        if !held.is_empty() {
            return Verdict::Held(held);
        }
        let most = claims
            .iter()
            .map(|claim| claim.nodes.len())
            .max()
            .unwrap_or(0);
        if most + unanswered.len() >= quorum {
            return Verdict::Unknown { unanswered };
        }
        if claims.is_empty() {
            Verdict::Free
        } else {
            Verdict::Split(claims)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::error::Error;
    use crate::inspect::{Holder, LockState};

    fn answered(node: &str, fields: &[&str]) -> NodeInspection {
        NodeInspection {
            node: node.into(),
            name: "orders:42".into(),
            state: Ok(LockState {
                holders: fields
                    .iter()
                    .map(|field| Holder::new((*field).into(), "1".into(), false))
                    .collect(),
                ttl: None,
                mode: None,
                queue: Vec::new(),
                fencing_counter: None,
                server_time: SystemTime::UNIX_EPOCH,
                truncated: false,
                unreadable: Vec::new(),
            }),
        }
    }

    fn silent(node: &str) -> NodeInspection {
        NodeInspection {
            node: node.into(),
            name: "orders:42".into(),
            state: Err(Error::InvalidArgument("no answer".into())),
        }
    }

    #[test]
    fn a_quorum_of_one_owner_is_held_and_its_leftovers_are_not_listed() {
        let nodes = [
            answered("n1", &["a:1"]),
            answered("n2", &["a:1"]),
            answered("n3", &["b:1"]),
        ];
        assert_eq!(
            Verdict::judge(2, &nodes),
            Verdict::Held(vec![Claim {
                field: "a:1".into(),
                nodes: vec!["n1".into(), "n2".into()],
            }])
        );
    }

    #[test]
    fn no_quorum_is_split_unless_the_silent_nodes_could_complete_one() {
        let split = [
            answered("n1", &["a:1"]),
            answered("n2", &["b:1"]),
            answered("n3", &[]),
        ];
        assert!(matches!(Verdict::judge(2, &split), Verdict::Split(claims) if claims.len() == 2));
        let open = [answered("n1", &["a:1"]), silent("n2"), answered("n3", &[])];
        assert_eq!(
            Verdict::judge(2, &open),
            Verdict::Unknown {
                unanswered: vec!["n2".into()]
            }
        );
    }

    #[test]
    fn free_needs_the_answers_of_enough_nodes() {
        let free = [answered("n1", &[]), silent("n2"), answered("n3", &[])];
        assert_eq!(Verdict::judge(2, &free), Verdict::Free);
        let unknown = [answered("n1", &[]), silent("n2"), silent("n3")];
        assert!(matches!(
            Verdict::judge(2, &unknown),
            Verdict::Unknown { .. }
        ));
        assert!(matches!(
            Verdict::judge(1, &[silent("n1")]),
            Verdict::Unknown { .. }
        ));
        assert_eq!(Verdict::judge(1, &[answered("n1", &[])]), Verdict::Free);
    }

    #[test]
    fn a_field_holds_whatever_its_count_says() {
        let mut node = answered("n1", &[]);
        if let Ok(state) = &mut node.state {
            state
                .holders
                .push(Holder::new("a:1".into(), "many".into(), false));
        }
        assert!(matches!(Verdict::judge(1, &[node]), Verdict::Held(_)));
    }

    #[test]
    fn readers_each_with_a_quorum_all_hold() {
        let nodes = [
            answered("n1", &["a:1", "b:1"]),
            answered("n2", &["a:1", "b:1"]),
        ];
        assert!(matches!(Verdict::judge(2, &nodes), Verdict::Held(claims) if claims.len() == 2));
    }
}
