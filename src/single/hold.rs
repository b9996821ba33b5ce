//! A hold on one node (a granted acquire: the lock, the field written and
//! its renewal) and how it is released.
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
use crate::finish_on_drop::FinishOnDrop;
use crate::protocol::{self, Call, Released};
use crate::timing;
use crate::watchdog::Renewal;

/// One node's share of a hold: the lock there, the field written, and its
/// renewal. Dropping a part that was not released releases it in the
/// background, so a part can never be forgotten while granted.
pub(crate) struct HeldPart {
    pub(crate) lock: Lock,
    pub(crate) field: Arc<str>,
    /// `None`: renewed by the watchdog.
    pub(crate) lease: Option<Duration>,
    pub(crate) renewal: Option<Renewal>,
    pub(crate) token: Option<u64>,
    /// When the acquire request was sent: a fixed lease runs at least until
    /// this plus the lease (the server applied the request after it).
    pub(crate) sent_at: Instant,
    /// When its grant arrived: a fixed lease has surely run out once this
    /// plus the lease (and drift) is past.
    replied_at: Instant,
    armed: bool,
}

impl HeldPart {
    pub(crate) fn new(
        lock: Lock,
        field: Arc<str>,
        lease: Option<Duration>,
        renewal: Option<Renewal>,
        token: Option<u64>,
        sent_at: Instant,
    ) -> Self {
        HeldPart {
            lock,
            field,
            lease,
            renewal,
            token,
            sent_at,
            replied_at: Instant::now(),
            armed: true,
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
        self.armed = false;
        let job = self.release_job();
        FinishOnDrop::new(job, log_failure)
    }

    fn release_job(&mut self) -> impl Future<Output = Result<Released>> + Send + 'static + use<> {
        // A hold that is over (the watchdog found it gone, or its fixed lease
        // surely ran out) is not released: releasing its field would lower
        // the count of a later hold by the same owner.
        let gone = match (&self.renewal, self.lease) {
            (Some(renewal), _) => renewal.is_gone(),
            (None, Some(lease)) => {
                Instant::now() >= timing::surely_expired_at(self.replied_at, lease)
            }
            (None, None) => false,
        };
        // Deregistered now, before anything is sent: no renewal may follow.
        let watchdog = self.renewal.take().map(Renewal::stop);
        let lock = self.lock.clone();
        let field = self.field.clone();
        let lease = self.lease;
        async move {
            if gone {
                return Err(Error::NotHeld {
                    lock: lock.name().to_owned(),
                    node: lock.node().addr().to_owned(),
                });
            }
            if let Some(watchdog) = watchdog {
                watchdog.quiesce().await;
            }
            lock.release_field(&field, lease).await
        }
    }

    /// Until when this part surely holds; `None` once known gone.
    pub(crate) fn trusted_until(&self) -> Option<Instant> {
        match (&self.renewal, self.lease) {
            (Some(renewal), _) => renewal.trusted_until(),
            (None, Some(lease)) => Some(timing::trusted_until(self.sent_at, lease)),
            (None, None) => None,
        }
    }

    /// Resolves when this part is gone or may be: the watchdog found it
    /// missing or could not confirm it in time, or its fixed lease ran out.
    pub(crate) async fn lost(&self) {
        match (&self.renewal, self.lease) {
            (Some(renewal), _) => renewal.lost().await,
            (None, Some(lease)) => {
                tokio::time::sleep_until(timing::trusted_until(self.sent_at, lease)).await
            }
            (None, None) => std::future::pending().await,
        }
    }
}

impl Drop for HeldPart {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Dropped unpolled, it moves the whole release onto the runtime.
        drop(FinishOnDrop::new(self.release_job(), log_failure));
    }
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
    pub(super) fn release_call(&self, field: &str, lease: Option<Duration>) -> Call<Released> {
        protocol::release(
            &self.inner.keys,
            field,
            self.lease(lease),
            &protocol::new_request_id(),
        )
    }

    /// Releases one hold of `field`. A release whose outcome is unknown
    /// (timeout, broken connection) is retried once with the same request
    /// id: the unlock latch makes the retry return the first result.
    async fn release_field(&self, field: &str, lease: Option<Duration>) -> Result<Released> {
        let release = self.release_call(field, lease);
        self.traced_release(async {
            // One call site in a loop: the future holds one request's state,
            // not two.
            let mut retried = false;
            loop {
                let reply = self.inner.node.run(&release).await;
                match reply {
                    Err(err) if err.outcome_unknown() && !retried => retried = true,
                    reply => break reply,
                }
            }
        })
        .await
    }

    pub(super) async fn traced_release(
        &self,
        release: impl Future<Output = Result<Released>>,
    ) -> Result<Released> {
        let started = Instant::now();
        let span = tracing::debug_span!("release", lock = %self.inner.keys.name, node = %self.inner.node.addr());
        let outcome = match release.instrument(span.clone()).await {
            Ok(Released::NotHeld) => Err(Error::NotHeld {
                lock: self.inner.keys.name.clone(),
                node: self.inner.node.addr().to_owned(),
            }),
            Ok(released) => Ok(released),
            Err(err) => Err(err),
        };
        let elapsed_us = started.elapsed().as_micros() as u64;
        span.in_scope(|| match &outcome {
            Ok(released) => tracing::debug!(elapsed_us, ?released, "released"),
            Err(err) => tracing::debug!(elapsed_us, error = %err, "release failed"),
        });
        outcome
    }
}
