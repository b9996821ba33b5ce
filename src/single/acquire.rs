//! How a single-node acquire runs: one attempt (a script call that finishes
//! even if its caller goes away), the wait between attempts (pub/sub
//! wake-ups, bounded by the holder's TTL), the replica-sync check after a
//! grant, and the rollback of an attempt nobody will hold.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tracing::Instrument;

use super::fair::QueueSeat;
use super::{HeldPart, Lock};
use crate::error::{Error, Result, Unavailable};
use crate::finish_on_drop::FinishOnDrop;
use crate::guard::Guard;
use crate::metrics;
use crate::node::{AfterSubscribing as Next, Conn};
use crate::owner::Owner;
use crate::protocol::{self, Acquired};
use crate::timing;
use crate::watchdog::{GrantRecord, PendingRollback};

/// Longest single wait when the lock's TTL is unknown (a key without expiry):
/// bounds the cost of a lost unlock message.
const MAX_BLIND_WAIT: Duration = Duration::from_secs(1);

/// One acquire attempt on one node.
pub(crate) enum Attempt {
    Granted(HeldPart),
    /// Held by someone else, with the key's remaining TTL when it has one.
    Taken(Option<Duration>),
    /// Granted, but its reply was read only after the TTL it set could have
    /// run out: not a hold (it is rolled back). Worth trying again at once.
    Expired,
}

/// How long a waiting acquire pauses before asking again after its node
/// failed in passing.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A waiting acquire's attempt that its node failed in passing (see
/// [`failed_in_passing`]): part of the wait, as if the lock were taken,
/// asked again after a pause. A request whose outcome is unknown was
/// settled already (rolled back exactly, in the background), so nothing is
/// held or counted twice. `None` when the wait would end during the
/// pause. An attempt that is not `patient` (`try_lock`) reports it.
fn retry_in_passing(
    attempt: Result<Option<Attempt>>,
    deadline: Option<Instant>,
    patient: bool,
) -> Result<Option<Attempt>> {
    match attempt {
        Err(err) if patient && failed_in_passing(&err) => {
            if deadline.is_some_and(|d| Instant::now() + RETRY_PAUSE >= d) {
                tracing::debug!(error = %err, "the node failed in passing as the wait ended");
                return Ok(None);
            }
            // The node logs each change of its health once.
            tracing::debug!(error = %err, "the node failed in passing: part of the wait");
            Ok(Some(Attempt::Taken(Some(RETRY_PAUSE))))
        }
        other => other,
    }
}

/// The node unavailable (refused, lost, timed out, suspect, no primary, no
/// shard) or an answer that is not permanent (`LOADING`, `READONLY`,
/// `BUSY`, ...). A grant the replicas did not acknowledge
/// ([`Error::ReplicaSync`]) is the node's answer: it ends the wait.
fn failed_in_passing(err: &Error) -> bool {
    match err {
        Error::NodeUnavailable { .. } => true,
        Error::Redis { .. } => !err.is_permanent(),
        _ => false,
    }
}

impl Lock {
    /// Acquires within `wait` (`None`: until granted): the work behind
    /// every public acquire method.
    pub(super) async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<Guard>> {
        let resolved = self.resolve_owner();
        let owner = resolved.owner.clone();
        // The clock is read for the elapsed time only when something
        // observes it (a deadline, metrics, a debug subscriber): this runs
        // for every acquire.
        let observed = cfg!(feature = "metrics") || tracing::enabled!(tracing::Level::DEBUG);
        let started = (observed || wait.is_some()).then(Instant::now);
        let deadline = wait.zip(started).map(|(w, s)| timing::deadline(s, w));
        let span = tracing::debug_span!("acquire", lock = %self.inner.keys.name, node = %self.inner.node.addr(), owner = %owner);
        let this = self.for_wait(wait);
        async move {
            // A re-entry of a `run_locked` scope waits for its siblings'.
            let Some(turn) = resolved.take_turn(deadline).await else {
                tracing::debug!("not acquired within the wait: a sibling re-entry held the turn");
                return Ok(None);
            };
            let mut first_taken = None;
            let mut seat = QueueSeat::new(&this, &owner);
            let outcome = this
                .wait_for_grant(&owner, lease, deadline, &mut first_taken, &mut seat)
                .await;
            match &outcome {
                Ok(Some(_)) => QueueSeat::granted(&mut seat),
                _ => QueueSeat::give_up(&mut seat).await,
            }
            let elapsed = started.map(|s| s.elapsed()).unwrap_or_default();
            let elapsed_us = elapsed.as_micros() as u64;
            match &outcome {
                Ok(Some(_)) => {
                    tracing::debug!(elapsed_us, "acquired");
                    let waited = first_taken.map(|at: Instant| at.elapsed());
                    self.inner.metrics.acquired(elapsed, waited);
                }
                Ok(None) => tracing::debug!(elapsed_us, "not acquired within the wait"),
                Err(err) => tracing::debug!(elapsed_us, error = %err, "acquire failed"),
            }
            outcome.map(|part| part.map(|part| Guard::single(owner, part).in_turn(turn)))
        }
        .instrument(span)
        .await
    }

    /// Attempt; subscribe; then attempt again after every wake-up (unlock
    /// message, or the holder's TTL) until granted or past the deadline.
    /// When other waiters of this process already hold a confirmed
    /// subscription to the lock's channel, the waiter joins it first and
    /// its first attempt is already covered: no attempt is spent before
    /// subscribing (a contended acquisition costs one failed attempt, not
    /// two). Waiters that subscribe together share the attempt after the
    /// confirmation: one of them sends it, and if it finds the lock held the
    /// others park without trying. With a deadline, every attempt ends by
    /// it: a node that does not answer cannot stretch the wait by its
    /// connect and reply timeouts. An attempt cut off by the deadline is
    /// "not acquired within the wait", never a node failure: only the
    /// node's own timeouts judge the node (the attempt goes on in the
    /// background, and a reply that never comes marks the node suspect
    /// there), so a caller's short wait on a busy machine cannot make a
    /// healthy node look down.
    /// `first_taken`: set when an attempt first finds the lock held by
    /// someone else (the wait that follows is measured from there).
    /// `seat`: a fair lock's place in the queue, told when a request is in
    /// flight.
    async fn wait_for_grant(
        &self,
        owner: &Owner,
        lease: Option<Duration>,
        deadline: Option<Instant>,
        first_taken: &mut Option<Instant>,
        seat: &mut Option<QueueSeat>,
    ) -> Result<Option<HeldPart>> {
        let channel = &*self.wake_channel(owner);
        // The first attempt of a zero wait (`try_lock`) gets the node's own
        // timeouts: a deadline already past would cut it before it is sent.
        let first_bound = deadline.filter(|d| *d > Instant::now());
        // A wait (not `try_lock`) goes on through the node's failures.
        let patient = first_bound.is_some() || deadline.is_none();
        // `first`: what the loop's first pass does.
        let (subscription, mut bound, mut first) = match self.inner.node.join_subscription(channel)
        {
            Some(subscription) => (subscription, first_bound, Next::Attempt(None)),
            None => {
                QueueSeat::sending(seat);
                let attempt = self.attempt_by(owner, lease, first_bound).await;
                QueueSeat::returned(seat);
                match retry_in_passing(attempt, deadline, patient)? {
                    Some(Attempt::Granted(part)) => return Ok(Some(part)),
                    Some(Attempt::Taken(_)) => *first_taken = Some(Instant::now()),
                    Some(Attempt::Expired) => {}
                    None => return Ok(None),
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(None);
                }
                // Subscribe before the next attempt: a release between that
                // attempt and the wait below is then a message we receive.
                let patience = deadline.map_or(Duration::MAX, |d| {
                    d.saturating_duration_since(Instant::now())
                });
                let subscription = self.inner.node.subscribe(channel, patience).await;
                // Waiters that subscribed together share that attempt.
                let first = subscription.first_check(deadline).await;
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(None);
                }
                (subscription, deadline, first)
            }
        };
        loop {
            let woken = subscription.wake().notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let ttl = match std::mem::replace(&mut first, Next::Attempt(None)) {
                Next::Park(ttl) => ttl,
                Next::Attempt(duty) => {
                    QueueSeat::sending(seat);
                    let attempt = self.attempt_by(owner, lease, bound).await;
                    QueueSeat::returned(seat);
                    let ttl = match retry_in_passing(attempt, deadline, patient)? {
                        // A grant hands the check on (the duty drops): the
                        // next waiter's attempt tells the others, as one of
                        // them may share this owner and re-enter.
                        Some(Attempt::Granted(part)) => return Ok(Some(part)),
                        Some(Attempt::Taken(ttl)) => {
                            first_taken.get_or_insert_with(Instant::now);
                            if let Some(duty) = duty {
                                duty.found_held(ttl);
                            }
                            ttl
                        }
                        Some(Attempt::Expired) => Some(Duration::ZERO),
                        // The wait ran out with this attempt in flight.
                        None => return Ok(None),
                    };
                    bound = deadline;
                    ttl
                }
            };
            let mut nap = ttl.unwrap_or(MAX_BLIND_WAIT);
            if let Some(deadline) = deadline {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(None);
                }
                nap = nap.min(deadline - now);
            }
            tokio::select! {
                _ = &mut woken => {}
                _ = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// [`Lock::attempt`], cut off at `deadline` if it comes first (`None`):
    /// the attempt then finishes, and is undone, in the background.
    async fn attempt_by(
        &self,
        owner: &Owner,
        lease: Option<Duration>,
        deadline: Option<Instant>,
    ) -> Result<Option<Attempt>> {
        let Some(deadline) = deadline else {
            return self.attempt(owner, lease).await.map(Some);
        };
        match tokio::time::timeout_at(deadline, self.attempt(owner, lease)).await {
            Ok(attempt) => attempt.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// One acquire attempt. If the caller goes away while a request is in
    /// flight, the request still completes in the background, and whatever
    /// it did is undone there ([`SentAcquire::settle`]); if its outcome is
    /// unknown (timeout, broken connection), it is rolled back, exactly:
    /// only if it was applied.
    ///
    /// A grant that a rollback of this owner's earlier request may have
    /// undone (it was in flight when that rollback counted the holds) is
    /// rolled back and asked for once more at once: the new request waits
    /// until those rollbacks are answered, so its grant is trusted. A caller
    /// never sees it as "taken".
    pub(crate) async fn attempt(&self, owner: &Owner, lease: Option<Duration>) -> Result<Attempt> {
        match self.request(owner, lease).await? {
            Some(attempt) => Ok(attempt),
            None => Ok(self
                .request(owner, lease)
                .await?
                .unwrap_or(Attempt::Expired)),
        }
    }

    /// One acquire request; `None`: granted, but not trusted (see
    /// [`Lock::attempt`]), and rolled back.
    async fn request(&self, owner: &Owner, lease: Option<Duration>) -> Result<Option<Attempt>> {
        let field = self.field(owner);
        self.rollbacks_answered(&field).await?;
        if let Some(reads) = self.upgrade_field(&field) {
            self.rollbacks_answered(reads).await?;
        }
        let hold_id = protocol::new_request_id();
        let sent_at = Instant::now();
        let request = self
            .clone()
            .send_acquire(field.clone(), hold_id.clone(), lease, sent_at);
        let sent = FinishOnDrop::new(request, |sent| sent.settle().boxed()).await;
        let may_hold = sent.may_hold();
        let asked = self.lease(lease);
        let outcome = match &sent.reply {
            Ok(Acquired::Granted(grant))
                if timing::validity(grant.ttl(asked), sent.replied_at - sent_at).is_some() =>
            {
                Some(metrics::AttemptOutcome::Granted)
            }
            Ok(Acquired::Taken(_)) => Some(metrics::AttemptOutcome::Taken),
            Ok(Acquired::Cancelled | Acquired::UpgradeRefused) => None,
            _ => Some(metrics::AttemptOutcome::Failed),
        };
        if let Some(outcome) = outcome {
            self.inner.metrics.attempt(outcome);
        }
        match sent.reply {
            Ok(Acquired::Granted(grant))
                if timing::validity(grant.ttl(asked), sent.replied_at - sent_at).is_none() =>
            {
                // The reply came after the TTL it set could have run out (the
                // node, or this process, was stalled): the key may already
                // be someone else's. Not a grant; undone in the background.
                tracing::debug!(lock = %self.inner.keys.name, "a grant read after its TTL: not acquired");
                self.roll_back_later(sent.undo, field, hold_id, sent_at);
                Ok(Some(Attempt::Expired))
            }
            Ok(Acquired::Granted(grant)) => {
                // No await between the grant and the part: from here on,
                // dropping releases.
                let record = GrantRecord {
                    sent_at,
                    replied_at: sent.replied_at,
                    ttl: grant.ttl(asked),
                    count: grant.count,
                    reads: self.reads(),
                };
                let registration = self.inner.core.watchdogs.register_kept(
                    &self.inner.node,
                    &self.inner.keys.name,
                    &field,
                    record,
                    self.renewal(lease, sent_at),
                    &self.inner.watchdog,
                );
                let Some(registration) = registration else {
                    // A rollback of this owner's may have undone it.
                    self.roll_back_later(sent.undo, field, hold_id, sent_at);
                    return Ok(None);
                };
                Ok(Some(Attempt::Granted(HeldPart::new(
                    self.clone(),
                    field,
                    hold_id,
                    lease,
                    registration,
                    grant.token,
                ))))
            }
            Ok(Acquired::Taken(ttl)) => Ok(Some(Attempt::Taken(ttl))),
            // Only a request rolled back before it arrived is cancelled, and
            // nobody awaits those.
            Ok(Acquired::Cancelled) => Ok(Some(Attempt::Taken(None))),
            Ok(Acquired::UpgradeRefused) => Err(Error::invalid(format!(
                "the write lock of {:?} was asked for by an owner that holds its read lock: \
                 a read-write lock does not upgrade (the write would wait for the owner's own \
                 reads forever); release the reads first",
                self.inner.keys.name
            ))),
            Err(err) => {
                if may_hold {
                    self.roll_back_later(sent.undo, field, hold_id, sent_at);
                }
                Err(err)
            }
        }
    }

    /// Rolls back, in the background, a request nobody will hold. The holds
    /// on record are counted now, and the field's next request waits until
    /// the rollback is answered, so that request's grant is trusted.
    pub(super) fn roll_back_later(
        &self,
        undo: Undo,
        field: Arc<str>,
        hold_id: Arc<str>,
        sent_at: Instant,
    ) {
        let pending = self.rollback_pending(&field);
        let counted = Some(self.count_for_rollback(&field));
        tokio::spawn(undo.roll_back(self.clone(), field, hold_id, sent_at, counted, pending));
    }

    /// Holds back this field's requests on this node until the rollback (or
    /// release) about to be sent is answered (see
    /// `Watchdogs::rollback_pending`).
    pub(super) fn rollback_pending(&self, field: &Arc<str>) -> PendingRollback {
        self.inner
            .core
            .watchdogs
            .rollback_pending(&self.inner.node, &self.inner.keys.name, field)
    }

    /// Waits until no rollback of `field`'s earlier requests on this node is
    /// pending, for as long as the node's response timeout: a request sent
    /// before such a rollback is answered could be the hold it undoes. A
    /// suspect node fails at once, as the request would.
    async fn rollbacks_answered(&self, field: &str) -> Result<()> {
        let node = &self.inner.node;
        node.refuse_if_suspect().await?;
        // Nearly always: no timer to set.
        if self.inner.core.watchdogs.none_unanswered() {
            return Ok(());
        }
        let answered =
            self.inner
                .core
                .watchdogs
                .rollbacks_answered(node, &self.inner.keys.name, field);
        tokio::time::timeout(node.response_timeout(), answered)
            .await
            .map_err(|_| Error::NodeUnavailable {
                node: node.addr().to_owned(),
                reason: Unavailable::Timeout,
                source: None,
            })
    }

    /// The holds of `field` on this lock's node this client has on record,
    /// for a rollback about to be sent, recorded as such (see
    /// `Watchdogs::begin_guessing_rollback`).
    fn count_for_rollback(&self, field: &Arc<str>) -> u64 {
        self.inner.core.watchdogs.begin_guessing_rollback(
            &self.inner.node,
            &self.inner.keys.name,
            field,
        )
    }

    /// Sends the acquire script. Owns everything it needs, so it can finish
    /// on its own, and keeps its connection for a rollback.
    async fn send_acquire(
        self,
        field: Arc<str>,
        hold_id: Arc<str>,
        lease: Option<Duration>,
        sent_at: Instant,
    ) -> SentAcquire {
        let mut sent = SentAcquire {
            reply: Ok(Acquired::Taken(None)),
            replied_at: sent_at,
            undo: Undo::default(),
            lock: self,
            field,
            hold_id,
            sent_at,
        };
        // WAIT blocks its connection: take one nobody shares.
        let node = &sent.lock.inner.node;
        let checkout = match sent.lock.inner.replica_sync {
            None => node.checkout(sent.lock.lane()).await,
            Some(_) => node.checkout_exclusive(sent.lock.lane()).await,
        };
        let mut conn = match checkout {
            Ok(conn) => conn,
            Err(err) => {
                sent.reply = Err(err);
                return sent;
            }
        };
        let lock = &sent.lock;
        let lease = lock.lease(lease);
        let acquire = lock.acquire_call(&sent.field, lease, &sent.hold_id);
        sent.undo.sent = true;
        sent.reply = conn.run(&acquire).await;
        sent.replied_at = Instant::now();
        sent.undo.granted = matches!(sent.reply, Ok(Acquired::Granted(_)));
        // Boxed: only replica-synced locks take this path, and its future
        // would otherwise make every acquire's larger.
        if let (true, Some((replicas, timeout))) = (sent.undo.granted, lock.inner.replica_sync)
            && let Err(err) = Box::pin(lock.sync_replicas(
                &mut conn,
                &mut sent.undo,
                &sent.field,
                &sent.hold_id,
                replicas,
                timeout,
            ))
            .await
        {
            sent.reply = Err(err);
        }
        sent.undo.conn = Some(conn);
        sent
    }

    /// `WAIT` for the grant just made on `conn` to reach `replicas`; when it
    /// does not, release it again (same connection, so in order). If that
    /// release's outcome is unknown, the rollback settles it: the hold's
    /// latch tells whether it ran.
    async fn sync_replicas(
        &self,
        conn: &mut Conn,
        undo: &mut Undo,
        field: &str,
        hold_id: &str,
        replicas: u32,
        timeout: Duration,
    ) -> Result<()> {
        let wait = protocol::wait_for_replicas(replicas, timeout);
        let patience = timeout + self.inner.node.response_timeout();
        let acknowledged = conn.run_patiently(&wait, patience).await?;
        if acknowledged >= replicas {
            return Ok(());
        }
        let latch = self.inner.keys.unlock_latch(hold_id);
        let release = self.release_call(field, &latch, None);
        let released = self
            .traced_release(conn.run_patiently(&release, self.inner.node.response_timeout()))
            .await;
        match released {
            // Gone already (its lease ran out during the WAIT): released too.
            Ok(_) | Err(Error::NotHeld { .. }) => undo.released = true,
            Err(err) => return Err(err),
        }
        Err(Error::ReplicaSync {
            lock: self.inner.keys.name.to_string(),
            node: self.inner.node.addr().to_owned(),
            required: replicas,
            acknowledged,
        })
    }
}

/// An acquire request that was sent, with its connection and reply.
struct SentAcquire {
    lock: Lock,
    field: Arc<str>,
    hold_id: Arc<str>,
    sent_at: Instant,
    undo: Undo,
    reply: Result<Acquired>,
    replied_at: Instant,
}

/// What a rollback of an acquire needs to know and goes through.
#[derive(Default)]
pub(super) struct Undo {
    /// The acquire left this process (it may have been applied).
    pub(super) sent: bool,
    /// The acquire was granted (whatever came after it).
    pub(super) granted: bool,
    /// The grant was released again (replica sync failed).
    pub(super) released: bool,
    /// The acquire's own connection: a rollback sent on it is applied after
    /// the acquire, even when the node was paused in between.
    pub(super) conn: Option<Conn>,
}

impl SentAcquire {
    /// Whether the request may have left a hold nobody will own: granted
    /// and not released since, or sent with its outcome unknown.
    fn may_hold(&self) -> bool {
        match &self.reply {
            Ok(Acquired::Granted(_)) => true,
            Ok(_) => false,
            Err(_) if self.undo.released => false,
            Err(err) => self.undo.granted || (self.undo.sent && err.outcome_unknown()),
        }
    }

    /// Nobody takes this reply: undo whatever it may have done.
    async fn settle(self) {
        if self.may_hold() {
            let pending = self.lock.rollback_pending(&self.field);
            self.undo
                .roll_back(
                    self.lock,
                    self.field,
                    self.hold_id,
                    self.sent_at,
                    None,
                    pending,
                )
                .await;
        } else if let Ok(Acquired::Taken(_)) = self.reply {
            // A fair lock queued the waiter; nobody waits any more.
            if let Err(err) = self.lock.give_up(&self.field).await {
                tracing::debug!(lock = %self.lock.name(), error = %err, "giving up the queue failed; retrying in the background");
                self.lock.give_up_later(self.field);
            }
        }
    }
}

impl Undo {
    /// Rolls back acquire `hold_id` (see `protocol::rollback`): undone if it
    /// was applied, refused if it arrives later. Each try tells the server
    /// the holds of the field this client has on record (a fresh hold is
    /// known by the count). Tried on the acquire's own connection first,
    /// then on fresh ones with backoff, until the rollback window ends (a
    /// re-entry's latch expires then): after that the server can no longer
    /// tell, and the grant, if there was one, ends with its lease.
    ///
    /// `counted`: the first try's count, taken when the rollback was decided;
    /// `None`: taken when the first try is sent. `pending` holds the field's
    /// next requests back until a try is answered (or the rollback gives
    /// up): the first try applied decides, and its count must not miss a
    /// hold granted before it.
    async fn roll_back(
        self,
        lock: Lock,
        field: Arc<str>,
        hold_id: Arc<str>,
        sent_at: Instant,
        mut counted: Option<u64>,
        pending: PendingRollback,
    ) {
        let _answered_on_return = pending;
        let give_up_at = sent_at + timing::ROLLBACK_WINDOW;
        let node = lock.node().clone();
        let patience = node.response_timeout();
        let mut conn = self.conn;
        // A failover, a slot changing hands or the node answering again
        // ends the pause: later requests of this owner wait for the
        // rollback.
        let mut pause = node.retry_pause(lock.lane());
        loop {
            // Counted afresh for every later try: holds taken meanwhile count.
            let known_holds = counted
                .take()
                .unwrap_or_else(|| lock.count_for_rollback(&field));
            let rollback = lock.rollback_call(&field, &hold_id, known_holds);
            let attempt = match conn.take() {
                Some(mut conn) => conn.run_patiently(&rollback, patience).await,
                None => node.run(lock.lane(), &rollback).await,
            };
            match lock.traced_release(async { attempt }).await {
                Ok(_) | Err(Error::NotHeld { .. }) => return,
                Err(err) if Instant::now() + pause.next() < give_up_at => {
                    tracing::debug!(lock = %lock.name(), node = %node.addr(), error = %err, "rollback failed; retrying");
                    pause.wait(pause.next()).await;
                }
                Err(err) => {
                    tracing::warn!(
                        lock = %lock.name(),
                        node = %node.addr(),
                        error = %err,
                        "rollback of an abandoned acquire gave up; if it was granted, it ends with its lease"
                    );
                    lock.bury(&lock.keys().unlock_latch(&hold_id), sent_at)
                        .await;
                    return;
                }
            }
        }
    }
}
