//! The two quorum policies and the arithmetic and timing rules they share.
//!
//! Pure: no I/O and nothing from the rest of the crate, so every rule here is
//! unit-tested on its own.

use std::time::Duration;

mod sealed {
    pub trait Sealed {}
}

/// How many of a multi-node lock's parts must grant. Implemented by [`All`]
/// ([`MultiLock`](crate::MultiLock)) and [`Majority`]
/// ([`RedLock`](crate::RedLock)); sealed.
pub trait QuorumPolicy: sealed::Sealed + Send + Sync + 'static {
    /// The name used in logs and errors.
    const NAME: &'static str;

    /// The `kind` label of its metrics (feature `metrics`).
    const LABEL: &'static str;

    /// Whether every part must be on its own server. A majority assumes
    /// independent masters; an all-grant lock may put several keys on one.
    const INDEPENDENT_SERVERS: bool;

    /// Grants required out of `parts`.
    fn required(parts: usize) -> usize;
}

/// Every part must grant: [`MultiLock`](crate::MultiLock).
#[derive(Debug, Clone, Copy)]
pub struct All;

/// A majority, N/2+1, must grant: [`RedLock`](crate::RedLock).
#[derive(Debug, Clone, Copy)]
pub struct Majority;

impl sealed::Sealed for All {}
impl sealed::Sealed for Majority {}

impl QuorumPolicy for All {
    const NAME: &'static str = "MultiLock";
    const LABEL: &'static str = "multi_lock";
    const INDEPENDENT_SERVERS: bool = false;

    fn required(parts: usize) -> usize {
        parts
    }
}

impl QuorumPolicy for Majority {
    const NAME: &'static str = "RedLock";
    const LABEL: &'static str = "red_lock";
    const INDEPENDENT_SERVERS: bool = true;

    fn required(parts: usize) -> usize {
        parts / 2 + 1
    }
}

/// One part of a multi-node lock as the policies see it: where it lives and
/// which key it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part<'a> {
    /// The server's address.
    pub(crate) server: &'a str,
    /// The lock's key there.
    pub(crate) key: &'a str,
}

/// Why a list of parts cannot make a lock.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Rejected<'a> {
    /// No parts at all.
    Empty,
    /// The same key on the same server twice.
    SameKeyTwice(Part<'a>),
    /// Two parts on one server, where the policy needs independent servers.
    SameServerTwice(&'a str),
}

/// Checks the parts a `P` lock is made of.
pub(crate) fn check<'a, P: QuorumPolicy>(parts: &[Part<'a>]) -> Result<(), Rejected<'a>> {
    if parts.is_empty() {
        return Err(Rejected::Empty);
    }
    for (i, a) in parts.iter().enumerate() {
        for b in &parts[i + 1..] {
            if a.server != b.server {
                continue;
            }
            if P::INDEPENDENT_SERVERS {
                return Err(Rejected::SameServerTwice(a.server));
            }
            if a.key == b.key {
                return Err(Rejected::SameKeyTwice(*a));
            }
        }
    }
    Ok(())
}

/// Whether a round can still reach `required` grants out of `parts` once
/// `failed` parts refused or failed.
pub(crate) fn quorum_reachable(parts: usize, required: usize, failed: usize) -> bool {
    failed <= parts - required
}

/// The value that at least `required` of the answers reach: the
/// `required`-th largest (`None` with fewer answers).
pub(crate) fn quorum_value<T: Ord>(mut answers: Vec<T>, required: usize) -> Option<T> {
    answers.sort_unstable_by(|a, b| b.cmp(a));
    answers.into_iter().nth(required.checked_sub(1)?)
}

/// How long a round that has its quorum still waits for the other nodes'
/// answers: twice the time the quorum took, plus a millisecond. Scaled to
/// the answers already seen, never to the per-node timeout: a frozen node
/// costs the round almost nothing, and its grant, if it comes later, is
/// adopted by the guard or rolled back.
pub(crate) fn grace(quorum_after: Duration) -> Duration {
    quorum_after * 2 + Duration::from_millis(1)
}

/// When a node that had not answered a won round counts as overdue (and
/// suspect): ten times what the quorum took, at least 10 ms, at most the
/// per-node timeout. Until then, each new round sends it one more request,
/// which would all be answered at once when a frozen node thaws.
pub(crate) fn overdue(quorum_after: Duration, node_timeout: Duration) -> Duration {
    (quorum_after * 10)
        .max(Duration::from_millis(10))
        .min(node_timeout)
}

/// Per-attempt wait budget of `lock()`: 1500 ms per part (Redisson's
/// `RedissonMultiLock` default).
pub(crate) fn default_budget(parts: usize) -> Duration {
    Duration::from_millis(1500) * parts as u32
}

/// The longest a woken multi-node waiter staggers its next round (see
/// [`stagger_after_wake`]).
pub(crate) const MAX_STAGGER: Duration = Duration::from_millis(50);

/// A jittered pause between rounds, so competing clients that split the
/// nodes between them do not retry in lockstep.
pub(crate) fn retry_delay() -> Duration {
    Duration::from_millis(rand::random_range(50..=250))
}

/// After an unlock message, the pause before the next round: a random part
/// of twice the last round's duration, at most [`MAX_STAGGER`]. One release
/// wakes every waiter of the lock, in every process, at the same moment;
/// firing together they would split the nodes between them, and each split
/// costs a whole round. Staggered by about a round trip, the first to fire
/// usually finds every node free, and the others find them taken and fail
/// fast, holding nothing. A single node needs none of this: Redis itself
/// orders the contenders.
pub(crate) fn stagger_after_wake(last_round: Duration) -> Duration {
    (last_round * 2)
        .min(MAX_STAGGER)
        .mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorums() {
        assert_eq!(Majority::required(1), 1);
        assert_eq!(Majority::required(2), 2);
        assert_eq!(Majority::required(3), 2);
        assert_eq!(Majority::required(4), 3);
        assert_eq!(Majority::required(5), 3);
        assert_eq!(All::required(5), 5);
    }

    /// Every subset of 5 nodes (redsync's bitmask test): a majority policy
    /// succeeds exactly when two successful subsets must overlap.
    #[test]
    fn any_two_majorities_overlap() {
        let n = 5;
        let q = Majority::required(n);
        for a in 0u32..(1 << n) {
            for b in 0u32..(1 << n) {
                if a.count_ones() as usize >= q && b.count_ones() as usize >= q {
                    assert_ne!(a & b, 0, "{a:05b} and {b:05b} are disjoint");
                }
            }
        }
    }

    /// Every outcome of a 5-node round: the quorum stays reachable exactly
    /// while enough parts are left to make it.
    #[test]
    fn reachability_follows_every_subset() {
        for n in 1..=7usize {
            for policy_required in [All::required(n), Majority::required(n)] {
                for failed in 0..=n {
                    let left = n - failed;
                    assert_eq!(
                        quorum_reachable(n, policy_required, failed),
                        left >= policy_required,
                        "n {n}, required {policy_required}, failed {failed}"
                    );
                }
            }
        }
    }

    #[test]
    fn parts_are_checked() {
        let a = Part {
            server: "h:1",
            key: "x",
        };
        let b = Part {
            server: "h:2",
            key: "x",
        };
        let a_other_key = Part {
            server: "h:1",
            key: "y",
        };
        assert_eq!(check::<All>(&[]), Err(Rejected::Empty));
        assert_eq!(check::<Majority>(&[]), Err(Rejected::Empty));
        assert_eq!(check::<All>(&[a, b, a_other_key]), Ok(()));
        assert_eq!(check::<All>(&[a, b, a]), Err(Rejected::SameKeyTwice(a)));
        assert_eq!(check::<Majority>(&[a, b]), Ok(()));
        assert_eq!(
            check::<Majority>(&[a, b, a_other_key]),
            Err(Rejected::SameServerTwice("h:1"))
        );
    }

    #[test]
    fn quorum_value_is_what_a_quorum_reaches() {
        assert_eq!(quorum_value(vec![3, 1, 2, 2, 0], 3), Some(2));
        assert_eq!(quorum_value(vec![3, 1], 3), None);
        assert_eq!(quorum_value(vec![5], 1), Some(5));
        assert_eq!(quorum_value::<u32>(vec![], 0), None);
    }

    #[test]
    fn the_grace_follows_the_answers_not_the_timeouts() {
        assert_eq!(grace(Duration::ZERO), Duration::from_millis(1));
        assert_eq!(grace(Duration::from_micros(500)), Duration::from_millis(2));
        assert_eq!(grace(Duration::from_millis(20)), Duration::from_millis(41));
    }

    #[test]
    fn overdue_is_far_behind_the_quorum_and_within_the_timeout() {
        let timeout = Duration::from_millis(500);
        assert_eq!(
            overdue(Duration::from_micros(300), timeout),
            Duration::from_millis(10)
        );
        assert_eq!(
            overdue(Duration::from_millis(4), timeout),
            Duration::from_millis(40)
        );
        assert_eq!(overdue(Duration::from_millis(80), timeout), timeout);
    }

    #[test]
    fn budget_delay_and_stagger() {
        assert_eq!(default_budget(3), Duration::from_millis(4500));
        for _ in 0..100 {
            let d = retry_delay();
            assert!(d >= Duration::from_millis(50) && d <= Duration::from_millis(250));
            assert!(stagger_after_wake(Duration::from_millis(10)) <= Duration::from_millis(20));
            assert!(stagger_after_wake(Duration::from_secs(1)) <= MAX_STAGGER);
        }
    }
}
