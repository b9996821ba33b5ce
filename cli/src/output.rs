//! How an inspection is shown: a table for people, a JSON object for
//! scripts, and the time and duration formats both use.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use multilock::inspect::{Inspection, LockState, NodeInspection, Verdict};
use serde_json::{Value, json};

/// `time` as RFC 3339 in UTC with milliseconds: `2025-05-01T12:00:00.123Z`.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (days, secs) = (since.as_secs() / 86_400, since.as_secs() % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        since.subsec_millis()
    )
}

/// The date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Text from the server as it may be shown on a terminal: control
/// characters (a newline, an escape sequence) escaped, so a name or a field
/// someone wrote cannot forge a line of output or recolour it.
pub fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    text.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect::<String>()
        .into()
}

/// A duration for people: `850ms`, `29.5s`, `4m03s`.
pub fn human(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", duration.as_secs_f64())
    } else {
        let secs = duration.as_secs();
        format!("{}m{:02}s", secs / 60, secs % 60)
    }
}

/// Milliseconds since the epoch (saturating: a deadline another client
/// wrote may be anything).
pub fn epoch_ms(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
    }
}

/// `deadline` relative to the node's `now`, in ms (negative once passed).
pub fn relative_ms(deadline: SystemTime, now: SystemTime) -> i64 {
    epoch_ms(deadline).saturating_sub(epoch_ms(now))
}

/// The verdict's state word: `free`, `held`, `split` or `unknown`.
pub fn verdict_state(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Free => "free",
        Verdict::Held(_) => "held",
        Verdict::Split(_) => "split",
        Verdict::Unknown { .. } => "unknown",
        _ => "unknown",
    }
}

/// The verdict as JSON: `{"state", "claims": [{"field", "nodes"}], "unanswered"}`.
fn verdict_json(verdict: &Verdict) -> Value {
    let claims = match verdict {
        Verdict::Held(claims) | Verdict::Split(claims) => claims
            .iter()
            .map(|claim| json!({"field": claim.field, "nodes": claim.nodes}))
            .collect(),
        _ => Vec::new(),
    };
    let unanswered = match verdict {
        Verdict::Unknown { unanswered } => unanswered.clone(),
        _ => Vec::new(),
    };
    json!({"state": verdict_state(verdict), "claims": claims, "unanswered": unanswered})
}

/// One node's answer as JSON (the shape `inspect --help` documents).
fn node_json(node: &NodeInspection) -> Value {
    let state = match &node.state {
        Ok(state) => state,
        Err(err) => {
            return json!({
                "node": node.node, "name": node.name, "ok": false, "error": error_chain(err),
                "ttl_ms": null, "mode": null, "holders": [], "queue": [],
                "fencing_counter": null, "server_time_ms": null,
                "truncated": false, "unreadable": [],
            });
        }
    };
    let holders: Vec<Value> = state
        .holders
        .iter()
        .map(|holder| {
            let reads: Vec<Option<u128>> = holder
                .read_holds
                .iter()
                .map(|ttl| ttl.map(|ttl| ttl.as_millis()))
                .collect();
            json!({
                "field": holder.field, "client_id": holder.client_id, "owner": holder.owner,
                "holds": holder.holds, "writer": holder.writer, "read_holds_ttl_ms": reads,
            })
        })
        .collect();
    let queue: Vec<Value> = state
        .queue
        .iter()
        .map(|waiter| {
            json!({
                "field": waiter.field, "client_id": waiter.client_id, "owner": waiter.owner,
                "deadline_ms": waiter.deadline.map(epoch_ms),
                "deadline_in_ms": waiter.deadline.map(|d| relative_ms(d, state.server_time)),
            })
        })
        .collect();
    json!({
        "node": node.node, "name": node.name, "ok": true, "error": null,
        "ttl_ms": state.ttl.map(|ttl| ttl.as_millis()),
        "mode": state.mode.map(|mode| mode.as_str()),
        "holders": holders, "queue": queue,
        "fencing_counter": state.fencing_counter,
        "server_time_ms": epoch_ms(state.server_time),
        "truncated": state.truncated,
        "unreadable": state.unreadable,
    })
}

/// The inspection of lock `name` as one JSON object.
pub fn inspection_json(name: &str, inspection: &Inspection) -> Value {
    json!({
        "name": name,
        "quorum": inspection.quorum,
        "verdict": verdict_json(&inspection.verdict),
        "nodes": inspection.nodes.iter().map(node_json).collect::<Vec<_>>(),
    })
}

/// The inspection of lock `name` as text: each node's state, then the
/// verdict.
pub fn inspection_text(name: &str, inspection: &Inspection) -> String {
    let mut out = String::new();
    let nodes = inspection.nodes.len();
    let _ = writeln!(
        out,
        "lock {}: {nodes} node(s), held when {} hold it",
        shown(name),
        inspection.quorum
    );
    for node in &inspection.nodes {
        let _ = writeln!(out);
        match &node.state {
            Ok(state) => node_text(&mut out, node, state),
            Err(err) => {
                let _ = writeln!(out, "node {}: NO ANSWER: {}", node.node, error_chain(err));
            }
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "verdict: {}", verdict_text(&inspection.verdict));
    out
}

/// An error and its sources, one after another (the library's errors
/// redact passwords; a server's answer, such as `WRONGTYPE`, is a source).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

fn node_text(out: &mut String, node: &NodeInspection, state: &LockState) {
    let _ = writeln!(out, "node {} (key {})", node.node, shown(&node.name));
    let ttl = match state.ttl {
        Some(ttl) => human(ttl),
        None if state.holders.is_empty() => "-".to_owned(),
        None => "no expiry".to_owned(),
    };
    let mode = state.mode.map(|mode| mode.as_str()).unwrap_or("-");
    let fencing = state
        .fencing_counter
        .map(|counter| counter.to_string())
        .unwrap_or_else(|| "-".to_owned());
    let _ = writeln!(out, "  ttl {ttl}   mode {mode}   fencing counter {fencing}");
    for key in &state.unreadable {
        let _ = writeln!(out, "  unreadable: {}", shown(key));
    }
    if state.truncated {
        let _ = writeln!(
            out,
            "  (cut short: more than 10,000 fields or waiters, or 1,000 read holds, were not all read)"
        );
    }
    if state.holders.is_empty() {
        let _ = writeln!(out, "  holders: none");
    } else {
        let _ = writeln!(out, "  holders:");
        let _ = writeln!(
            out,
            "    {:<38} {:<20} {:>5}  {:<6}  read holds' ttl",
            "client id", "owner", "holds", "role"
        );
        for holder in &state.holders {
            let role = if holder.writer {
                "writer"
            } else if state.mode.is_some() {
                "reader"
            } else {
                "holder"
            };
            let reads = holder
                .read_holds
                .iter()
                .map(|ttl| ttl.map(human).unwrap_or_else(|| "expired".to_owned()))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                out,
                "    {:<38} {:<20} {:>5}  {:<6}  {}",
                shown(&holder.client_id),
                shown(&holder.owner),
                holder.holds,
                role,
                if reads.is_empty() { "-" } else { &reads }
            );
        }
    }
    if !state.queue.is_empty() {
        let _ = writeln!(out, "  queue (head first):");
        for (position, waiter) in state.queue.iter().enumerate() {
            let deadline = match waiter.deadline {
                Some(deadline) => {
                    let ms = relative_ms(deadline, state.server_time);
                    if ms >= 0 {
                        format!("deadline in {}", human(Duration::from_millis(ms as u64)))
                    } else {
                        format!(
                            "deadline passed {} ago",
                            human(Duration::from_millis(ms.unsigned_abs()))
                        )
                    }
                }
                None => "no deadline".to_owned(),
            };
            let _ = writeln!(
                out,
                "    {}. {} (client {}, owner {}) {deadline}",
                position + 1,
                shown(&waiter.field),
                shown(&waiter.client_id),
                shown(&waiter.owner)
            );
        }
    }
}

/// The verdict in a line.
pub fn verdict_text(verdict: &Verdict) -> String {
    let claims = |claims: &[multilock::inspect::Claim]| {
        claims
            .iter()
            .map(|claim| format!("{} on {}", shown(&claim.field), claim.nodes.join(", ")))
            .collect::<Vec<_>>()
            .join("; ")
    };
    match verdict {
        Verdict::Free => "free".to_owned(),
        Verdict::Held(held) => format!("held by {}", claims(held)),
        Verdict::Split(split) => format!("split (no quorum): {}", claims(split)),
        Verdict::Unknown { unanswered } => format!(
            "unknown: too few nodes answered (no answer from {})",
            unanswered.join(", ")
        ),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_millis(951_827_696_789);
        assert_eq!(rfc3339(leap), "2000-02-29T12:34:56.789Z");
        let later = UNIX_EPOCH + Duration::from_secs(1_767_225_599);
        assert_eq!(rfc3339(later), "2025-12-31T23:59:59.000Z");
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_millis(29_500)), "29.5s");
        assert_eq!(human(Duration::from_secs(243)), "4m03s");
    }
}
