//! One node's shared subscription: a single RESP3 connection multiplexing
//! every channel this process waits on at that node.
//!
//! Waiters register a channel and get a [`Subscription`]; a small actor task
//! is the only one that sends SUBSCRIBE / UNSUBSCRIBE, so those commands never
//! overtake each other, and it reconciles what waiters want with what the
//! server has. Messages wake one waiter of the channel (the lock was released:
//! one of them can take it). A disconnection wakes every waiter (messages may
//! have been lost) and makes the actor subscribe again once the server is
//! back; the confirmation wakes them once more, since a release published
//! while the connection was down reached nobody.
//!
//! While it has channels, the actor PINGs the connection when it has been
//! quiet for the node's keepalive interval: the traffic keeps a NAT or load balancer from
//! dropping it as idle, and a PING without an answer (the connection was
//! dropped silently, or the route black-holed) makes the actor rebuild it.
//!
//! The attempt a waiter owes after subscribing is shared by the waiters one
//! confirmation covers: see [`first_check`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::{AsyncPushSender, ConnectionManager, ConnectionManagerConfig, SendError};
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{Notify, mpsc};

mod first_check;
mod link;

pub(crate) use first_check::AfterSubscribing;
use first_check::FirstCheck;
use link::Link;

/// Consecutive subscribe timeouts after which the connection is rebuilt: a
/// timeout alone does not make redis-rs reconnect a half-open connection.
const REBUILD_AFTER_TIMEOUTS: u32 = 2;
const MAX_BACKOFF: Duration = Duration::from_secs(1);

pub(crate) struct Subscriber {
    shared: Arc<Shared>,
}

struct Shared {
    node: String,
    /// Where the subscription connection goes; a Sentinel node's moves.
    target: crate::node::target::Target,
    connect_timeout: Duration,
    response_timeout: Duration,
    keepalive: Duration,
    channels: Mutex<HashMap<String, Channel>>,
    /// Started on first use, so a Node can be built outside a runtime.
    actor: Mutex<Option<mpsc::UnboundedSender<Reconcile>>>,
}

struct Channel {
    /// Woken once per message, and for everyone on a disconnection.
    wake: Arc<Notify>,
    /// Signalled when the server confirmed the subscription.
    ready: Arc<Notify>,
    waiters: usize,
    subscribed: bool,
    /// Confirmations so far: a first check belongs to the one it followed.
    confirmations: u64,
    first_check: FirstCheck,
    /// Signalled when the first check in flight ends (or a new confirmation
    /// starts over).
    checked: Arc<Notify>,
}

impl Channel {
    fn new() -> Self {
        Channel {
            wake: Arc::new(Notify::new()),
            ready: Arc::new(Notify::new()),
            waiters: 0,
            subscribed: false,
            confirmations: 0,
            first_check: FirstCheck::Open,
            checked: Arc::new(Notify::new()),
        }
    }

    /// The server confirmed the subscription.
    fn confirm(&mut self) {
        self.subscribed = true;
        self.confirmations += 1;
        // A check in flight began before this confirmation: it covers
        // nobody now; start over.
        self.first_check = FirstCheck::Open;
        self.checked.notify_waiters();
    }
}

enum Reconcile {
    One(String),
    All,
}

/// A registered waiter on one channel. Dropping it unregisters; the last
/// waiter of a channel leaving unsubscribes.
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    channel: String,
    wake: Arc<Notify>,
}

impl Subscription {
    /// The notification a waiter selects on. Create (and `enable`) it before
    /// the acquire attempt, so no release can slip between attempt and wait.
    pub(crate) fn wake(&self) -> &Arc<Notify> {
        &self.wake
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let last = {
            let mut channels = self.shared.channels.lock().unwrap();
            match channels.get_mut(&self.channel) {
                Some(ch) => {
                    ch.waiters -= 1;
                    ch.waiters == 0
                }
                None => false,
            }
        };
        if last {
            self.shared
                .send(Reconcile::One(std::mem::take(&mut self.channel)));
        }
    }
}

impl Subscriber {
    pub(crate) fn new(
        node: String,
        target: crate::node::target::Target,
        connect_timeout: Duration,
        response_timeout: Duration,
        keepalive: Duration,
    ) -> Self {
        Subscriber {
            shared: Arc::new(Shared {
                node,
                target,
                connect_timeout,
                response_timeout,
                keepalive,
                channels: Mutex::new(HashMap::new()),
                actor: Mutex::new(None),
            }),
        }
    }

    /// Registers a waiter on `channel` and waits (at most the response
    /// timeout, and at most `max_wait`: with zero, not at all) until the server confirmed the subscription. When it cannot
    /// confirm (node down), the waiter still gets a subscription: its waits
    /// are bounded by the lock's TTL, so a lost message costs time, not a hang.
    ///
    /// Cancel safe: dropping the future unregisters the waiter.
    pub(crate) async fn subscribe(&self, channel: &str, max_wait: Duration) -> Subscription {
        let (wake, ready) = {
            let mut channels = self.shared.channels.lock().unwrap();
            let ch = channels
                .entry(channel.to_owned())
                .or_insert_with(Channel::new);
            ch.waiters += 1;
            let ready = (!ch.subscribed).then(|| ch.ready.clone());
            (ch.wake.clone(), ready)
        };
        // Built now so that Drop unregisters if this future is cancelled below.
        let subscription = Subscription {
            shared: self.shared.clone(),
            channel: channel.to_owned(),
            wake,
        };
        if let Some(ready) = ready {
            let confirmed = ready.notified();
            tokio::pin!(confirmed);
            confirmed.as_mut().enable();
            // Re-check after enabling: the actor may have confirmed in between.
            if !self.shared.is_subscribed(channel) {
                self.shared.send(Reconcile::One(channel.to_owned()));
                let patience = self.shared.response_timeout.min(max_wait);
                if !patience.is_zero() && tokio::time::timeout(patience, confirmed).await.is_err() {
                    tracing::debug!(node = %self.shared.node, channel, "subscription not confirmed in time; waits fall back to the lock's TTL");
                }
            }
        }
        subscription
    }
}

impl Subscriber {
    /// Registers a waiter on `channel` if the server already confirmed a
    /// subscription to it here (other waiters of this process are on it):
    /// no I/O and no wait. `None` when the channel is not subscribed yet.
    pub(crate) fn join(&self, channel: &str) -> Option<Subscription> {
        let wake = {
            let mut channels = self.shared.channels.lock().unwrap();
            let ch = channels.get_mut(channel).filter(|ch| ch.subscribed)?;
            ch.waiters += 1;
            ch.wake.clone()
        };
        Some(Subscription {
            shared: self.shared.clone(),
            channel: channel.to_owned(),
            wake,
        })
    }
}

impl Shared {
    fn is_subscribed(&self, channel: &str) -> bool {
        self.channels
            .lock()
            .unwrap()
            .get(channel)
            .is_some_and(|c| c.subscribed)
    }

    fn send(self: &Arc<Self>, mut msg: Reconcile) {
        let mut actor = self.actor.lock().unwrap();
        let mut ended = false;
        if let Some(tx) = actor.as_ref() {
            match tx.send(msg) {
                Ok(()) => return,
                Err(returned) => {
                    msg = returned.0;
                    ended = true;
                }
            }
        }
        // No actor yet, or it ended (its runtime shut down, taking its
        // connection along): start one, if there is a runtime.
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(msg);
        if ended {
            // The old actor's subscriptions went with its connection: as
            // after a disconnection, told straight to the new actor (never
            // through `send` again, which would recurse if this actor died
            // at once too, as it does while the runtime shuts down).
            self.forget_subscriptions();
            let _ = tx.send(Reconcile::All);
        }
        *actor = Some(tx);
        handle.spawn(
            Actor {
                shared: Arc::downgrade(self),
                conn: None,
                epoch: 0,
                timeouts_in_a_row: 0,
            }
            .run(rx),
        );
    }

    /// Every channel counts as unsubscribed, and its waiters wake to check
    /// again: messages may have been lost.
    fn forget_subscriptions(&self) {
        let mut channels = self.channels.lock().unwrap();
        for ch in channels.values_mut() {
            ch.subscribed = false;
            ch.wake.notify_waiters();
            ch.checked.notify_waiters();
        }
    }

    /// The connection dropped: the server forgot our subscriptions and any
    /// message published meanwhile is lost. Wake everyone to re-check.
    fn on_disconnect(self: &Arc<Self>) {
        self.forget_subscriptions();
        self.send(Reconcile::All);
    }

    /// The server ended a shard subscription: ours (the channel's last
    /// waiter left), or, when the channel still has waiters, the shard's
    /// (a failover demoted it, or its slot moved). Then the waiters re-check
    /// (a release may have gone unheard) and the channel is subscribed
    /// again, on the shard that serves it now: redis-rs forgets it.
    fn on_shard_unsubscribed(self: &Arc<Self>, channel: &[u8]) {
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        {
            let mut channels = self.channels.lock().unwrap();
            let Some(ch) = channels.get_mut(channel).filter(|ch| ch.waiters > 0) else {
                return;
            };
            ch.subscribed = false;
            ch.wake.notify_waiters();
            ch.checked.notify_waiters();
        }
        tracing::debug!(node = %self.node, channel, "the shard ended a subscription; subscribing again");
        self.target.maybe_moved();
        self.send(Reconcile::One(channel.to_owned()));
    }

    /// An unlock message: wakes one waiter, or every waiter for a
    /// read-write lock's write release (`1`: readers may all enter).
    fn on_message(&self, channel: &[u8], payload: Option<&[u8]>) {
        // Static, for timelines (see `Conn::run`): free unless traced.
        tracing::trace!(name: "multilock::unlock_message", "unlock message received");
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        if let Some(ch) = self.channels.lock().unwrap().get(channel) {
            if payload == Some(b"1") {
                ch.wake.notify_waiters();
            } else {
                ch.wake.notify_one();
            }
        }
    }
}

/// Routes pushes of the subscription connection. Runs inside the connection's
/// driver, so it only takes a short std lock and never blocks.
struct PushRouter(Weak<Shared>);

impl AsyncPushSender for PushRouter {
    fn send(&self, info: PushInfo) -> Result<(), SendError> {
        let Some(shared) = self.0.upgrade() else {
            return Err(SendError);
        };
        match info.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(Value::BulkString(channel)) = info.data.first() {
                    let payload = match info.data.get(1) {
                        Some(Value::BulkString(payload)) => Some(payload.as_slice()),
                        _ => None,
                    };
                    shared.on_message(channel, payload);
                }
            }
            PushKind::Disconnection => {
                shared.on_disconnect();
                shared.target.maybe_moved();
            }
            PushKind::SUnsubscribe => {
                if let Some(Value::BulkString(channel)) = info.data.first() {
                    shared.on_shard_unsubscribed(channel);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// The only sender of SUBSCRIBE / UNSUBSCRIBE for one node. Ends when the node
/// is dropped (its sender closes).
struct Actor {
    shared: Weak<Shared>,
    conn: Option<Link>,
    /// The node target's epoch when `conn` was made.
    epoch: u64,
    timeouts_in_a_row: u32,
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Reconcile>) {
        let mut pending: Vec<String> = Vec::new();
        let mut backoff = Duration::from_millis(50);
        let (keepalive, mut switches) = match self.shared.upgrade() {
            Some(shared) => (shared.keepalive, shared.target.switches()),
            None => return,
        };
        loop {
            if pending.is_empty() {
                tokio::select! {
                    msg = rx.recv() => match msg {
                        Some(msg) => self.collect(msg, &mut pending),
                        None => return,
                    },
                    () = crate::node::target::next_switch(&mut switches) => {
                        let Some(shared) = self.shared.upgrade() else {
                            return;
                        };
                        self.move_if_stale(&shared);
                        continue;
                    }
                    _ = tokio::time::sleep(keepalive) => {
                        let Some(shared) = self.shared.upgrade() else {
                            return;
                        };
                        self.keep_alive(&shared).await;
                        continue;
                    }
                }
            }
            while let Ok(msg) = rx.try_recv() {
                self.collect(msg, &mut pending);
            }
            pending.sort_unstable();
            pending.dedup();

            let mut failed = Vec::new();
            for channel in pending.drain(..) {
                let Some(shared) = self.shared.upgrade() else {
                    return;
                };
                if !self.reconcile(&shared, &channel).await {
                    failed.push(channel);
                }
            }
            if failed.is_empty() {
                backoff = Duration::from_millis(50);
            } else {
                // The node is unreachable: retry later; waiters are bounded
                // by their lock's TTL meanwhile.
                pending = failed;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// A PING on a quiet connection that has subscriptions: keeps it from
    /// being dropped as idle, and finds out when it was.
    async fn keep_alive(&mut self, shared: &Arc<Shared>) {
        if !shared
            .channels
            .lock()
            .unwrap()
            .values()
            .any(|c| c.subscribed)
        {
            return;
        }
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        match tokio::time::timeout(shared.response_timeout, conn.ping()).await {
            Ok(Ok(_)) => {}
            outcome => {
                tracing::debug!(node = %shared.node, ?outcome, "subscription connection did not answer a PING; rebuilding it");
                self.rebuild(shared);
            }
        }
    }

    /// Drops the connection; the next reconcile makes a new one. It has no
    /// subscriptions and messages may have been missed: as after a
    /// disconnection.
    fn rebuild(&mut self, shared: &Arc<Shared>) {
        self.conn = None;
        self.timeouts_in_a_row = 0;
        shared.on_disconnect();
    }

    fn collect(&self, msg: Reconcile, pending: &mut Vec<String>) {
        match msg {
            Reconcile::One(channel) => pending.push(channel),
            Reconcile::All => {
                if let Some(shared) = self.shared.upgrade() {
                    pending.extend(shared.channels.lock().unwrap().keys().cloned());
                }
            }
        }
    }

    /// Brings one channel to the wanted state. False when the node failed.
    async fn reconcile(&mut self, shared: &Arc<Shared>, channel: &str) -> bool {
        let (want, have) = match shared.channels.lock().unwrap().get_mut(channel) {
            Some(ch) => {
                let state = (ch.waiters > 0, ch.subscribed);
                // Leaving: from now on a newcomer must wait for a fresh
                // confirmation rather than trust a subscription on its way out.
                if state == (false, true) {
                    ch.subscribed = false;
                }
                state
            }
            None => return true,
        };
        if want == have {
            if !want {
                Self::forget_if_unused(shared, channel);
            }
            return true;
        }
        let Some(conn) = self.connection(shared).await else {
            return false;
        };
        let result = if want {
            tokio::time::timeout(shared.response_timeout, conn.subscribe(channel)).await
        } else {
            tokio::time::timeout(shared.response_timeout, conn.unsubscribe(channel)).await
        };
        match result {
            Ok(Ok(())) => {
                self.timeouts_in_a_row = 0;
                let mut channels = shared.channels.lock().unwrap();
                if let Some(ch) = channels.get_mut(channel) {
                    if want {
                        ch.confirm();
                        ch.ready.notify_waiters();
                        // Waiters already waiting were subscribed before and
                        // lost it: a release meanwhile reached nobody.
                        ch.wake.notify_waiters();
                    } else if ch.waiters == 0 {
                        channels.remove(channel);
                    } else {
                        // A waiter arrived while we unsubscribed: go again.
                        drop(channels);
                        shared.send(Reconcile::One(channel.to_owned()));
                    }
                }
                true
            }
            Ok(Err(err)) => {
                tracing::debug!(node = %shared.node, channel, error = %err, "subscription change failed");
                if !want {
                    // The server drops subscriptions with the connection anyway.
                    Self::forget_if_unused(shared, channel);
                    return true;
                }
                false
            }
            Err(_elapsed) => {
                self.timeouts_in_a_row += 1;
                if self.timeouts_in_a_row >= REBUILD_AFTER_TIMEOUTS {
                    tracing::debug!(node = %shared.node, "subscription connection unresponsive; rebuilding it");
                    self.rebuild(shared);
                }
                if !want {
                    Self::forget_if_unused(shared, channel);
                }
                !want
            }
        }
    }

    fn forget_if_unused(shared: &Shared, channel: &str) {
        let mut channels = shared.channels.lock().unwrap();
        if channels.get(channel).is_some_and(|c| c.waiters == 0) {
            channels.remove(channel);
        }
    }

    /// A Sentinel node's primary moved: the subscriptions move with it,
    /// as after a disconnection (every waiter re-checks).
    fn move_if_stale(&mut self, shared: &Arc<Shared>) {
        if self.conn.is_some() && !shared.target.is_current(self.epoch) {
            tracing::debug!(node = %shared.node, "the primary moved; the subscription follows");
            self.rebuild(shared);
        }
    }

    async fn connection(&mut self, shared: &Arc<Shared>) -> Option<&mut Link> {
        self.move_if_stale(shared);
        if self.conn.is_none() {
            #[cfg(feature = "cluster")]
            if let crate::node::target::Target::Cluster(map) = &shared.target {
                let epoch = map.epoch();
                let push = PushRouter(Arc::downgrade(shared));
                let (connect, respond) = (shared.connect_timeout, shared.response_timeout);
                match link::to_cluster(map, push, connect, respond).await {
                    Ok(link) => {
                        self.conn = Some(link);
                        self.epoch = epoch;
                    }
                    Err(err) => {
                        tracing::debug!(node = %shared.node, error = %err, "no cluster connection for the subscription yet");
                        return None;
                    }
                }
                return self.conn.as_mut();
            }
            let (client, epoch) = match shared.target.resolve().await {
                Ok(resolved) => resolved,
                Err(err) => {
                    tracing::debug!(node = %shared.node, error = %err, "no server for the subscription connection yet");
                    return None;
                }
            };
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(shared.connect_timeout))
                .set_response_timeout(Some(shared.response_timeout))
                // The stock limit (6 retries, ~10 s) gives up for good.
                .set_number_of_retries(usize::MAX)
                .set_max_delay(MAX_BACKOFF)
                .set_push_sender(PushRouter(Arc::downgrade(shared)));
            match ConnectionManager::new_lazy_with_config(client, config) {
                Ok(conn) => {
                    self.conn = Some(Link::Server(conn));
                    self.epoch = epoch;
                }
                Err(err) => {
                    tracing::warn!(node = %shared.node, error = %err, "cannot set up the subscription connection");
                    return None;
                }
            }
        }
        self.conn.as_mut()
    }
}
