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
use crate::error::{Error, Result, Unavailable};
use crate::finish_on_drop::FinishOnDrop;
use crate::node::Conn;
use crate::protocol::{self, Call, Released};
use crate::timing;
use crate::watchdog::Registration;

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
    pub(crate) token: Option<u64>,
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

    /// Releases this part: stops its renewal first, waits out a renewal call
    /// under way, then sends the release. Finishes in the background if the
    /// returned future is dropped.
    pub(crate) fn release(mut self) -> FinishOnDrop<impl Future<Output = Result<Released>>> {
        let job = self.release_job();
        FinishOnDrop::new(job, log_failure)
    }

    /// The release, owning what it needs. Leaves the record at once, before
    /// anything is sent: no renewal may follow.
    fn release_job(&mut self) -> impl Future<Output = Result<Released>> + Send + 'static + use<> {
        let registration = self.registration.take();
        // A hold that is over (gone, or its key's TTL surely ran out) sends
        // nothing: its field, if present, belongs to a later hold of the
        // same owner, which a release would lower.
        let over = registration.as_ref().is_none_or(Registration::is_over);
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
            lock.release_hold(&field, &hold_id).await
        }
    }

    /// Extends this part to at least `lease` from now, if it still surely
    /// holds; an over hold is never revived. Ok: until when it now surely
    /// holds.
    pub(crate) async fn extend(&self, lease: Duration) -> Result<Instant> {
        let registration = match &self.registration {
            Some(registration) if !registration.is_over() => registration,
            _ => return Err(self.lock.not_held()),
        };
        let sent_at = Instant::now();
        let span =
            tracing::debug_span!("extend", lock = %self.lock.name(), node = %self.node_addr());
        let extended = self
            .lock
            .node()
            .run(&protocol::extend(self.lock.keys(), &self.field, lease))
            .instrument(span.clone())
            .await;
        let _enter = span.enter();
        match extended? {
            Some(ttl) => {
                registration.record_ttl(sent_at, Instant::now(), ttl);
                tracing::debug!(
                    elapsed_us = sent_at.elapsed().as_micros() as u64,
                    "extended"
                );
                Ok(timing::trusted_until(sent_at, ttl))
            }
            None => Err(self.lock.not_held()),
        }
    }

    /// Whether this part was taken with a fixed lease (not renewed).
    pub(crate) fn has_lease(&self) -> bool {
        self.lease.is_some()
    }

    /// Until when this part surely holds; `None` once known gone.
    pub(crate) fn trusted_until(&self) -> Option<Instant> {
        self.registration.as_ref()?.trusted_until()
    }

    /// Resolves when this part is gone or may be (see
    /// [`Registration::lost`]).
    pub(crate) async fn lost(&self) {
        if let Some(registration) = &self.registration {
            registration.lost().await;
        }
    }
}

impl Drop for HeldPart {
    fn drop(&mut self) {
        if self.registration.is_none() {
            return;
        }
        // Dropped unpolled, it moves the whole release onto the runtime.
        drop(FinishOnDrop::new(self.release_job(), log_failure));
    }
}

/// Sends a release whose reply never came once more, on its connection,
/// and waits for the answer as long as the window allows: one request queued
/// behind the original, never a pile on a frozen node. A connection that
/// broke is replaced (the original then either ran before the break or
/// never will).
async fn finish_release(lock: Lock, mut conn: Conn, release: Call<Released>, sent_at: Instant) {
    let give_up_at = sent_at + timing::ROLLBACK_WINDOW;
    let mut backoff = Duration::from_millis(50);
    loop {
        let left = give_up_at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match conn.run_patiently(&release, left).await {
            Ok(released) => {
                tracing::debug!(lock = %lock.name(), ?released, "a release retried in the background went through");
                return;
            }
            Err(Error::NodeUnavailable {
                reason: Unavailable::Disconnected | Unavailable::Refused,
                ..
            }) => {
                tokio::time::sleep(backoff.min(left)).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                if let Ok(fresh) = lock.node().checkout().await {
                    conn = fresh;
                }
            }
            Err(Error::NodeUnavailable { .. }) => break,
            Err(err) => {
                tracing::warn!(lock = %lock.name(), error = %err, "a release retried in the background failed");
                return;
            }
        }
    }
    tracing::warn!(lock = %lock.name(), node = %lock.node().addr(), "a release got no answer within its window; the lock ends with its lease");
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
    /// The caller waits for one retry; more go on in the background until
    /// the node answers, within [`timing::ROLLBACK_WINDOW`].
    async fn release_hold(&self, field: &str, hold_id: &str) -> Result<Released> {
        let release = protocol::release(self.keys(), field, hold_id);
        let sent_at = Instant::now();
        self.traced_release(async {
            let mut conn = self.node().checkout().await?;
            let mut tries = 0;
            loop {
                tries += 1;
                match conn.run(&release).await {
                    Err(err) if err.outcome_unknown() && tries < 2 => {}
                    Err(err) if err.outcome_unknown() => {
                        tokio::spawn(finish_release(self.clone(), conn, release, sent_at));
                        break Err(err);
                    }
                    reply => break reply,
                }
            }
        })
        .await
    }

    /// Runs `release` in a `release` span and maps "not held" to
    /// [`Error::NotHeld`].
    pub(super) async fn traced_release(
        &self,
        release: impl Future<Output = Result<Released>>,
    ) -> Result<Released> {
        let started = Instant::now();
        let span = tracing::debug_span!("release", lock = %self.name(), node = %self.node().addr());
        let outcome = match release.instrument(span.clone()).await {
            Ok(Released::NotHeld) => Err(self.not_held()),
            other => other,
        };
        let elapsed_us = started.elapsed().as_micros() as u64;
        span.in_scope(|| match &outcome {
            Ok(released) => tracing::debug!(elapsed_us, ?released, "released"),
            Err(err) => tracing::debug!(elapsed_us, error = %err, "release failed"),
        });
        outcome
    }

    pub(crate) fn not_held(&self) -> Error {
        Error::NotHeld {
            lock: self.name().to_owned(),
            node: self.node().addr().to_owned(),
        }
    }
}
