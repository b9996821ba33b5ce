//! `multilock watch`: the lock read every interval, each change printed
//! with a timestamp: grants, releases, hold counts, waiters, renewals, and
//! nodes going down and coming back.

use std::collections::HashMap;
use std::time::SystemTime;

use multilock::DistributedLock;
use multilock::inspect::LockState;
use serde_json::json;

use crate::args::WatchArgs;
use crate::output::{error_chain, human, rfc3339, shown};
use crate::target::{Kind, Target};
use crate::{Failure, Outcome};

/// One change seen on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// `grant`, `release`, `count`, `waiter`, `left`, `renewal`, `down`,
    /// `up`, or `state` (the state at start, not a change).
    pub event: &'static str,
    /// The holder's or waiter's hash field, when the change is one's.
    pub field: Option<String>,
    /// What changed, for people.
    pub detail: String,
}

/// What a node answered at one read.
type Answer = Result<LockState, String>;

/// Reads the lock every interval and prints each change until `--changes`
/// changes were printed, or Ctrl-C.
pub async fn run(args: WatchArgs) -> Result<Outcome, Failure> {
    let target = Target::new(&args.nodes)?;
    let handle = target.handle(&args.name, Kind::Lock)?;
    let watching = async {
        let mut ticker = tokio::time::interval(args.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Per node: whether it answered last time, and its last answer.
        let mut up: HashMap<String, bool> = HashMap::new();
        let mut last: HashMap<String, LockState> = HashMap::new();
        let mut printed = 0u64;
        loop {
            ticker.tick().await;
            let inspection = handle.inspect().await?;
            let now = SystemTime::now();
            for node in inspection.nodes {
                let answer: Answer = node.state.map_err(|err| error_chain(&err));
                let changes = match (up.get(&node.node), &answer) {
                    (None, _) => vec![initial(&answer)],
                    (Some(was_up), _) => changes(*was_up, last.get(&node.node), &answer),
                };
                for change in changes {
                    print_change(now, &node.node, &change, args.json);
                    if change.event != "state" {
                        printed += 1;
                        if args.changes.is_some_and(|limit| printed >= limit) {
                            return Ok(Outcome::Done);
                        }
                    }
                }
                up.insert(node.node.clone(), answer.is_ok());
                if let Ok(state) = answer {
                    last.insert(node.node, state);
                }
            }
        }
    };
    tokio::select! {
        outcome = watching => outcome,
        _ = tokio::signal::ctrl_c() => Ok(Outcome::Done),
    }
}

fn print_change(now: SystemTime, node: &str, change: &Change, as_json: bool) {
    if as_json {
        out!(
            "{}",
            json!({"time": rfc3339(now), "node": node, "event": change.event,
                   "field": change.field, "detail": change.detail})
        );
    } else {
        out!(
            "{}  {node}  {:<8} {}",
            rfc3339(now),
            change.event,
            shown(&change.detail)
        );
    }
}

/// The state at start, as a `state` line.
fn initial(answer: &Answer) -> Change {
    let detail = match answer {
        Err(err) => format!("no answer: {err}"),
        Ok(state) if state.holders.is_empty() && state.queue.is_empty() => "free".to_owned(),
        Ok(state) => {
            let holders = state
                .holders
                .iter()
                .map(|holder| format!("{} x{}", holder.field, holder.holds))
                .collect::<Vec<_>>()
                .join(", ");
            let ttl = state.ttl.map(human).unwrap_or_else(|| "-".to_owned());
            format!(
                "held by [{holders}], ttl {ttl}, {} waiting",
                state.queue.len()
            )
        }
    };
    Change {
        event: "state",
        field: None,
        detail,
    }
}

/// What changed on a node from its last answer (`was_up`, and `last`, its
/// last state when it ever answered) to `answer`.
fn changes(was_up: bool, last: Option<&LockState>, answer: &Answer) -> Vec<Change> {
    let mut out = Vec::new();
    let state = match answer {
        Err(err) => {
            if was_up {
                out.push(Change {
                    event: "down",
                    field: None,
                    detail: format!("no answer: {err}"),
                });
            }
            return out;
        }
        Ok(state) => state,
    };
    if !was_up {
        out.push(Change {
            event: "up",
            field: None,
            detail: "answers again".to_owned(),
        });
    }
    // A node that had not answered before: everything it holds is new.
    let (old_holders, old_queue, old_ttl) = match last {
        Some(last) => (&last.holders[..], &last.queue[..], last.ttl),
        None => (&[][..], &[][..], None),
    };
    for holder in &state.holders {
        let role = if holder.writer {
            " (writer)"
        } else if state.mode.is_some() {
            " (reader)"
        } else {
            ""
        };
        match old_holders.iter().find(|old| old.field == holder.field) {
            None => out.push(Change {
                event: "grant",
                field: Some(holder.field.clone()),
                detail: format!(
                    "{}: client {} owner {} holds {}{role}",
                    holder.field, holder.client_id, holder.owner, holder.holds
                ),
            }),
            Some(old) if old.holds != holder.holds => out.push(Change {
                event: "count",
                field: Some(holder.field.clone()),
                detail: format!(
                    "{}: holds {} -> {}{}",
                    holder.field,
                    old.holds,
                    holder.holds,
                    if holder.holds > old.holds {
                        " (re-entry)"
                    } else {
                        " (one hold released)"
                    }
                ),
            }),
            Some(_) => {}
        }
    }
    for old in old_holders {
        if !state.holders.iter().any(|holder| holder.field == old.field) {
            out.push(Change {
                event: "release",
                field: Some(old.field.clone()),
                detail: format!("{}: released (or expired)", old.field),
            });
        }
    }
    for (position, waiter) in state.queue.iter().enumerate() {
        if !old_queue.iter().any(|old| old.field == waiter.field) {
            out.push(Change {
                event: "waiter",
                field: Some(waiter.field.clone()),
                detail: format!("{}: queued at position {}", waiter.field, position + 1),
            });
        }
    }
    for old in old_queue {
        if !state.queue.iter().any(|waiter| waiter.field == old.field) {
            let granted = state.holders.iter().any(|holder| holder.field == old.field);
            out.push(Change {
                event: "left",
                field: Some(old.field.clone()),
                detail: format!(
                    "{}: left the queue{}",
                    old.field,
                    if granted {
                        " (granted)"
                    } else {
                        " (gave up or expired)"
                    }
                ),
            });
        }
    }
    let holders_changed = out
        .iter()
        .any(|change| matches!(change.event, "grant" | "release" | "count"));
    if let (Some(before), Some(after)) = (old_ttl, state.ttl)
        && after > before
        && !holders_changed
        && !state.holders.is_empty()
    {
        out.push(Change {
            event: "renewal",
            field: None,
            detail: format!("ttl {} -> {}", human(before), human(after)),
        });
    }
    out
}
