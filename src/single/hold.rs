//! A hold on one node (a granted acquire: the lock, the field written, the
//! hold's id and its entry in the client's record) and how it is released.
//!
//! A part can never be forgotten while granted: dropping one that was not
//! released releases it in the background.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tracing::Instrument;

use super::Lock;
use crate::error::{Error, Result};
use crate::finish_on_drop::{FinishOnDrop, KeepWhileAbandoned};
use crate::node::Conn;
use crate::protocol::{self, Call, Released};
use crate::timing;
use crate::watchdog::{PendingRollback, Record, Registration};

/// One node's share of a hold. Dropping a part that was not released
/// releases it in the background.
pub(crate) struct HeldPart {
    pub(crate) lock: Lock,
    field: Arc<str>,
    /// The id its acquire was sent with: the release names it (its unlock
    /// latch), so a retried release answers with the first result.
    hold_id: Arc<str>,
    /// `None`: renewed by the watchdog.
    lease: Option<Duration>,
    /// Its place in the client's record of the lock; taken by the release.
    registration: Option<Registration>,
    token: Option<u64>,
}

impl HeldPart {
    pub(crate) fn new(
        lock: Lock,
        field: Arc<str>,
        hold_id: Arc<str>,
        lease: Option<Duration>,
        registration: Registration,
        token: Option<u64>,
    ) -> Self {
        lock.metrics().held(1.0);
        HeldPart {
            lock,
            field,
            hold_id,
            lease,
            registration: Some(registration),
            token,
        }
    }

    /// The address of this part's node.
    pub(crate) fn node_addr(&self) -> &str {
        self.lock.node().addr()
    }

    /// The name of this part's lock.
    pub(crate) fn name(&self) -> &str {
        self.lock.name()
    }

    /// The fencing token its grant got, if fenced.
    pub(crate) fn token(&self) -> Option<u64> {
        self.token
    }

    /// Releases this part: stops its renewal first, waits out a renewal call
    /// under way, then sends the release. Finishes in the background if the
    /// returned future is dropped; a release that was not applied, or not
    /// answered, goes on there too (see `Lock::release_hold`).
    pub(crate) fn release(
        mut self,
    ) -> FinishOnDrop<impl Future<Output = Result<Released>>, impl KeepWhileAbandoned> {
        self.finishing_release()
    }

    /// The release job, finished in the background if dropped. There, the
    /// owner's next request of this field on this node waits for its answer
    /// (a dropped guard's release, the rest of a quorum unlock): a release
    /// landing after that request would lower a re-entry, or make a write
    /// find the owner's read and refuse the upgrade. A release the caller
    /// awaits needs no such wait, as the caller's next request comes after
    /// it, unless its reply did not come: then its retry, which goes on in
    /// the background, holds that request back the same way.
    fn finishing_release(
        &mut self,
    ) -> FinishOnDrop<impl Future<Output = Result<Released>> + use<>, impl KeepWhileAbandoned + use<>>
    {
        let job = self.release_job();
        let (lock, field) = (self.lock.clone(), self.field.clone());
        FinishOnDrop::new(job, log_failure)
            .keeping_while_abandoned(move || lock.rollback_pending(&field))
    }

    /// The release, owning what it needs. Leaves the record at once, before
    /// anything is sent: no renewal may follow.
    fn release_job(&mut self) -> impl Future<Output = Result<Released>> + Send + 'static + use<> {
        let registration = self.registration.take();
        if registration.is_some() {
            self.lock.metrics().held(-1.0);
        }
        // A hold that is over (gone, or its key's TTL surely ran out) sends
        // nothing: its field, if present, belongs to a later hold of the
        // same owner, which a release would lower.
        let over = registration.as_ref().is_none_or(|r| r.record().is_over());
        let watchdog = registration.map(Registration::stop);
        let lock = self.lock.clone();
        let field = self.field.clone();
        let hold_id = self.hold_id.clone();
        async move {
            if over {
                return Err(lock.not_held());
            }
            if let Some(watchdog) = watchdog {
                watchdog.quiesce().await;
            }
            lock.metrics().released();
            lock.release_hold(&field, &hold_id).await
        }
    }

    /// What a guard reads of this part; `None` once released.
    pub(crate) fn view(&self) -> Option<PartView> {
        Some(PartView {
            lock: self.lock.clone(),
            field: self.field.clone(),
            record: self.registration.as_ref()?.record().clone(),
            fixed_lease: self.lease.is_some(),
        })
    }
}

/// What a guard reads of a part without owning it: its node, and what the
/// client's record says about its key. Guards read their parts through
/// views, so parts granted after the guard was made (late answers of its
/// round) count as soon as they arrive.
#[derive(Clone)]
pub(crate) struct PartView {
    lock: Lock,
    field: Arc<str>,
    record: Record,
    fixed_lease: bool,
}

impl PartView {
    /// The address of the part's node.
    pub(crate) fn node_addr(&self) -> &str {
        self.lock.node().addr()
    }

    /// Whether the part was taken with a fixed lease (not renewed).
    pub(crate) fn has_lease(&self) -> bool {
        self.fixed_lease
    }

    /// Until when this part is proven to hold (see
    /// [`Record::proven_until`]): `None` once gone or its proof broke; the
    /// instant may be past.
    pub(crate) fn proven_until(&self) -> Option<Instant> {
        self.record.proven_until()
    }

    /// Whether this part is proven to hold at `now`.
    pub(crate) fn proven_at(&self, now: Instant) -> bool {
        self.proven_until().is_some_and(|until| until > now)
    }

    /// Resolves when this part is gone or can no longer be proven (see
    /// [`Record::lost`]).
    pub(crate) fn lost(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        self.record.lost()
    }

    /// Extends this part to at least `lease` from now, if it is still
    /// proven to hold: a hold that could not be proven for a while (its
    /// guard counts it lost) is never revived. Ok: until when it now surely
    /// holds.
    pub(crate) async fn extend(&self, lease: Duration) -> Result<Instant> {
        if !self.proven_at(Instant::now()) {
            return Err(self.lock.not_held());
        }
        let sent_at = Instant::now();
        let span =
            tracing::debug_span!("extend", lock = %self.lock.name(), node = %self.node_addr());
        let extended = self
            .lock
            .node()
            .run(
                self.lock.lane(),
                &protocol::extend(self.lock.keys(), &self.field, lease, self.lock.reads()),
            )
            .instrument(span.clone())
            .await;
        let _enter = span.enter();
        match extended? {
            Some(ttl) => {
                self.record.record_ttl(sent_at, Instant::now(), ttl);
                tracing::debug!(
                    elapsed_us = sent_at.elapsed().as_micros() as u64,
                    "extended"
                );
                // The hold's trusted TTL ran out while the extension was
                // on its way: its guard counts it lost, extended or not.
                if !self.proven_at(Instant::now()) {
                    return Err(self.lock.not_held());
                }
                Ok(timing::trusted_until(sent_at, ttl))
            }
            None => Err(self.lock.not_held()),
        }
    }
}

/// The parts of `views` that prove their hold at `now`, with until when
/// (later than `now`); none when fewer than `required` do. The one judge
/// of a guard's hold: its `lost()`, `valid_until()` and `nodes()`, and its
/// hold warning.
pub(crate) fn proven(
    views: Vec<PartView>,
    required: usize,
    now: Instant,
) -> Vec<(PartView, Instant)> {
    let proven: Vec<(PartView, Instant)> = views
        .into_iter()
        .filter_map(|part| {
            let until = part.proven_until().filter(|until| *until > now)?;
            Some((part, until))
        })
        .collect();
    if proven.len() < required {
        return Vec::new();
    }
    proven
}

impl Drop for HeldPart {
    fn drop(&mut self) {
        if self.registration.is_none() {
            return;
        }
        // Dropped unpolled, it moves the whole release onto the runtime.
        drop(self.finishing_release());
    }
}

/// Sends a release that was not applied, or whose reply never came, again
/// until the server answers it, as long as the window allows: a node that
/// was down or unreachable, a Cluster slot migrating or without a primary
/// (`NoShard`), a server's transient refusal (`LOADING`, `BUSY`, ...).
/// The first try runs on the release's own connection when it has one (a
/// reply that never came), so it runs right behind the original (the
/// hold's latch makes it answer with the original's result), one request at
/// a time, never a pile on a frozen node; later ones on a fresh connection
/// once the node answers again, after a backoff that a failover or a slot
/// changing hands cuts short. Only a permanent refusal ends it early.
///
/// `_pending` holds back the owner's next request of this field on this node
/// until the retry is answered, or given up and buried (`Lock::bury`): a
/// node restarted empty has lost the hold's latch, so a retry landing after
/// the owner's next grant there would find the owner's field and release
/// the new hold.
async fn finish_release(
    lock: Lock,
    mut conn: Option<Conn>,
    release: Call<Released>,
    latch: String,
    sent_at: Instant,
    _pending: PendingRollback,
) {
    let give_up_at = sent_at + timing::ROLLBACK_WINDOW;
    let mut pause = lock.node().retry_pause(lock.lane());
    // What the last try met, logged once per change, not per try.
    let mut failing = None;
    loop {
        let left = give_up_at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let outcome = match conn.as_mut() {
            Some(conn) => conn.run_patiently(&release, left).await,
            None => match lock.node().checkout(lock.lane()).await {
                Ok(fresh) => conn.insert(fresh).run_patiently(&release, left).await,
                Err(err) => Err(err),
            },
        };
        match outcome {
            Ok(released) => {
                tracing::debug!(lock = %lock.name(), ?released, "a release retried in the background went through");
                return;
            }
            Err(err) if err.is_permanent() => {
                tracing::warn!(lock = %lock.name(), error = %err, "a release retried in the background was refused; the lock ends with its lease");
                return;
            }
            Err(err) => {
                let seen = err.to_string();
                if failing.as_ref() != Some(&seen) {
                    tracing::debug!(lock = %lock.name(), error = %seen, "a release retried in the background failed; trying again");
                    failing = Some(seen);
                }
                // Answered (or broken, or out of patience): nothing of
                // this try is left to queue behind, so the next one takes
                // the connection the node gives then.
                conn = None;
                pause.wait(left).await;
            }
        }
    }
    tracing::warn!(lock = %lock.name(), node = %lock.node().addr(), "a release got no answer within its window; the lock ends with its lease");
    // The held-up connection closes now, not after the burial.
    drop(conn);
    lock.bury(&latch, sent_at).await;
}

/// What a release nobody awaits does with its outcome.
fn log_failure(result: Result<Released>) -> futures::future::BoxFuture<'static, ()> {
    async move {
        if let Err(err) = result {
            tracing::warn!(error = %err, "background release failed");
        }
    }
    .boxed()
}

impl Lock {
    /// Releases hold `hold_id` of `field`. A release whose reply did not
    /// come (the node froze, or answered NOSCRIPT after a `SCRIPT FLUSH` and
    /// the reply timed out before the reload) is sent again on the same
    /// connection, so the retry runs right behind the original: the hold's
    /// unlock latch makes it answer with the original's result if that ran.
    /// The caller waits for one retry. Whatever is still not answered then,
    /// or was not applied for a passing reason (nothing sent, the node
    /// refused, a Cluster slot migrating: `NoShard`), goes on in the
    /// background until the node answers, within
    /// [`timing::ROLLBACK_WINDOW`]: the caller's guard is spent, so nobody
    /// else can send it again. Only a permanent refusal is left alone.
    async fn release_hold(&self, field: &str, hold_id: &str) -> Result<Released> {
        let latch = self.keys().unlock_latch(hold_id);
        // Resent as it is: its latch makes a resend answer with the first
        // send's result, and deleting the spent latches twice is harmless.
        let release = self
            .node()
            .with_spent_latches(|spent| self.release_call(field, &latch, spent));
        let sent_at = Instant::now();
        self.traced_release(async {
            let mut conn = match self.node().checkout(self.lane()).await {
                Ok(conn) => conn,
                Err(err) => {
                    // Nothing sent (the node is suspect, or refused): it is
                    // sent once the node is back, within the window.
                    if !err.is_permanent() {
                        self.finish_release_later(field, None, release, latch, sent_at);
                    }
                    return Err(err);
                }
            };
            let first = conn.run(&release).await;
            let resent = matches!(&first, Err(err) if err.outcome_unknown());
            let reply = match resent {
                true => conn.run(&release).await,
                false => first,
            };
            match &reply {
                // Answered at the first try: nothing can resend it, so its
                // latch has served. After a retry the first send might
                // still be on its way (a frozen node): that latch is left
                // to expire.
                Ok(_) if !resent => self.node().spend_latch(latch),
                Ok(_) => {}
                Err(err) if err.is_permanent() => {}
                Err(err) => {
                    // A send whose reply never came may be in flight still:
                    // the next try queues behind it on its connection.
                    // Otherwise nothing of it is, and any connection serves.
                    let in_flight = resent || err.outcome_unknown();
                    let conn = in_flight.then_some(conn);
                    self.finish_release_later(field, conn, release, latch, sent_at);
                }
            }
            reply
        })
        .await
    }

    /// Hands a release that was not answered, or not applied, to
    /// [`finish_release`]. The marker is made here, before the task runs,
    /// so no request of the owner can slip in between.
    fn finish_release_later(
        &self,
        field: &str,
        conn: Option<Conn>,
        release: Call<Released>,
        latch: String,
        sent_at: Instant,
    ) {
        let pending = self.rollback_pending(&Arc::from(field));
        tokio::spawn(finish_release(
            self.clone(),
            conn,
            release,
            latch,
            sent_at,
            pending,
        ));
    }

    /// Runs `release` in a `release` span and maps "not held" to
    /// [`Error::NotHeld`].
    ///
    /// A combinator, not an `async fn`: an `async fn` keeps its argument's
    /// slot in its state beside the instrumented future it moved it into,
    /// which doubled the size of every release future built on it.
    pub(super) fn traced_release(
        &self,
        release: impl Future<Output = Result<Released>>,
    ) -> impl Future<Output = Result<Released>> {
        // The clock only for a subscriber that shows the elapsed time.
        let started = tracing::enabled!(tracing::Level::DEBUG).then(Instant::now);
        let span = tracing::debug_span!("release", lock = %self.name(), node = %self.node().addr());
        release.instrument(span.clone()).map(move |outcome| {
            let outcome = match outcome {
                Ok(Released::NotHeld) => Err(self.not_held()),
                other => other,
            };
            let elapsed_us = started.map_or(0, |s| s.elapsed().as_micros() as u64);
            span.in_scope(|| match &outcome {
                Ok(released) => tracing::debug!(elapsed_us, ?released, "released"),
                Err(err) => tracing::debug!(elapsed_us, error = %err, "release failed"),
            });
            outcome
        })
    }

    pub(crate) fn not_held(&self) -> Error {
        Error::NotHeld {
            lock: self.name().to_owned(),
            nodes: vec![self.node().addr().to_owned()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watchdog::{GrantRecord, Renewal};
    use crate::{Client, Node};

    /// A release waits for a renewal batch under way on its node before it
    /// is sent, so that renewal cannot reach the server after the release
    /// (nothing listens on the node's port: a release that is sent fails at
    /// once, refused).
    #[tokio::test]
    async fn a_release_waits_for_a_renewal_under_way() {
        let node = Node::new("redis://127.0.0.1:1").unwrap();
        let lock = Client::new().lock(&node, "k").unwrap();
        let field: Arc<str> = "c:o".into();
        let now = Instant::now();
        let grant = GrantRecord {
            sent_at: now,
            replied_at: now,
            ttl: Duration::from_secs(30),
            count: 1,
            reads: false,
        };
        let registration = lock
            .inner
            .core
            .watchdogs
            .register(&node, &"k".into(), &field, grant, Renewal::None)
            .unwrap();
        let watchdog = registration.watchdog();
        let part = HeldPart::new(lock, field, "hold".into(), None, registration, None);
        let renewal = watchdog.renewal_under_way().await;
        let release = tokio::spawn(part.release());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !release.is_finished(),
            "the release was sent while a renewal was under way"
        );
        drop(renewal);
        let released = tokio::time::timeout(Duration::from_secs(5), release)
            .await
            .expect("the release went once the renewal was over")
            .unwrap();
        assert!(
            matches!(&released, Err(err) if err.is_node_unavailable()),
            "{released:?}"
        );
    }
}
