//! `multilock unlock --force`: inspect, confirm, then on each node that
//! holds the lock the force unlock of the kind stored there (Redisson's
//! `forceUnlock`: the key deleted and the unlock message published, so
//! every client's waiters wake).

use multilock::DistributedLock;
use multilock::inspect::{LockState, Mode};

use crate::args::{UnlockArgs, UnlockKind};
use crate::output::{error_chain, verdict_text};
use crate::target::{Kind, Target};
use crate::{Failure, Outcome};

/// Force-unlocks the lock on every node that holds it, after a
/// confirmation unless `--yes`.
pub async fn run(args: UnlockArgs) -> Result<Outcome, Failure> {
    if !args.force {
        return Err(Failure::Usage(format!(
            "refusing to unlock {}: deleting a lock someone holds breaks their mutual exclusion; \
             add --force to do it anyway",
            args.name
        )));
    }
    let target = Target::new(&args.nodes)?;
    let inspection = target.handle(&args.name, Kind::Lock)?.inspect().await?;

    // What to do on each node: the force unlock of the kind found there,
    // nothing where nothing is held, and nothing where the node did not
    // answer (its kind is unknown; it is reported).
    let mut plan = Vec::new();
    let mut failed = 0;
    let mut not_read_write = 0;
    for (node, answer) in target.nodes.iter().zip(&inspection.nodes) {
        match &answer.state {
            Err(err) => {
                eprintln!(
                    "{}: not inspected, left alone: {}",
                    answer.node,
                    error_chain(err)
                );
                failed += 1;
            }
            Ok(state) if state.holders.is_empty() => {}
            Ok(state) => match kind_for(args.kind, state) {
                Some(kind) => plan.push((node, answer.node.clone(), kind)),
                None => {
                    eprintln!(
                        "{}: held, but not as a read-write lock (no mode); --kind lock or auto unlocks it",
                        answer.node
                    );
                    not_read_write += 1;
                }
            },
        }
    }
    if plan.is_empty() {
        if not_read_write == 0 {
            out!(
                "{}: not held on any node that answered; nothing deleted",
                args.name
            );
        }
        return Ok(if failed > 0 {
            Outcome::Failed(format!("{failed} node(s) not inspected"))
        } else if not_read_write > 0 {
            Outcome::Failed(format!(
                "{not_read_write} node(s) hold it, but not as --kind says; nothing deleted"
            ))
        } else {
            Outcome::NothingHeld
        });
    }

    out!("{}: {}", args.name, verdict_text(&inspection.verdict));
    for (_, addr, kind) in &plan {
        out!("  {addr}: {} force unlock", kind.as_str());
    }
    if !args.yes {
        if !confirm(&args.name).await? {
            out!("not confirmed; nothing deleted");
            return Ok(Outcome::NotConfirmed);
        }
        // The operator confirmed deleting the holders shown: if others
        // hold it by now (a release and a new grant while they read), ask
        // again rather than delete a holder nobody saw.
        let again = target.handle(&args.name, Kind::Lock)?.inspect().await?;
        if holders(&again) != holders(&inspection) {
            out!(
                "{}: the holders changed since they were shown ({}); nothing deleted, run it again",
                args.name,
                verdict_text(&again.verdict)
            );
            return Ok(Outcome::Failed(
                "the holders changed before the unlock".to_owned(),
            ));
        }
    }

    let mut deleted = 0;
    for (node, addr, kind) in plan {
        let lock = target.single(node, &args.name, kind)?;
        match lock.force_unlock().await {
            Ok(true) => {
                deleted += 1;
                out!("{addr}: deleted, waiters notified");
            }
            Ok(false) => out!("{addr}: no longer held, nothing deleted"),
            Err(err) => {
                failed += 1;
                eprintln!("{addr}: force unlock failed: {}", error_chain(&err));
            }
        }
    }
    Ok(if failed > 0 {
        Outcome::Failed(format!("{failed} node(s) failed"))
    } else if deleted == 0 {
        Outcome::NothingHeld
    } else {
        Outcome::Done
    })
}

/// Each node's holders' fields, as inspected (`None` for a node that gave
/// no state).
fn holders(inspection: &multilock::inspect::Inspection) -> Vec<Option<Vec<String>>> {
    inspection
        .nodes
        .iter()
        .map(|node| {
            let state = node.state.as_ref().ok()?;
            Some(
                state
                    .holders
                    .iter()
                    .map(|holder| holder.field.clone())
                    .collect(),
            )
        })
        .collect()
}

/// The force unlock to use on a node that stores `state`, or `None` when
/// `--kind rw` finds no read-write lock there.
fn kind_for(requested: UnlockKind, state: &LockState) -> Option<Kind> {
    let by_mode = |mode: Option<Mode>| match mode {
        Some(Mode::Read) => Some(Kind::Read),
        Some(Mode::Write) => Some(Kind::Write),
        None => None,
    };
    match requested {
        UnlockKind::Lock => Some(Kind::Lock),
        UnlockKind::Fair => Some(Kind::Fair),
        UnlockKind::Rw => by_mode(state.mode),
        UnlockKind::Auto => Some(by_mode(state.mode).unwrap_or(if state.queue.is_empty() {
            Kind::Lock
        } else {
            Kind::Fair
        })),
    }
}

/// Asks on stderr, reads a line from stdin: `y`, `yes` or the lock's name
/// confirm; anything else, or the end of input, does not.
async fn confirm(name: &str) -> Result<bool, Failure> {
    eprint!("force-unlock {name}? type y or the lock's name to confirm [y/N]: ");
    let name = name.to_owned();
    let answer = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|err| Failure::Other(format!("reading the confirmation: {err}")))?
    .map_err(|err| Failure::Other(format!("reading the confirmation: {err}")))?;
    let answer = answer.trim();
    Ok(answer.eq_ignore_ascii_case("y") || answer.eq_ignore_ascii_case("yes") || answer == name)
}
