//! A multi-node guard's release: every node at once, a quorum to succeed,
//! a short grace for the others, and the error that names what each said.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use super::never_granted;
use crate::error::{Error, FailureCause, NodeFailure, QuorumError, Result};
use crate::node::Node;
use crate::quorum::fan_out::FanOut;
use crate::quorum::grace::{FanOutTimer, Next, Pace};
use crate::single::HeldPart;

/// Releases `parts` of lock `lock` (a multi-node lock of `nodes`, held
/// while `required` of them are; its fan-outs keep `pace`): returns once a
/// quorum released and the others answered or had their grace (at most
/// `node_timeout`); the rest finish in the background.
pub(super) async fn release_at_quorum(
    lock: &str,
    parts: Vec<HeldPart>,
    nodes: &[String],
    required: usize,
    node_timeout: Duration,
    pace: &Arc<Pace>,
) -> Result<()> {
    // The nodes by their place in `held`: addresses are written out
    // only for an error.
    let held: Vec<Node> = parts.iter().map(|p| p.lock.node().clone()).collect();
    // Once a quorum released, the others get the grace a round gives
    // them (scaled to the answers seen, and capped: a release may take
    // longer than a round's request, which its timeout cuts off): those
    // that answer by then need no task of their own to finish in. Each
    // release has its connection's response timeout: no cut-off here.
    let mut timer = FanOutTimer::new(pace, None, node_timeout);
    let mut releases: FanOut<_> = parts
        .into_iter()
        .enumerate()
        .map(|(at, part)| part.release().map(move |result| (at, result)))
        .collect();
    let mut released = Vec::new();
    let mut failures = Vec::new();
    let mut quorum_reached = false;
    loop {
        let (at, result) = match timer.next(&mut releases).await {
            Next::Answer(answer) => answer,
            // The rest finish in the background (`FinishOnDrop`).
            Next::Done | Next::GraceOver | Next::CutOff => break,
        };
        let node = || held[at].addr().to_owned();
        match result {
            Ok(_) => released.push(at),
            Err(err) => failures.push(NodeFailure {
                node: node(),
                cause: FailureCause::Failed(err),
            }),
        }
        if !quorum_reached && released.len() >= required {
            quorum_reached = true;
            timer.quorum_reached();
        }
    }
    if released.len() >= required {
        for failure in &failures {
            let FailureCause::Failed(err) = &failure.cause else {
                continue;
            };
            // A node that is down fails every unlock at once, and its
            // change of health was logged once already; any other
            // answer (not held there, refused) is worth a warning, as
            // it is when it comes in the background.
            if matches!(err, Error::NodeUnavailable { .. }) {
                tracing::debug!(lock = %lock, node = %failure.node, error = %err, "release failed on a node; a quorum released");
            } else {
                tracing::warn!(lock = %lock, node = %failure.node, error = %err, "release failed on a node; a quorum released");
            }
        }
        return Ok(());
    }
    let not_held: Vec<String> = failures
        .iter()
        .filter(|f| matches!(f.cause, FailureCause::Failed(Error::NotHeld { .. })))
        .map(|f| f.node.clone())
        .collect();
    // The nodes where the hold may still have been (released, or not
    // confirmed either way) are too few for a quorum: the lock was not
    // held on a quorum when it was released (it had run out, or was
    // taken away), which is what a single-node lock would say. A node
    // this guard never held is neither: it proves nothing either way.
    let maybe_held = held.len() - not_held.len();
    if maybe_held < required {
        return Err(Error::NotHeld {
            lock: lock.to_owned(),
            nodes: not_held,
        });
    }
    let held: Vec<String> = held.iter().map(|node| node.addr().to_owned()).collect();
    failures.extend(never_granted(nodes, &held));
    Err(Error::NoQuorum(QuorumError {
        lock: lock.to_owned(),
        succeeded: released.len(),
        required,
        nodes: nodes.len(),
        succeeded_on: released.iter().map(|at| held[*at].clone()).collect(),
        failures,
    }))
}
