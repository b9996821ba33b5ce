//! The rules of a [`History`](super::History), as [`check`] applies them
//! to what was recorded, and the [`Violation`] each finds (the fair queues'
//! rules are applied by [`History::check`](super::History::check), from
//! the replay in `queue.rs`).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::{Access, FencedWrite, Hold, HoldId, Leftover, Outlived, Overtaking, secs};

/// A broken rule found by [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// Two holds of one name were valid at once: two holders.
    Overlap {
        /// The hold granted first.
        first: Hold,
        /// The hold granted while `first` was still valid.
        second: Hold,
        /// How long both were valid.
        overlap: Duration,
    },
    /// A hold was granted a token no higher than one granted before it.
    TokenOrder {
        /// The earlier grant with the highest token so far.
        earlier: Hold,
        /// The later grant, whose token is not higher.
        later: Hold,
    },
    /// A fenced resource rejected a write its holder made within validity:
    /// someone with a higher token wrote while this hold was valid.
    RejectedWrite {
        /// The hold that wrote.
        hold: Hold,
        /// The rejected write.
        write: FencedWrite,
        /// The hold with the lowest higher token whose accepted write may
        /// have come first, when there is one in the history.
        superseded_by: Option<Hold>,
    },
    /// A fair lock granted someone other than the head of its queue.
    QueueOrder(Overtaking),
    /// A fair lock's queue entry stayed longer than
    /// [`QUEUE_GRACE`](super::QUEUE_GRACE) after its owner's wait ended.
    QueueEntryOutlived(Outlived),
    /// A lock key remained on a node after every task finished.
    Leftover(Leftover),
}

impl Violation {
    /// A short name for the rule broken: `overlap`, `token order`,
    /// `rejected write`, `queue order`, `queue entry outlived its wait` or
    /// `leftover key`.
    pub fn rule(&self) -> &'static str {
        match self {
            Violation::Overlap { .. } => "overlap",
            Violation::TokenOrder { .. } => "token order",
            Violation::RejectedWrite { .. } => "rejected write",
            Violation::QueueOrder(_) => "queue order",
            Violation::QueueEntryOutlived(_) => "queue entry outlived its wait",
            Violation::Leftover(_) => "leftover key",
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        match self {
            Violation::Overlap { first, .. } => &first.name,
            Violation::TokenOrder { later, .. } => &later.name,
            Violation::RejectedWrite { hold, .. } => &hold.name,
            Violation::QueueOrder(overtaking) => &overtaking.name,
            Violation::QueueEntryOutlived(outlived) => &outlived.entry.name,
            Violation::Leftover(leftover) => &leftover.name,
        }
    }

    /// The holds involved (none for a queue's or a leftover key's).
    pub fn holds(&self) -> Vec<&Hold> {
        match self {
            Violation::Overlap { first, second, .. } => vec![first, second],
            Violation::TokenOrder { earlier, later } => vec![earlier, later],
            Violation::RejectedWrite {
                hold,
                superseded_by,
                ..
            } => std::iter::once(hold).chain(superseded_by).collect(),
            Violation::QueueOrder(_)
            | Violation::QueueEntryOutlived(_)
            | Violation::Leftover(_) => Vec::new(),
        }
    }

    /// When it happened, since the history began: for sorting. A leftover
    /// is found at the end.
    fn at(&self) -> Duration {
        match self {
            Violation::Overlap { second, .. } => second.granted,
            Violation::TokenOrder { later, .. } => later.granted,
            Violation::RejectedWrite { write, .. } => write.sent,
            Violation::QueueOrder(overtaking) => overtaking.at,
            Violation::QueueEntryOutlived(outlived) => outlived.wait.ended,
            Violation::Leftover(_) => Duration::MAX,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap {
                first,
                second,
                overlap,
            } => write!(
                f,
                "overlap on {:?}: {second} was granted while {first} was valid; both for {overlap:.1?}",
                first.name
            ),
            Violation::TokenOrder { earlier, later } => write!(
                f,
                "token order on {:?}: {later} was granted after {earlier}",
                later.name
            ),
            Violation::RejectedWrite {
                hold,
                write,
                superseded_by,
            } => {
                write!(
                    f,
                    "rejected write on {:?}: token {} sent at {} and refused at {}, within the validity of {hold}",
                    hold.name,
                    write.token,
                    secs(write.sent),
                    secs(write.done)
                )?;
                match superseded_by {
                    Some(other) => write!(f, "; superseded by {other}"),
                    None => Ok(()),
                }
            }
            Violation::QueueOrder(overtaking) => write!(f, "queue order: {overtaking}"),
            Violation::QueueEntryOutlived(outlived) => {
                write!(f, "queue entry outlived its wait: {outlived}")
            }
            Violation::Leftover(leftover) => write!(f, "leftover key: {leftover}"),
        }
    }
}

/// Checks a history against rules 1–4 (see the module docs) and
/// returns every violation, in the order they happened (leftover keys
/// last); empty when the history is clean.
///
/// `writes` naming a hold that is not in `holds` are ignored.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use multilock_testkit::{Access, Hold, HoldId, Violation, check};
///
/// let ms = Duration::from_millis;
/// let hold = |id, granted, released| Hold {
///     id: HoldId(id),
///     name: "orders:42".into(),
///     kind: "RedLock".into(),
///     holder: format!("task {id}"),
///     granted: ms(granted),
///     valid_until: ms(granted + 10_000),
///     released: Some(ms(released)),
///     token: None,
///     access: Access::Exclusive,
/// };
/// assert!(check(&[hold(0, 0, 100), hold(1, 100, 200)], &[], &[]).is_empty());
/// let found = check(&[hold(0, 0, 100), hold(1, 50, 200)], &[], &[]);
/// assert!(matches!(found[..], [Violation::Overlap { .. }]));
/// ```
pub fn check(holds: &[Hold], writes: &[FencedWrite], leftovers: &[Leftover]) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut by_name: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for hold in holds {
        by_name.entry(&hold.name).or_default().push(hold);
    }
    for name_holds in by_name.values_mut() {
        name_holds.sort_by_key(|h| (h.granted, h.id));
        overlaps(name_holds, &mut violations);
        token_order(name_holds, &mut violations);
    }
    rejected_writes(holds, writes, &mut violations);
    violations.sort_by_key(Violation::at);
    violations.extend(leftovers.iter().cloned().map(Violation::Leftover));
    violations
}

/// Rule 1 over the holds of one name, sorted by grant.
fn overlaps(holds: &[&Hold], violations: &mut Vec<Violation>) {
    for_each_overlap(holds, |first, second, overlap| {
        if first.access == Access::Exclusive || second.access == Access::Exclusive {
            violations.push(Violation::Overlap {
                first: first.clone(),
                second: second.clone(),
                overlap,
            });
        }
    });
}

/// How many pairs of shared holds were valid at once, per name (names
/// without such a pair are left out).
pub fn shared_overlaps(holds: &[Hold]) -> BTreeMap<String, usize> {
    let mut by_name: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for hold in holds.iter().filter(|h| h.access == Access::Shared) {
        by_name.entry(&hold.name).or_default().push(hold);
    }
    let mut counts = BTreeMap::new();
    for (name, mut name_holds) in by_name {
        name_holds.sort_by_key(|h| (h.granted, h.id));
        let mut pairs = 0;
        for_each_overlap(&name_holds, |_, _, _| pairs += 1);
        if pairs > 0 {
            counts.insert(name.to_owned(), pairs);
        }
    }
    counts
}

/// Calls `found` with every pair of holds (sorted by grant) valid at once,
/// and for how long.
fn for_each_overlap(holds: &[&Hold], mut found: impl FnMut(&Hold, &Hold, Duration)) {
    for (i, first) in holds.iter().enumerate() {
        let end = first.valid_end();
        for second in holds[i + 1..].iter().take_while(|h| h.granted < end) {
            let both_until = end.min(second.valid_end());
            if both_until > second.granted {
                found(first, second, both_until - second.granted);
            }
        }
    }
}

/// Rule 2 over the holds of one name, sorted by grant: each token is
/// higher than every token granted before it.
fn token_order(holds: &[&Hold], violations: &mut Vec<Violation>) {
    let mut highest: Option<(&Hold, u64)> = None;
    for hold in holds {
        let Some(token) = hold.token else { continue };
        match highest {
            Some((earlier, top)) if token <= top => violations.push(Violation::TokenOrder {
                earlier: earlier.clone(),
                later: (*hold).clone(),
            }),
            _ => highest = Some((hold, token)),
        }
    }
}

/// Rule 3: a write answered within its hold's validity was applied within
/// it, so a rejection means a higher token was written while it was valid.
fn rejected_writes(holds: &[Hold], writes: &[FencedWrite], violations: &mut Vec<Violation>) {
    let by_id: BTreeMap<HoldId, &Hold> = holds.iter().map(|h| (h.id, h)).collect();
    for write in writes.iter().filter(|w| !w.accepted) {
        let Some(hold) = by_id.get(&write.hold) else {
            continue;
        };
        if write.done > hold.valid_end() {
            continue;
        }
        let superseded_by = writes
            .iter()
            .filter(|w| w.accepted && w.token > write.token && w.sent < write.done)
            .filter_map(|w| by_id.get(&w.hold).filter(|h| h.name == hold.name))
            .min_by_key(|h| h.token)
            .map(|h| (*h).clone());
        violations.push(Violation::RejectedWrite {
            hold: (*hold).clone(),
            write: write.clone(),
            superseded_by,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// A hold of `name` granted at `granted` ms, valid for 10 s, released at
    /// `released` ms, with `token`.
    fn hold(id: usize, name: &str, granted: u64, released: u64, token: Option<u64>) -> Hold {
        Hold {
            id: HoldId(id),
            name: name.to_owned(),
            kind: "RedLock".to_owned(),
            holder: format!("worker {id}"),
            granted: ms(granted),
            valid_until: ms(granted + 10_000),
            released: Some(ms(released)),
            token,
            access: Access::Exclusive,
        }
    }

    fn fenced_write(hold: usize, token: u64, sent: u64, done: u64, accepted: bool) -> FencedWrite {
        FencedWrite {
            hold: HoldId(hold),
            token,
            sent: ms(sent),
            done: ms(done),
            accepted,
        }
    }

    /// Back-to-back holds of one name, interleaved holds of another, tokens
    /// that increase with gaps (a cancelled acquire used one), writes within
    /// validity accepted, and a late write rejected after its validity
    /// ended: nothing to report.
    fn clean() -> (Vec<Hold>, Vec<FencedWrite>) {
        let mut expired = hold(3, "a", 300, 2_000, Some(9));
        expired.valid_until = ms(1_000);
        let holds = vec![
            hold(0, "a", 0, 100, Some(1)),
            hold(1, "a", 100, 200, Some(2)),
            hold(2, "b", 50, 350, None),
            expired,
            hold(4, "a", 1_000, 1_100, Some(12)),
            hold(5, "b", 350, 400, None),
        ];
        let writes = vec![
            fenced_write(0, 1, 10, 20, true),
            fenced_write(1, 2, 150, 160, true),
            fenced_write(3, 9, 400, 410, true),
            fenced_write(4, 12, 1_010, 1_020, true),
            // Hold 3 kept writing after its validity ended: refused, rightly.
            fenced_write(3, 9, 1_050, 1_060, false),
            // Sent within validity, answered after it: may have been applied
            // after the next hold wrote.
            fenced_write(4, 12, 1_090, 1_101, false),
        ];
        (holds, writes)
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let (holds, writes) = clean();
        assert_eq!(check(&holds, &writes, &[]), Vec::new());
    }

    #[test]
    fn a_planted_overlap_is_found() {
        let (mut holds, writes) = clean();
        // Granted while hold 1 (100–200 ms) is valid.
        holds.push(hold(6, "a", 150, 250, None));
        let found = check(&holds, &writes, &[]);
        let [
            Violation::Overlap {
                first,
                second,
                overlap,
            },
        ] = &found[..]
        else {
            panic!("expected one overlap, found {found:?}");
        };
        assert_eq!((first.id, second.id), (HoldId(1), HoldId(6)));
        assert_eq!(*overlap, ms(50));
        let text = found[0].to_string();
        assert!(text.contains("#6") && text.contains("#1"), "{text}");
    }

    #[test]
    fn an_overlap_with_a_hold_past_its_validity_counts_only_within_it() {
        let (mut holds, writes) = clean();
        // Valid until 1 000 ms although released later: a hold from 990 ms
        // overlaps it by 10 ms; one from 1 000 ms does not.
        let mut long = hold(6, "c", 0, 5_000, None);
        long.valid_until = ms(1_000);
        holds.push(long);
        holds.push(hold(7, "c", 990, 995, None));
        holds.push(hold(8, "c", 1_000, 1_500, None));
        let found = check(&holds, &writes, &[]);
        assert!(
            matches!(&found[..], [Violation::Overlap { second, overlap, .. }]
                if second.id == HoldId(7) && *overlap == ms(5)),
            "{found:?}"
        );
    }

    #[test]
    fn shared_holds_overlap_each_other_but_not_an_exclusive_one() {
        let (mut holds, writes) = clean();
        let shared = |id, granted, released| Hold {
            access: Access::Shared,
            ..hold(id, "rw", granted, released, None)
        };
        holds.extend([shared(6, 0, 100), shared(7, 50, 150), shared(8, 60, 70)]);
        assert_eq!(check(&holds, &writes, &[]), Vec::new());
        assert_eq!(
            shared_overlaps(&holds),
            BTreeMap::from([("rw".to_owned(), 3)])
        );
        // A write granted while the second read is valid.
        holds.push(hold(9, "rw", 120, 200, None));
        let found = check(&holds, &writes, &[]);
        assert!(
            matches!(&found[..], [Violation::Overlap { first, second, .. }]
                if first.id == HoldId(7) && second.id == HoldId(9)),
            "{found:?}"
        );
        assert!(found[0].to_string().contains("shared"), "{}", found[0]);
    }

    #[test]
    fn a_planted_token_that_goes_backwards_is_found() {
        let (mut holds, writes) = clean();
        // After hold 4 (token 12), a grant with token 11.
        holds.push(hold(6, "a", 1_200, 1_300, Some(11)));
        let found = check(&holds, &writes, &[]);
        let [Violation::TokenOrder { earlier, later }] = &found[..] else {
            panic!("expected one token order violation, found {found:?}");
        };
        assert_eq!((earlier.id, later.id), (HoldId(4), HoldId(6)));
    }

    #[test]
    fn a_repeated_token_is_found() {
        let (mut holds, writes) = clean();
        holds.push(hold(6, "a", 1_200, 1_300, Some(12)));
        let found = check(&holds, &writes, &[]);
        assert!(
            matches!(&found[..], [Violation::TokenOrder { .. }]),
            "{found:?}"
        );
    }

    #[test]
    fn a_planted_rejected_write_within_validity_is_found() {
        let (holds, mut writes) = clean();
        // Hold 1 (100–200 ms) refused at 170 ms: no higher token was
        // accepted before, so the checker names no culprit.
        writes.push(fenced_write(1, 2, 165, 170, false));
        let found = check(&holds, &writes, &[]);
        let [
            Violation::RejectedWrite {
                hold,
                write,
                superseded_by,
            },
        ] = &found[..]
        else {
            panic!("expected one rejected write, found {found:?}");
        };
        assert_eq!((hold.id, write.done), (HoldId(1), ms(170)));
        assert_eq!(*superseded_by, None);
        // With a higher token accepted before, it names that write's hold.
        writes.push(fenced_write(4, 12, 160, 162, true));
        let found = check(&holds, &writes, &[]);
        assert!(
            matches!(&found[..], [Violation::RejectedWrite { superseded_by: Some(h), .. }]
                if h.id == HoldId(4)),
            "{found:?}"
        );
    }

    #[test]
    fn a_leftover_key_is_reported() {
        let (holds, writes) = clean();
        let leftover = Leftover {
            node: "redis://127.0.0.1:7001".to_owned(),
            name: "a".to_owned(),
            key: "a".to_owned(),
            fields: vec![("uuid:owner".to_owned(), "1".to_owned())],
            ttl: Some(ms(8_000)),
        };
        let found = check(&holds, &writes, std::slice::from_ref(&leftover));
        assert_eq!(found, vec![Violation::Leftover(leftover)]);
        assert!(found[0].to_string().contains("uuid:owner=1"));
    }
}
