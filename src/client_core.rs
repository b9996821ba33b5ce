//! What a lock needs from the client that made it: the client's id (the
//! first half of every hash field it writes) and its watchdogs. Locks hold
//! this, not the [`Client`](crate::Client) facade, so the facade can make
//! locks without the locks knowing the facade.

use std::sync::Arc;
use std::time::Duration;

use crate::fencing::FenceBook;
use crate::watchdog::Watchdogs;

/// The shared state of one client.
pub(crate) struct ClientCore {
    /// The client's uuid.
    pub(crate) id: String,
    /// One renewal timer per node.
    pub(crate) watchdogs: Watchdogs,
    /// How long a lock may be held by renewal alone, unless a lock says
    /// otherwise; `None`: for as long as its guard lives.
    pub(crate) max_hold: Option<Duration>,
    /// How long a guard may be held before the crate warns, unless a lock
    /// says otherwise; `None`: never.
    pub(crate) hold_warning: Option<Duration>,
    /// What the client knows of the fencing counters of its multi-node
    /// locks.
    pub(crate) fencing: Arc<FenceBook>,
}

impl ClientCore {
    pub(crate) fn new(
        id: String,
        watchdog_timeout: Duration,
        max_hold: Option<Duration>,
        hold_warning: Option<Duration>,
        fencing_counter_expiry: Option<Duration>,
    ) -> Arc<ClientCore> {
        Arc::new(ClientCore {
            id,
            watchdogs: Watchdogs::new(watchdog_timeout),
            max_hold,
            hold_warning,
            fencing: Arc::new(FenceBook::new(fencing_counter_expiry)),
        })
    }

    /// The lease of holds taken without one, renewed while held.
    pub(crate) fn watchdog_timeout(&self) -> Duration {
        self.watchdogs.timeout()
    }
}
