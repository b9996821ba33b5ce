//! The single-node reentrant lock, wire-compatible with Redisson's `RLock`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tracing::Instrument;

use crate::client::Client;
use crate::detach::FinishOnDrop;
use crate::error::{Error, Result};
use crate::guard::{Guard, HeldPart};
use crate::node::{Conn, Node};
use crate::owner::Owner;
use crate::protocol::{self, Acquired, Call, LockKeys, Released};

/// Longest single wait when the lock's TTL is unknown (a key without expiry):
/// bounds the cost of a lost unlock message.
const MAX_BLIND_WAIT: Duration = Duration::from_secs(1);

/// A reentrant lock on one Redis node, compatible with Redisson's `RLock`.
///
/// The lock is a hash named `name`; the field `<client-uuid>:<owner>` holds
/// the hold count. Waiters listen on `redisson_lock__channel:{name}`. A Java
/// service using Redisson and this crate can share one lock.
///
/// The handle is cheap to clone, `Send + Sync`, and holds no state of holding:
/// that lives in the [`Guard`]. By default the owner is the calling task (see
/// [`Owner`]); [`Lock::with_owner`] binds an explicit one.
///
/// Locks taken without a lease are renewed by the client's watchdog every
/// third of the watchdog timeout while held; with a lease they expire after it.
///
/// Like Redisson's `RLock`, the lock is not fair: a release wakes one local
/// waiter per unlock message, but a holder that releases and asks again at
/// once often wins the race against the woken waiter.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use multilock::{Client, Node};
///
/// # async fn demo() -> multilock::Result<()> {
/// let client = Client::new();
/// let node = Node::new("redis://127.0.0.1:6379")?;
/// let lock = client.lock(&node, "orders:42")?;
///
/// let guard = lock.lock().await?;          // waits; renewed by the watchdog
/// let again = lock.lock().await?;          // same task: re-entered
/// assert_eq!(lock.hold_count().await?, 2);
/// again.unlock().await?;
/// guard.unlock().await?;
///
/// if let Some(guard) = lock.try_lock_for(Duration::from_secs(1), Some(Duration::from_secs(10))).await? {
///     // held for at most 10 s
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    inner: Arc<LockInner>,
    owner: Option<Owner>,
}

#[derive(Clone)]
struct LockInner {
    client: Client,
    node: Node,
    keys: LockKeys,
    /// Fencing tokens are on.
    fenced: bool,
    /// Replicas that must acknowledge a grant, and how long to wait for them.
    replica_sync: Option<(u32, Duration)>,
}

/// One acquire attempt on one node.
pub(crate) enum Attempt {
    Granted(HeldPart),
    /// Held by someone else, with the key's remaining TTL when it has one.
    Taken(Option<Duration>),
}

impl Lock {
    pub(crate) fn new(client: Client, node: Node, name: String) -> Result<Lock> {
        if name.is_empty() {
            return Err(Error::invalid("lock name must not be empty"));
        }
        Ok(Lock {
            inner: Arc::new(LockInner {
                client,
                node,
                keys: LockKeys::new(&name),
                fenced: false,
                replica_sync: None,
            }),
            owner: None,
        })
    }

    /// The lock's name (the Redis key).
    pub fn name(&self) -> &str {
        &self.inner.keys.name
    }

    /// The node the lock lives on.
    pub fn node(&self) -> &Node {
        &self.inner.node
    }

    pub(crate) fn keys(&self) -> &LockKeys {
        &self.inner.keys
    }

    pub(crate) fn client(&self) -> &Client {
        &self.inner.client
    }

    /// This handle bound to an explicit owner: every acquire through it holds
    /// for `owner`, whatever task runs it. For sharing a hold between tasks or
    /// handing it over.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// use multilock::Owner;
    /// let job = lock.with_owner(Owner::new("job-17")?);
    /// let guard = job.lock().await?;
    /// // Another task, same owner: re-enters instead of waiting.
    /// let again = tokio::spawn(async move { job.lock().await }).await.unwrap()?;
    /// again.unlock().await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_owner(&self, owner: Owner) -> Lock {
        Lock {
            inner: self.inner.clone(),
            owner: Some(owner),
        }
    }

    /// This lock with fencing tokens: each grant (re-entries too) INCRs the counter
    /// `redisson_lock_token:{name}` in the acquire script (Redisson's fenced
    /// lock) and the guard carries the value ([`Guard::fencing_token`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let fenced = lock.with_fencing();
    /// let guard = fenced.lock().await?;
    /// let token = guard.fencing_token().expect("fencing is on");
    /// // Send `token` with every write; the store refuses tokens lower than seen.
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_fencing(&self) -> Lock {
        self.rebuilt(|inner| inner.fenced = true)
    }

    /// This lock with replica sync: after each grant, `WAIT replicas timeout`
    /// on the same connection (Redisson's replica-sync check). When fewer
    /// replicas acknowledge in time, the grant is released and the acquire
    /// fails with [`Error::ReplicaSync`]: a lock that a failover could lose
    /// is never handed out. Costs one more round trip per acquire (plus the
    /// replication delay).
    ///
    /// This narrows the failover window of a primary with replicas; it does
    /// not close it (a replica can acknowledge and still not be the one
    /// promoted). Independent masters ([`MultiLock`](crate::MultiLock),
    /// [`RedLock`](crate::RedLock)) do not depend on replication at all.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `replicas` is 0 or `timeout` is under
    /// 1 ms (`WAIT` with 0 would block forever).
    ///
    /// # Examples
    ///
    /// ```
    /// # let client = multilock::Client::new();
    /// # let primary = multilock::Node::new("redis://127.0.0.1:6379")?;
    /// use std::time::Duration;
    /// let lock = client.lock(&primary, "orders:42")?
    ///     .with_replica_sync(1, Duration::from_millis(100))?;
    /// # Ok::<(), multilock::Error>(())
    /// ```
    pub fn with_replica_sync(&self, replicas: u32, timeout: Duration) -> Result<Lock> {
        if replicas == 0 {
            return Err(Error::invalid("replica sync needs at least one replica"));
        }
        if timeout < Duration::from_millis(1) {
            return Err(Error::invalid("replica sync timeout must be at least 1 ms"));
        }
        Ok(self.rebuilt(|inner| inner.replica_sync = Some((replicas, timeout))))
    }

    fn rebuilt(&self, change: impl FnOnce(&mut LockInner)) -> Lock {
        let mut inner = (*self.inner).clone();
        change(&mut inner);
        Lock {
            inner: Arc::new(inner),
            owner: self.owner.clone(),
        }
    }

    /// True when fencing tokens are on.
    pub fn is_fenced(&self) -> bool {
        self.inner.fenced
    }

    /// The owner acquisitions through this handle hold for, resolved now: the
    /// explicit one, else the current task or thread.
    pub fn owner(&self) -> Owner {
        self.owner.clone().unwrap_or_else(Owner::current)
    }

    fn field(&self, owner: &Owner) -> Arc<str> {
        protocol::field(self.inner.client.id(), owner.as_str())
    }

    /// Acquires, waiting as long as it takes. Without a lease: the watchdog
    /// renews the lock while the guard lives.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let guard = lock.lock().await?;     // renewed by the watchdog while held
    /// // ... the critical section ...
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`] / [`Error::Redis`] when the node fails.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves nothing held: an acquire request in flight
    /// is completed in the background and released if it was granted.
    pub async fn lock(&self) -> Result<Guard> {
        self.acquire_until_granted(None).await
    }

    /// Acquires, waiting as long as it takes, with a fixed lease (no
    /// watchdog): the lock expires `lease` after it was granted unless
    /// released before.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// use std::time::Duration;
    /// let guard = lock.lock_with_lease(Duration::from_secs(10)).await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a lease under 1 ms or over [`MAX_LEASE`](crate::MAX_LEASE); otherwise as
    /// [`Lock::lock`].
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::lock`].
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<Guard> {
        check_lease(lease)?;
        self.acquire_until_granted(Some(lease)).await
    }

    async fn acquire_until_granted(&self, lease: Option<Duration>) -> Result<Guard> {
        loop {
            if let Some(guard) = self.acquire(None, lease).await? {
                return Ok(guard);
            }
        }
    }

    /// One attempt, no waiting. `None` when someone else holds the lock.
    /// Without a lease, so the watchdog renews it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// match lock.try_lock().await? {
    ///     Some(guard) => guard.unlock().await?,
    ///     None => { /* someone else holds it */ }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Lock::lock`].
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::lock`].
    pub async fn try_lock(&self) -> Result<Option<Guard>> {
        self.acquire(Some(Duration::ZERO), None).await
    }

    /// Tries for at most `wait`; `lease` fixes the lease, `None` lets the
    /// watchdog renew. `None` when the lock was not granted in time.
    ///
    /// Waiting is driven by the unlock message on the lock's channel; each
    /// wait also ends after the holder's remaining TTL, so a lost message
    /// costs at most one TTL.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// use std::time::Duration;
    /// let wait = Duration::from_secs(2);
    /// if let Some(guard) = lock.try_lock_for(wait, Some(Duration::from_secs(10))).await? {
    ///     guard.unlock().await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a lease under 1 ms or over [`MAX_LEASE`](crate::MAX_LEASE); otherwise as
    /// [`Lock::lock`].
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::lock`].
    pub async fn try_lock_for(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<Guard>> {
        if let Some(lease) = lease {
            check_lease(lease)?;
        }
        self.acquire(Some(wait), lease).await
    }

    async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<Guard>> {
        let owner = self.owner();
        let started = Instant::now();
        let deadline = wait.map(|w| crate::lease::deadline(started, w));
        let span = tracing::debug_span!("acquire", lock = %self.inner.keys.name, node = %self.inner.node.addr(), owner = %owner);
        async move {
            let outcome = self.wait_for_grant(&owner, lease, deadline).await;
            let elapsed_us = started.elapsed().as_micros() as u64;
            match &outcome {
                Ok(Some(_)) => tracing::debug!(elapsed_us, "acquired"),
                Ok(None) => tracing::debug!(elapsed_us, "not acquired within the wait"),
                Err(err) => tracing::debug!(elapsed_us, error = %err, "acquire failed"),
            }
            outcome.map(|part| {
                part.map(|part| {
                    let valid_until = part
                        .lease
                        .map(|lease| crate::lease::trusted_until(part.sent_at, lease));
                    let token = part.token;
                    Guard::new(owner, vec![part], 1, 1, valid_until, token)
                })
            })
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
                    self.inner.client.inner().watchdogs.register(
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

    /// The lease a request sets: the given one, else the watchdog's.
    fn lease(&self, lease: Option<Duration>) -> Duration {
        lease.unwrap_or_else(|| self.inner.client.watchdog_timeout())
    }

    fn release_call(&self, field: &str, lease: Option<Duration>) -> Call<Released> {
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
    pub(crate) async fn release_field(
        &self,
        field: &str,
        lease: Option<Duration>,
    ) -> Result<Released> {
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

    async fn traced_release(
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

    /// Deletes the lock whoever holds it, and wakes its waiters. Returns
    /// whether it was held.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let was_held = lock.force_unlock().await?;
    /// assert!(!lock.is_locked().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`] / [`Error::Redis`] when the node fails.
    ///
    /// # Cancel safety
    ///
    /// One request; if dropped after sending, it may or may not be applied.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.inner
            .node
            .run(&protocol::force_unlock(&self.inner.keys))
            .await
    }

    /// Whether anyone holds the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let guard = lock.lock().await?;
    /// assert!(lock.is_locked().await?);
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`] / [`Error::Redis`] when the node fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn is_locked(&self) -> Result<bool> {
        self.inner
            .node
            .run(&protocol::is_locked(&self.inner.keys))
            .await
    }

    /// Whether the owner of this handle (see [`Lock::owner`]) holds the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let guard = lock.lock().await?;
    /// assert!(lock.is_held_by_current_owner().await?);
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`] / [`Error::Redis`] when the node fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn is_held_by_current_owner(&self) -> Result<bool> {
        let field = self.field(&self.owner());
        Ok(self
            .inner
            .node
            .run(&protocol::hold_count(&self.inner.keys, &field))
            .await?
            > 0)
    }

    /// How many times the owner of this handle holds the lock (0 when not).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// let outer = lock.lock().await?;
    /// let inner = lock.lock().await?;            // the same task re-enters
    /// assert_eq!(lock.hold_count().await?, 2);
    /// inner.unlock().await?;
    /// outer.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`] / [`Error::Redis`] when the node fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn hold_count(&self) -> Result<u32> {
        let field = self.field(&self.owner());
        self.inner
            .node
            .run(&protocol::hold_count(&self.inner.keys, &field))
            .await
    }

    /// The lock's remaining time to live; `None` when it is not held (or has
    /// no expiry).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: multilock::Lock) -> multilock::Result<()> {
    /// use std::time::Duration;
    /// let guard = lock.lock_with_lease(Duration::from_secs(10)).await?;
    /// assert!(lock.remaining_ttl().await?.unwrap() <= Duration::from_secs(10));
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NodeUnavailable`] / [`Error::Redis`] when the node fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        self.inner
            .node
            .run(&protocol::remaining_ttl(&self.inner.keys))
            .await
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.inner.keys.name)
            .field("node", &self.inner.node.addr())
            .field("owner", &self.owner)
            .field("fenced", &self.is_fenced())
            .field("replica_sync", &self.inner.replica_sync)
            .finish()
    }
}

pub(crate) fn check_lease(lease: Duration) -> Result<()> {
    if lease < Duration::from_millis(1) {
        return Err(Error::invalid("lease must be at least 1 ms"));
    }
    if lease > crate::lease::MAX_LEASE {
        return Err(Error::invalid(
            "lease must be at most ten years (MAX_LEASE)",
        ));
    }
    Ok(())
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
