//! Alerts for holds that run too long
//! ([`ClientBuilder::hold_warning`](crate::ClientBuilder::hold_warning),
//! `with_hold_warning`): a guard still held when its warning is due logs
//! one `tracing` warning and counts one `multilock_hold_warnings_total`.
//!
//! Nothing is made for a guard without a warning. With one, the guard
//! starts a task that sleeps until the warning is due, asks the guard's
//! judge which nodes still prove the hold, and warns once if the hold is
//! still proven (a hold that ran out or was [lost](crate::Guard::lost) is
//! not held, too long or otherwise). The guard owns the task's
//! [`HoldWarning`], which aborts the task when dropped: when the guard is
//! unlocked (before anything is sent) or dropped. So the task never
//! outlives its guard, nor keeps what the guard held alive after it.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::metrics;
use crate::owner::Owner;
use crate::timing;

/// What a warning names: the lock, the owner, and the kind its metric
/// gives it.
pub(crate) struct Named {
    pub(crate) lock: Arc<str>,
    pub(crate) owner: Owner,
    pub(crate) kind: metrics::Kind,
}

/// A guard's pending warning. Dropping it aborts the warning's task.
pub(crate) struct HoldWarning(AbortHandle);

impl HoldWarning {
    /// Starts the warning of a hold handed out now, due `after`: when due,
    /// `held()` names the nodes that still prove the hold (none: it is not
    /// held, and nothing is said). `None` outside a runtime: there is no
    /// timer to run it.
    pub(crate) fn start(
        after: Duration,
        named: Named,
        held: impl FnOnce() -> Vec<String> + Send + 'static,
    ) -> Option<HoldWarning> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let started = Instant::now();
        let due = timing::deadline(started, after);
        let task = runtime.spawn(async move {
            // Aborted here when the guard goes first.
            tokio::time::sleep_until(due).await;
            let nodes = held();
            if !nodes.is_empty() {
                warn(&named, &nodes, started.elapsed());
            }
        });
        Some(HoldWarning(task.abort_handle()))
    }
}

impl Drop for HoldWarning {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The warning itself: one log line, one count.
fn warn(named: &Named, nodes: &[String], held_for: Duration) {
    tracing::warn!(
        lock = %named.lock,
        owner = %named.owner,
        nodes = %nodes.join(","),
        held_ms = held_for.as_millis() as u64,
        "a lock is held longer than its hold warning"
    );
    // A multi-node hold has no one node, as its acquire metrics.
    let node = (named.kind == metrics::SINGLE).then(|| nodes[0].as_str());
    metrics::hold_warning(named.kind, node);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    const AFTER: Duration = Duration::from_secs(10);

    fn named() -> Named {
        Named {
            lock: "k".into(),
            owner: Owner::new("o").unwrap(),
            kind: metrics::SINGLE,
        }
    }

    /// Starts a warning whose judge counts its calls in `asked` and finds
    /// the hold on `nodes`.
    fn start(asked: &Arc<AtomicUsize>, nodes: &[&str]) -> HoldWarning {
        let asked = asked.clone();
        let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        HoldWarning::start(AFTER, named(), move || {
            asked.fetch_add(1, Ordering::SeqCst);
            nodes
        })
        .expect("in a runtime")
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_judge_is_asked_once_when_the_warning_is_due() {
        let asked = Arc::new(AtomicUsize::new(0));
        let _warning = start(&asked, &["n:1"]);
        tokio::time::advance(AFTER - Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(asked.load(Ordering::SeqCst), 0, "not due yet");
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(asked.load(Ordering::SeqCst), 1, "due");
        tokio::time::advance(AFTER * 10).await;
        settle().await;
        assert_eq!(asked.load(Ordering::SeqCst), 1, "once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_warning_dropped_before_it_is_due_never_asks() {
        let asked = Arc::new(AtomicUsize::new(0));
        drop(start(&asked, &["n:1"]));
        settle().await;
        assert_eq!(Arc::strong_count(&asked), 1, "the task let go of its judge");
        tokio::time::advance(AFTER * 2).await;
        settle().await;
        assert_eq!(asked.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn nothing_starts_outside_a_runtime() {
        let warning = HoldWarning::start(AFTER, named(), Vec::new);
        assert!(warning.is_none());
    }
}
