//! `multilock inspect`: one read of every node, shown as a table or JSON.

use multilock::DistributedLock;

use crate::args::{InspectArgs, InspectKind};
use crate::output::{inspection_json, inspection_text};
use crate::target::{Kind, Target};
use crate::{Failure, Outcome};

/// Reads the lock on every node and prints what each holds and the
/// verdict. Succeeds when at least one node answered.
pub async fn run(args: InspectArgs) -> Result<Outcome, Failure> {
    let target = Target::new(&args.nodes)?;
    let kind = match args.kind {
        InspectKind::Lock => Kind::Lock,
        InspectKind::Fair => Kind::Fair,
        InspectKind::Rw => Kind::Read,
    };
    let inspection = target.handle(&args.name, kind)?.inspect().await?;
    if args.json {
        out!("{}", inspection_json(&args.name, &inspection));
    } else {
        out!(
            "{}",
            inspection_text(&args.name, &inspection).trim_end_matches('\n')
        );
    }
    if inspection.nodes.iter().all(|node| node.state.is_err()) {
        return Ok(Outcome::Failed("no node answered".to_owned()));
    }
    Ok(Outcome::Done)
}
