//! What a multi-node lock's queries ask its nodes, all at once: answers are
//! counted against the quorum (a lock "is locked" when a quorum of its nodes
//! hold it), and more failed nodes than the policy tolerates is an error
//! naming each.

use std::time::Duration;

use futures::FutureExt;
use futures::future::join_all;

use super::{QuorumLock, QuorumPolicy, policy};
use crate::error::{Error, FailureCause, NodeFailure, QuorumError, Result, Unavailable};
use crate::inspect::{Inspection, NodeInspection};
use crate::single::Lock;

impl<P: QuorumPolicy> QuorumLock<P> {
    /// Deletes the lock on every node, whoever holds it. Returns whether it
    /// was held on a quorum of nodes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// red.force_unlock().await?;
    /// assert!(!red.is_locked().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when more nodes failed than the policy tolerates.
    ///
    /// # Cancel safety
    ///
    /// One request per node; if dropped after sending, each may or may not
    /// be applied.
    pub async fn force_unlock(&self) -> Result<bool> {
        let deleted = self
            .on_every_node(|lock| async move { lock.force_unlock().await })
            .await?;
        Ok(deleted >= self.quorum())
    }

    /// Whether a quorum of the parts is held by anyone.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// let locked = red.is_locked().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when more nodes failed than the policy tolerates.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self
            .on_every_node(|lock| async move { lock.is_locked().await })
            .await?
            >= self.quorum())
    }

    /// Whether the owner of this handle holds a quorum of the parts.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// let job = red.with_owner(multilock::Owner::new("job-1")?);
    /// let guard = job.lock().await?;
    /// assert!(job.is_held_by_current_owner().await?);
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when more nodes failed than the policy tolerates.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn is_held_by_current_owner(&self) -> Result<bool> {
        let owner = self.owner();
        let held = self
            .on_every_node(|lock| {
                let lock = lock.with_owner(owner.clone());
                async move { lock.is_held_by_current_owner().await }
            })
            .await?;
        Ok(held >= self.quorum())
    }

    /// How many times the owner of this handle holds the lock: the count
    /// that a quorum of parts has at least.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// let job = red.with_owner(multilock::Owner::new("job-1")?);
    /// let outer = job.lock().await?;
    /// let inner = job.lock().await?;
    /// assert_eq!(job.hold_count().await?, 2);
    /// inner.unlock().await?;
    /// outer.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when more nodes failed than the policy tolerates.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn hold_count(&self) -> Result<u32> {
        let owner = self.owner();
        let counts = self
            .gather(|lock| {
                let lock = lock.with_owner(owner.clone());
                async move { lock.hold_count().await }
            })
            .await?;
        Ok(self.quorum_value(counts).unwrap_or(0))
    }

    /// The remaining time to live that a quorum of parts has at least;
    /// `None` when a quorum is not held.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// let ttl = red.remaining_ttl().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when more nodes failed than the policy tolerates.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        let ttls = self
            .gather(|lock| async move { lock.remaining_ttl().await })
            .await?;
        Ok(self.quorum_value(ttls.into_iter().flatten().collect()))
    }

    /// What every node stores for its part, read at once, each in one
    /// read-only request (see [`Lock::inspect`]), and the verdict over
    /// them: held by one owner (or readers) on a quorum, free, split
    /// (naming the nodes each holder has), or unknown while the nodes that
    /// did not answer within the node timeout
    /// ([`QuorumLock::with_node_timeout`]) could change it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(red: multilock::RedLock) -> multilock::Result<()> {
    /// use multilock::inspect::Verdict;
    /// let inspection = red.inspect().await?;
    /// if let Verdict::Split(claims) = &inspection.verdict {
    ///     for claim in claims {
    ///         println!("{} holds on {:?} only", claim.field, claim.nodes);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// None today: a node's failure is part of the inspection.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only, it never writes.
    pub async fn inspect(&self) -> Result<Inspection> {
        let node_timeout = self.node_timeout;
        let nodes = join_all(self.locks.iter().map(|lock| async move {
            match tokio::time::timeout(node_timeout, lock.inspect_node()).await {
                Ok(answer) => answer,
                Err(_) => NodeInspection {
                    node: lock.node().addr().to_owned(),
                    name: lock.name().to_owned(),
                    state: Err(Error::NodeUnavailable {
                        node: lock.node().addr().to_owned(),
                        reason: Unavailable::Timeout,
                        source: None,
                    }),
                },
            }
        }))
        .await;
        Ok(Inspection::new(self.quorum(), nodes))
    }

    /// The value that a quorum of the answers reaches.
    fn quorum_value<T: Ord>(&self, values: Vec<T>) -> Option<T> {
        policy::quorum_value(values, self.quorum())
    }

    /// How many nodes answered `true`.
    async fn on_every_node<F, Fut>(&self, op: F) -> Result<usize>
    where
        F: Fn(Lock) -> Fut,
        Fut: Future<Output = Result<bool>>,
    {
        Ok(self.gather(op).await?.into_iter().filter(|b| *b).count())
    }

    /// Runs `op` on every part at once; the answers of the nodes that
    /// answered, unless more failed than the policy tolerates.
    async fn gather<T, F, Fut>(&self, op: F) -> Result<Vec<T>>
    where
        F: Fn(Lock) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let results = join_all(self.locks.iter().map(|lock| {
            let node = lock.node().addr().to_owned();
            op(lock.clone()).map(move |r| (node, r))
        }))
        .await;
        let mut answers = Vec::new();
        let mut answered = Vec::new();
        let mut failures = Vec::new();
        for (node, result) in results {
            match result {
                Ok(value) => {
                    answers.push(value);
                    answered.push(node);
                }
                Err(err) => failures.push(NodeFailure {
                    node,
                    cause: FailureCause::Failed(err),
                }),
            }
        }
        if !policy::quorum_reachable(self.locks.len(), self.quorum(), failures.len()) {
            return Err(Error::NoQuorum(QuorumError {
                lock: self.locks[0].name().to_owned(),
                succeeded: answers.len(),
                required: self.quorum(),
                nodes: self.locks.len(),
                succeeded_on: answered,
                failures,
            }));
        }
        Ok(answers)
    }
}
