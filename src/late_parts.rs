//! Grants a multi-node round received after it had its quorum and
//! returned: its guard adopts them ([`LateParts`]).

use std::sync::Mutex;

use crate::single::{HeldPart, PartView};

/// Grants a multi-node round received after it had its quorum and returned
/// (a node slower than the others): adopted by the guard, renewed and
/// released with it. Once the guard is released (`closed`), a grant that
/// still arrives is released at once.
#[derive(Default)]
pub(crate) struct LateParts {
    closed: bool,
    /// The guard is lost: a late grant no longer counts.
    lost: bool,
    parts: Vec<HeldPart>,
}

impl LateParts {
    /// Adopts `part`, or releases it if the guard is gone or lost.
    pub(crate) fn adopt(late: &Mutex<LateParts>, part: HeldPart) {
        let mut late = late.lock().unwrap();
        if late.closed || late.lost {
            drop(late);
            tracing::debug!(lock = %part.name(), node = %part.node_addr(), "a late grant for a released or lost guard: rolled back");
            // Dropping an unreleased part releases it in the background.
            drop(part);
        } else {
            tracing::debug!(lock = %part.name(), node = %part.node_addr(), "a late grant adopted by its guard");
            late.parts.push(part);
        }
    }

    /// Records that the guard is lost: a late grant no longer counts.
    pub(crate) fn mark_lost(late: &Mutex<LateParts>) {
        late.lock().unwrap().lost = true;
    }

    /// What the parts adopted so far say.
    pub(crate) fn views(late: &Mutex<LateParts>) -> Vec<PartView> {
        let late = late.lock().unwrap();
        late.parts.iter().filter_map(HeldPart::view).collect()
    }

    /// Closes the list and takes what it holds.
    pub(crate) fn close(late: &Mutex<LateParts>) -> Vec<HeldPart> {
        let mut late = late.lock().unwrap();
        late.closed = true;
        std::mem::take(&mut late.parts)
    }
}
