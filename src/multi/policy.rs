//! The two quorum policies and the timing rules they share.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::lock::Lock;

mod sealed {
    pub trait Sealed {}
}

/// How many of a multi-node lock's parts must grant. Implemented by [`All`]
/// ([`MultiLock`](crate::MultiLock)) and [`Majority`]
/// ([`RedLock`](crate::RedLock)); sealed.
pub trait QuorumPolicy: sealed::Sealed + Send + Sync + 'static {
    /// The name used in logs and errors.
    const NAME: &'static str;

    /// Grants required out of `parts`.
    fn required(parts: usize) -> usize;

    /// Checks the parts a lock is made of.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming what is wrong.
    fn check(locks: &[Lock]) -> Result<()> {
        if locks.is_empty() {
            return Err(Error::invalid(format!(
                "a {} needs at least one lock",
                Self::NAME
            )));
        }
        for (i, a) in locks.iter().enumerate() {
            for b in &locks[i + 1..] {
                if a.node().same_server(b.node()) && a.name() == b.name() {
                    return Err(Error::invalid(format!(
                        "lock {:?} on node {} appears twice in a {}",
                        a.name(),
                        a.node().addr(),
                        Self::NAME
                    )));
                }
            }
        }
        Ok(())
    }
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

    fn required(parts: usize) -> usize {
        parts
    }
}

impl QuorumPolicy for Majority {
    const NAME: &'static str = "RedLock";

    fn required(parts: usize) -> usize {
        parts / 2 + 1
    }

    /// Also rejects two parts on one node: the majority assumes independent
    /// masters.
    fn check(locks: &[Lock]) -> Result<()> {
        if locks.is_empty() {
            return Err(Error::invalid("a RedLock needs at least one lock"));
        }
        for (i, a) in locks.iter().enumerate() {
            for b in &locks[i + 1..] {
                if a.node().same_server(b.node()) {
                    return Err(Error::invalid(format!(
                        "node {} appears twice in a RedLock: its majority needs independent nodes",
                        a.node().addr()
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Per-attempt wait budget of `lock()`: 1500 ms per part (Redisson's
/// `RedissonMultiLock` default).
pub(crate) fn default_budget(parts: usize) -> Duration {
    Duration::from_millis(1500) * parts as u32
}

/// The longest a woken multi-node waiter staggers its next round; see
/// `stagger_after_wake`.
pub(crate) const MAX_STAGGER: Duration = Duration::from_millis(50);

/// A jittered pause between rounds, so competing clients that split the
/// nodes between them do not retry in lockstep.
pub(crate) fn retry_delay() -> Duration {
    Duration::from_millis(rand::random_range(50..=250))
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

    #[test]
    fn budget_and_delay() {
        assert_eq!(default_budget(3), Duration::from_millis(4500));
        for _ in 0..100 {
            let d = retry_delay();
            assert!(d >= Duration::from_millis(50) && d <= Duration::from_millis(250));
        }
    }
}
