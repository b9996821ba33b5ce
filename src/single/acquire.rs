//! How a single-node acquire runs: one attempt (a script call that finishes
//! even if its caller goes away), the wait between attempts (pub/sub
//! wake-ups, bounded by the holder's TTL), the replica-sync check after a
//! grant, and the rollback of an attempt nobody will hold.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tracing::Instrument;

use super::{HeldPart, Lock};
use crate::error::{Error, Result};
use crate::finish_on_drop::FinishOnDrop;
use crate::guard::Guard;
use crate::node::Conn;
use crate::owner::Owner;
use crate::protocol::{self, Acquired, Call, Released};
use crate::timing;

/// Longest single wait when the lock's TTL is unknown (a key without expiry):
/// bounds the cost of a lost unlock message.
const MAX_BLIND_WAIT: Duration = Duration::from_secs(1);

/// One acquire attempt on one node.
pub(crate) enum Attempt {
    Granted(HeldPart),
    /// Held by someone else, with the key's remaining TTL when it has one.
    Taken(Option<Duration>),
}

impl Lock {
    /// Acquires within `wait` (`None`: until granted): the work behind
    /// every public acquire method.
    pub(super) async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<Guard>> {
        let owner = self.owner();
        let started = Instant::now();
        let deadline = wait.map(|w| timing::deadline(started, w));
        let span = tracing::debug_span!("acquire", lock = %self.inner.keys.name, node = %self.inner.node.addr(), owner = %owner);
        async move {
            let outcome = self.wait_for_grant(&owner, lease, deadline).await;
            let elapsed_us = started.elapsed().as_micros() as u64;
            match &outcome {
                Ok(Some(_)) => tracing::debug!(elapsed_us, "acquired"),
                Ok(None) => tracing::debug!(elapsed_us, "not acquired within the wait"),
                Err(err) => tracing::debug!(elapsed_us, error = %err, "acquire failed"),
            }
            outcome.map(|part| part.map(|part| Guard::single(owner, part)))
        }
        .instrument(span)
        .await
    }

    /// Attempt; subscribe; then attempt again after every wake-up (unlock
    /// message, or the holder's TTL) until granted or past the deadline.
    async fn wait_for_grant(
        &self,
        owner: &Owner,
        lease: Option<Duration>,
        deadline: Option<Instant>,
    ) -> Result<Option<HeldPart>> {
        if let Attempt::Granted(part) = self.attempt(owner, lease).await? {
            return Ok(Some(part));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        // Subscribe before the next attempt: a release between that attempt
        // and the wait below is then a message we receive.
        let patience = deadline.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        });
        let subscription = self
            .inner
            .node
            .subscribe(&self.inner.keys.channel, patience)
            .await;
        loop {
            let woken = subscription.wake().notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let ttl = match self.attempt(owner, lease).await? {
                Attempt::Granted(part) => return Ok(Some(part)),
                Attempt::Taken(ttl) => ttl,
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

    /// One acquire request. If the caller goes away while it is in flight,
    /// the request still completes and a grant is released; if its outcome
    /// is unknown (timeout, broken connection), it is rolled back in the
    /// background on the same connection, behind the request.
    pub(crate) async fn attempt(&self, owner: &Owner, lease: Option<Duration>) -> Result<Attempt> {
        let field = self.field(owner);
        let sent_at = Instant::now();
        let request = self.clone().send_acquire(field.clone(), lease);
        let sent = FinishOnDrop::new(request, |sent| sent.settle().boxed()).await;
        let rollback = sent.rollback_patience();
        match sent.reply {
            Ok(Acquired::Granted(token)) => {
                // No await between the grant and the part: from here on,
                // dropping releases.
                let renewal = lease.is_none().then(|| {
                    self.inner.core.watchdogs.register(
                        &self.inner.node,
                        &self.inner.keys.name,
                        &field,
                        sent_at,
                    )
                });
                Ok(Attempt::Granted(HeldPart::new(
                    self.clone(),
                    field,
                    lease,
                    renewal,
                    token,
                    sent_at,
                )))
            }
            Ok(Acquired::Taken(ttl)) => Ok(Attempt::Taken(ttl)),
            Err(err) => {
                if let Some(patience) = rollback {
                    tokio::spawn(sent.undo.roll_back(self.clone(), field, lease, patience));
                }
                Err(err)
            }
        }
    }

    /// Sends the acquire script. Owns everything it needs, so it can finish
    /// on its own, and keeps its connection for a rollback.
    async fn send_acquire(self, field: Arc<str>, lease: Option<Duration>) -> SentAcquire {
        let mut sent = SentAcquire {
            reply: Ok(Acquired::Taken(None)),
            undo: Undo::default(),
            lock: self,
            field,
            lease,
        };
        // WAIT blocks its connection: take one nobody shares.
        let node = &sent.lock.inner.node;
        let checkout = match sent.lock.inner.replica_sync {
            None => node.checkout().await,
            Some(_) => node.checkout_exclusive().await,
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
        let acquire = if lock.inner.fenced {
            protocol::acquire_fenced(&lock.inner.keys, &sent.field, lease)
        } else {
            protocol::acquire(&lock.inner.keys, &sent.field, lease)
        };
        sent.reply = conn.run(&acquire).await;
        sent.undo.granted = matches!(sent.reply, Ok(Acquired::Granted(_)));
        if let (true, Some((replicas, timeout))) = (sent.undo.granted, lock.inner.replica_sync)
            && let Err(err) = lock
                .sync_replicas(
                    &mut conn,
                    &mut sent.undo.release,
                    &sent.field,
                    sent.lease,
                    replicas,
                    timeout,
                )
                .await
        {
            sent.reply = Err(err);
        }
        sent.undo.conn = Some(conn);
        sent
    }

    /// `WAIT` for the grant just made on `conn` to reach `replicas`; when it
    /// does not, release it again (same connection, so in order). The
    /// release is kept in `sent_release`: if its outcome is unknown, the
    /// rollback resends that very request, whose unlock latch then answers
    /// for it instead of releasing a second hold.
    async fn sync_replicas(
        &self,
        conn: &mut Conn,
        sent_release: &mut Option<Call<Released>>,
        field: &str,
        lease: Option<Duration>,
        replicas: u32,
        timeout: Duration,
    ) -> Result<()> {
        let wait = protocol::wait_for_replicas(replicas, timeout);
        let patience = timeout + self.inner.node.response_timeout();
        let acknowledged = conn.run_patiently(&wait, patience).await?;
        if acknowledged >= replicas {
            return Ok(());
        }
        let release = sent_release.insert(self.release_call(field, lease));
        match self
            .traced_release(conn.run_patiently(release, self.inner.node.response_timeout()))
            .await
        {
            // Gone already (its lease ran out during the WAIT): released too.
            Ok(_) | Err(Error::NotHeld { .. }) => {}
            Err(err) => return Err(err),
        }
        Err(Error::ReplicaSync {
            lock: self.inner.keys.name.clone(),
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
    lease: Option<Duration>,
    undo: Undo,
    reply: Result<Acquired>,
}

/// What a rollback of an acquire goes through: the acquire's own
/// connection, and a release already sent on it whose outcome is unknown.
#[derive(Default)]
struct Undo {
    /// The acquire itself was granted (whatever came after it).
    granted: bool,
    conn: Option<Conn>,
    release: Option<Call<Released>>,
}

impl SentAcquire {
    /// Whether this acquire must be undone if nobody holds it, and how long
    /// the release may wait for its reply: a grant, briefly; a request that
    /// got no answer, as long as its lease, the longest it could matter.
    fn rollback_patience(&self) -> Option<Duration> {
        let node = &self.lock.inner.node;
        match &self.reply {
            Ok(Acquired::Granted(_)) => Some(node.response_timeout()),
            Err(err) if err.outcome_unknown() => {
                Some(self.lock.lease(self.lease).max(node.response_timeout()))
            }
            // Granted, then released by the replica check itself.
            Err(Error::ReplicaSync { .. }) => None,
            // Granted, then the replica check failed: still held.
            Err(_) if self.undo.granted => Some(node.response_timeout()),
            _ => None,
        }
    }

    /// Nobody takes this reply: undo whatever it may have done.
    async fn settle(self) {
        if let Some(patience) = self.rollback_patience() {
            let lock = self.lock;
            self.undo
                .roll_back(lock, self.field, self.lease, patience)
                .await;
        }
    }
}

impl Undo {
    /// Releases an acquire nobody will hold. The release goes on the
    /// acquire's own connection, so it is applied after the acquire even
    /// when the node was paused in between.
    async fn roll_back(
        self,
        lock: Lock,
        field: Arc<str>,
        lease: Option<Duration>,
        patience: Duration,
    ) {
        let Some(mut conn) = self.conn else {
            return;
        };
        let release = self
            .release
            .unwrap_or_else(|| lock.release_call(&field, lease));
        match lock
            .traced_release(conn.run_patiently(&release, patience))
            .await
        {
            Ok(_) | Err(Error::NotHeld { .. }) => {}
            Err(err) => tracing::warn!(error = %err, "rollback of an abandoned acquire failed"),
        }
    }
}
