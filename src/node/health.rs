//! Whether a node answers: healthy, or suspect since its last request timed
//! out or was refused.
//!
//! A frozen or black-holed node costs every request sent to it a whole
//! timeout, and every such request waits on its connection, answered in a
//! flood when the node thaws. So once a request to a node times out or is
//! refused, the node is *suspect*: requests to it fail at once, with nothing
//! sent ([`Unavailable::Suspect`](crate::Unavailable::Suspect)), while one
//! probe per node (a PING on a fresh connection, after 20 ms, then backing
//! off to 500 ms) decides when it answers again (a probe that ended with its
//! runtime, or stalled on one nobody drives, is started again by the next
//! request). Any request that does get an answer also clears the
//! suspicion. Each change is logged once, at `warn` when a node becomes
//! suspect and `info` when it recovers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::running::{Alive, Running};

/// First pause before probing a suspect node.
const FIRST_PROBE: Duration = Duration::from_millis(20);
/// Longest pause between two probes.
const MAX_PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// How long no request may meet a condition before an answer ends it.
const CONDITION_QUIET: Duration = Duration::from_secs(1);

/// A condition the server answers with, and when it last did.
struct Condition {
    code: &'static str,
    last_refusal: Instant,
}

/// A node's health, as [`Node::health`](crate::Node::health) reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Health {
    /// Requests go to the node.
    Healthy,
    /// A request timed out or was refused; requests fail at once while a
    /// probe checks the node.
    Suspect {
        /// Since when.
        since: std::time::Instant,
    },
}

/// Why a node became suspect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// A request timed out or was refused.
    Failed,
    /// A request is far slower than the other nodes' answers to the same
    /// round, though not timed out yet.
    Overdue,
}

/// The shared health state of one node.
pub(crate) struct HealthState {
    addr: String,
    /// Where the probe's fresh connections go.
    target: super::target::Target,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// `suspect_since.is_some()`, read on every request without the lock.
    suspect: AtomicBool,
    suspect_since: Mutex<Option<Instant>>,
    /// Whether a probe runs (and has not stalled).
    probe: Running,
    /// `condition.is_some()`, read on every answer without the lock.
    conditioned: AtomicBool,
    /// A condition the server refuses requests with for a while (`BUSY`,
    /// `OOM`, `MISCONF`, `LOADING`, ...), from its first such answer until
    /// an answer without it after a quiet spell.
    condition: Mutex<Option<Condition>>,
    /// Bumped at every recovery: retries waiting out a pause go at once
    /// ([`super::retry::RetryPause`]).
    recoveries: tokio::sync::watch::Sender<u64>,
}

impl HealthState {
    pub(crate) fn new(
        addr: String,
        target: super::target::Target,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Arc<HealthState> {
        Arc::new(HealthState {
            addr,
            target,
            connect_timeout,
            response_timeout,
            suspect: AtomicBool::new(false),
            suspect_since: Mutex::new(None),
            probe: Running::new(),
            conditioned: AtomicBool::new(false),
            condition: Mutex::new(None),
            recoveries: tokio::sync::watch::Sender::new(0),
        })
    }

    pub(crate) fn health(&self) -> Health {
        match *self.suspect_since.lock().unwrap() {
            None => Health::Healthy,
            Some(since) => Health::Suspect {
                since: since.into_std(),
            },
        }
    }

    pub(crate) fn is_suspect(&self) -> bool {
        self.suspect.load(Ordering::Relaxed)
    }

    /// A request timed out or was refused (`Why::Failed`), or is overdue
    /// (`Why::Overdue`: far slower than the other nodes' answers): the node
    /// becomes suspect, and the first such failure starts its probe. Only a
    /// failure is logged at `warn`: an overdue node may just be slow, and
    /// any answer ends its suspicion.
    pub(crate) fn suspect(self: &Arc<Self>, why: Why) {
        {
            let mut since = self.suspect_since.lock().unwrap();
            if since.is_some() {
                return;
            }
            *since = Some(Instant::now());
            self.suspect.store(true, Ordering::Relaxed);
        }
        crate::metrics::health_changed(&self.addr, true);
        match why {
            Why::Failed => {
                tracing::warn!(node = %self.addr, "node suspect: a request timed out or was refused; requests to it fail at once until it answers a probe")
            }
            Why::Overdue => {
                tracing::debug!(node = %self.addr, "node suspect: a request is overdue; requests to it fail at once until it answers")
            }
        }
        if tokio::runtime::Handle::try_current().is_err() {
            // No runtime to probe from: the next request tries the node.
            self.recovered();
            return;
        }
        self.keep_probed();
    }

    /// Starts a probe unless one runs: called on every request refused as
    /// suspect, so a probe whose runtime shut down or stalled (a static
    /// `Node` shared by several runtimes) is replaced by one on the
    /// caller's. (A stalled one that runs again later ends as any probe.)
    pub(crate) fn keep_probed(self: &Arc<Self>) {
        // A probe goes round at least once per pause and ping.
        let stall = 2 * MAX_PROBE_INTERVAL + self.connect_timeout + self.response_timeout;
        if let Some((alive, runtime)) = self.probe.start(stall) {
            runtime.spawn(Probe(Arc::downgrade(self)).run(alive));
        }
    }

    /// The server refused a request with `code`, a condition that passes
    /// (not [`crate::Error::is_permanent`]): logged at `warn` when it
    /// begins or changes, not per request. The node is not suspect: it
    /// answers, and the answer is its callers'.
    pub(crate) fn refusing(&self, code: &'static str) {
        let mut condition = self.condition.lock().unwrap();
        let now = Instant::now();
        if let Some(known) = condition.as_mut()
            && known.code == code
        {
            known.last_refusal = now;
            return;
        }
        *condition = Some(Condition {
            code,
            last_refusal: now,
        });
        self.conditioned.store(true, Ordering::Relaxed);
        tracing::warn!(node = %self.addr, condition = code, "the node refuses requests for now; waits go on through it");
    }

    /// A request got a reply that is no refusal. The condition is over
    /// once no request met it for [`CONDITION_QUIET`]: a server out of
    /// memory still answers what does not grow it (renewals, attempts on
    /// held locks), which must not end it at every such answer.
    pub(crate) fn accepting(&self) {
        if !self.conditioned.load(Ordering::Relaxed) {
            return;
        }
        let over = {
            let mut condition = self.condition.lock().unwrap();
            match condition.as_ref() {
                Some(known) if known.last_refusal.elapsed() >= CONDITION_QUIET => {
                    self.conditioned.store(false, Ordering::Relaxed);
                    condition.take()
                }
                _ => None,
            }
        };
        if let Some(over) = over {
            tracing::info!(node = %self.addr, condition = over.code, "the node accepts requests again");
        }
    }

    /// Follows the node's recoveries: changes whenever it stops being
    /// suspect.
    pub(crate) fn recoveries(&self) -> tokio::sync::watch::Receiver<u64> {
        self.recoveries.subscribe()
    }

    /// A request got an answer, or a probe did: the node is healthy.
    pub(crate) fn recovered(&self) {
        if !self.is_suspect() {
            return;
        }
        let since = {
            let mut since = self.suspect_since.lock().unwrap();
            self.suspect.store(false, Ordering::Relaxed);
            since.take()
        };
        if let Some(since) = since {
            self.recoveries.send_modify(|n| *n += 1);
            crate::metrics::health_changed(&self.addr, false);
            tracing::info!(node = %self.addr, suspect_for_ms = since.elapsed().as_millis() as u64, "node answers again");
        }
    }
}

/// One node's probe. Holds the state weakly: it ends with its node.
struct Probe(Weak<HealthState>);

impl Probe {
    /// Probes until the node answers or is gone; `alive` tells the state
    /// that a probe runs.
    async fn run(self, alive: Alive) {
        let mut pause = FIRST_PROBE;
        // A Sentinel node's new primary is probed at once: the suspicion
        // was about the former one.
        let mut switches = match self.0.upgrade() {
            Some(state) => state.target.switches(),
            None => return,
        };
        loop {
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = super::target::next_switch(&mut switches) => {}
            }
            let Some(state) = self.0.upgrade() else {
                return;
            };
            if !state.is_suspect() || !state.probe.beat(&alive) {
                return;
            }
            if ping(&state).await {
                state.recovered();
                return;
            }
            pause = (pause * 2).min(MAX_PROBE_INTERVAL);
        }
    }
}

/// A PING on a fresh connection, within the node's connect and response
/// timeouts: a pooled connection may be the one stuck behind a frozen
/// request. Any answer counts, a refusal too (a wrong password, `LOADING`):
/// the node is reachable, and its callers should get that answer, which
/// may end their wait (a permanent refusal), rather than `Suspect`, which
/// never does.
async fn ping(state: &HealthState) -> bool {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(state.connect_timeout))
        .set_response_timeout(Some(state.response_timeout));
    let attempt = async {
        let (client, _) = state.target.resolve().await?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("PING")
            .query_async::<redis::Value>(&mut conn)
            .await
    };
    let bound = state.connect_timeout + state.response_timeout;
    match tokio::time::timeout(bound, attempt).await {
        Ok(Ok(_)) => true,
        Ok(Err(err)) => !crate::Error::from_redis(&state.addr, err).is_node_unavailable(),
        Err(_) => false,
    }
}
