//! Whether a background task that is started on demand runs: a suspect
//! node's probe, a topology poll, a fenced node's watch and repairs.
//!
//! Such a task is spawned on whatever runtime asked first, and a `Node` or
//! `Client` may outlive that runtime (a static shared by several
//! `#[tokio::test]`s). A flag saying "started" would then say it forever,
//! and the work would never be done again. So the task holds an [`Alive`]
//! token (a runtime that shuts down drops it with the task), and beats each
//! time it goes round its loop: one parked on a runtime nobody drives any
//! more (a current-thread runtime between two `block_on`s) is alive but
//! stalled. The next caller on a live runtime starts a new task in either
//! case; a replaced task that runs again ends at its next beat.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

/// One task's liveness, as the state that starts it sees it.
pub(crate) struct Running {
    current: Mutex<Current>,
}

struct Current {
    /// The running task's token; dead when none runs.
    alive: Weak<()>,
    /// When that task last went round its loop.
    beat: Instant,
}

impl Current {
    fn is(&self, alive: &Alive) -> bool {
        std::ptr::eq(self.alive.as_ptr(), Arc::as_ptr(&alive.0))
    }
}

/// Held by a running task: the task runs while this lives.
pub(crate) struct Alive(Arc<()>);

impl Running {
    pub(crate) fn new() -> Running {
        Running {
            current: Mutex::new(Current {
                alive: Weak::new(),
                beat: Instant::now(),
            }),
        }
    }

    /// A token for a new task unless one runs, on the current runtime (none
    /// without one): a task runs while its token lives and it beat within
    /// `stall` (the longest its loop takes to go round). The caller spawns
    /// the task with the token.
    pub(crate) fn start(&self, stall: Duration) -> Option<(Alive, tokio::runtime::Handle)> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let mut current = self.current.lock().unwrap();
        if current.alive.strong_count() > 0 && current.beat.elapsed() < stall {
            return None;
        }
        let alive = Arc::new(());
        *current = Current {
            alive: Arc::downgrade(&alive),
            beat: Instant::now(),
        };
        Some((Alive(alive), runtime))
    }

    /// The task holding `alive` goes round its loop: `false` when another
    /// task replaced it (then it ends).
    pub(crate) fn beat(&self, alive: &Alive) -> bool {
        let mut current = self.current.lock().unwrap();
        if !current.is(alive) {
            return false;
        }
        current.beat = Instant::now();
        true
    }

    /// The task holding `alive` ends, its work done: the next
    /// [`Running::start`] starts a new one at once. (Called under the lock
    /// that decided there is no work left, so none is left undone.)
    pub(crate) fn stop(&self, alive: &Alive) {
        let mut current = self.current.lock().unwrap();
        if current.is(alive) {
            current.alive = Weak::new();
        }
    }

    /// Whether a task holds a token (stalled or not).
    #[cfg(test)]
    pub(crate) fn is_running(&self) -> bool {
        self.current.lock().unwrap().alive.strong_count() > 0
    }
}

impl Default for Running {
    fn default() -> Running {
        Running::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALL: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn one_task_runs_until_its_token_is_dropped() {
        let running = Running::new();
        let (alive, _) = running.start(STALL).expect("none runs");
        assert!(running.start(STALL).is_none(), "one runs");
        drop(alive);
        assert!(running.start(STALL).is_some(), "its token is gone");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_task_is_replaced_and_told_so() {
        let running = Running::new();
        let (stalled, _) = running.start(STALL).expect("none runs");
        tokio::time::advance(STALL / 2).await;
        assert!(running.beat(&stalled), "it beats while current");
        tokio::time::advance(STALL / 2).await;
        assert!(running.start(STALL).is_none(), "it beat within the stall");
        tokio::time::advance(STALL).await;
        let (replacement, _) = running.start(STALL).expect("stalled: replaced");
        assert!(!running.beat(&stalled), "the stalled one ends at its beat");
        assert!(running.beat(&replacement));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_task_is_restarted_by_the_next_start() {
        let running = Running::new();
        let (first, _) = running.start(STALL).expect("none runs");
        let (alive, _) = {
            running.stop(&first);
            running.start(STALL).expect("stopped")
        };
        running.stop(&first);
        assert!(
            running.is_running(),
            "a late stop of an old task changes nothing"
        );
        drop(alive);
    }

    #[test]
    fn nothing_starts_without_a_runtime() {
        assert!(Running::new().start(STALL).is_none());
    }
}
