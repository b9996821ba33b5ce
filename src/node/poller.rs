//! The background poll a node that follows a topology runs: a Sentinel
//! node asking its sentinels, a Cluster node asking for the slot map.
//!
//! It polls every [`POLL_INTERVAL`] (Redisson's `scanInterval`), and at
//! once, then every [`FAST_POLL_INTERVAL`] for [`FAST_POLL_FOR`], when
//! told a change may be under way (a lost connection, a `READONLY` or
//! `MOVED` reply, a sentinel's `+switch-master`). It holds what it polls
//! weakly and ends with it; a node used from another runtime after its
//! first one shut down or stalled starts it again (see [`crate::running`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::running::Running;

/// How often the topology is asked about when nothing suggests a change.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How often while a change may be under way: a failover takes a second or
/// more to settle, and polling once a second would add up to another second.
const FAST_POLL_INTERVAL: Duration = Duration::from_millis(100);
const FAST_POLL_FOR: Duration = Duration::from_secs(10);
/// A poll task that has not gone round for this long is taken as stalled
/// (on a runtime nobody drives) and replaced: far beyond a poll's pause
/// and its requests' timeouts.
const STALL: Duration = Duration::from_secs(30);

/// One node's poll task: what wakes it, and whether it runs.
pub(crate) struct Poller {
    nudge: Arc<Nudge>,
    /// Whether the task runs (and has not stalled).
    running: Arc<Running>,
}

impl Poller {
    pub(crate) fn new() -> Poller {
        Poller {
            nudge: Arc::new(Nudge {
                now: Notify::new(),
                fast_until: Mutex::new(None),
            }),
            running: Arc::new(Running::new()),
        }
    }

    /// Polls at once, then fast for a while.
    pub(crate) fn check_soon(&self) {
        self.nudge.check_soon();
    }

    /// What a push sender keeps to call [`Poller::check_soon`] with.
    #[cfg(feature = "sentinel")]
    pub(crate) fn nudge(&self) -> Arc<Nudge> {
        self.nudge.clone()
    }

    /// Starts the task on the current runtime unless it runs: `tick` is
    /// called with `of` on every poll, until `of` is dropped.
    pub(crate) fn start<T, F, Fut>(&self, of: &Arc<T>, tick: F)
    where
        T: Send + Sync + 'static,
        F: Fn(Arc<T>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let Some((alive, runtime)) = self.running.start(STALL) else {
            return;
        };
        let (of, nudge, running) = (Arc::downgrade(of), self.nudge.clone(), self.running.clone());
        runtime.spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(nudge.interval()) => {}
                    () = nudge.now.notified() => {}
                }
                let Some(of) = of.upgrade() else {
                    return;
                };
                if !running.beat(&alive) {
                    return;
                }
                tick(of).await;
            }
        });
    }
}

/// What wakes a poll task, and how often it polls.
pub(crate) struct Nudge {
    now: Notify,
    /// Until when it polls fast (see [`FAST_POLL_INTERVAL`]).
    fast_until: Mutex<Option<tokio::time::Instant>>,
}

impl Nudge {
    pub(crate) fn check_soon(&self) {
        *self.fast_until.lock().unwrap() = Some(tokio::time::Instant::now() + FAST_POLL_FOR);
        self.now.notify_one();
    }

    /// The pause before the next poll.
    fn interval(&self) -> Duration {
        let fast_until = *self.fast_until.lock().unwrap();
        match fast_until.is_some_and(|until| tokio::time::Instant::now() < until) {
            true => FAST_POLL_INTERVAL,
            false => POLL_INTERVAL,
        }
    }
}
