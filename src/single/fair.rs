//! What a fair lock does besides the reentrant lock's work: its scripts
//! carry the queue, its waiters listen on their own channel, and a waiter
//! that stops waiting leaves the queue, whatever ends its wait (a grant, the
//! deadline, an error, or the caller dropping the future).

use std::sync::Arc;
use std::time::Duration;

use super::Lock;
use crate::error::Result;
use crate::owner::Owner;
use crate::protocol::fair;
use crate::timing;

/// Redisson's default share of a queued `lock()` (its `threadWaitTime`):
/// how long the queue keeps a waiter's turn before it counts as gone.
pub const DEFAULT_QUEUE_WAIT: Duration = Duration::from_secs(5 * 60);

/// A fair lock's queue: its keys, and the share a waiter without a wait of
/// its own takes.
#[derive(Debug, Clone)]
pub(super) struct FairQueue {
    pub(super) keys: fair::QueueKeys,
    pub(super) wait: Duration,
}

impl FairQueue {
    pub(super) fn new(name: &str) -> FairQueue {
        FairQueue {
            keys: fair::QueueKeys::new(name),
            wait: DEFAULT_QUEUE_WAIT,
        }
    }
}

impl Lock {
    /// The wait a queued request of this handle takes as its share.
    pub(super) fn queue_wait(&self, queue: &FairQueue) -> Duration {
        self.queue_wait.unwrap_or(queue.wait)
    }

    /// Whether an acquire through this handle may join a queue: a fair
    /// lock's, with a wait.
    fn queues(&self) -> bool {
        self.queue()
            .is_some_and(|queue| !self.queue_wait(queue).is_zero())
    }

    /// This handle for one acquire that waits `wait` (`None`: until
    /// granted): a fair lock's queue then keeps the waiter's turn for that
    /// long, as Redisson's `tryLock` does (a waiter that dies blocks the
    /// queue no longer than it would have waited), and an acquire with no
    /// wait at all does not queue (Redisson's `tryLock()`). A wait until
    /// granted takes the lock's own share ([`Lock::with_queue_wait`]).
    pub(crate) fn for_wait(&self, wait: Option<Duration>) -> Lock {
        match wait {
            Some(wait) if self.queue().is_some() => Lock {
                inner: self.inner.clone(),
                owner: self.owner.clone(),
                queue_wait: Some(wait),
            },
            _ => self.clone(),
        }
    }

    /// A fair lock's waiter of `field` leaves the queue (nothing for other
    /// locks). Ok(true) when it was queued.
    pub(super) async fn give_up(&self, field: &str) -> Result<bool> {
        let Some(queue) = self.queue() else {
            return Ok(false);
        };
        if !self.queues() {
            return Ok(false);
        }
        let give_up = fair::give_up(
            &self.inner.keys,
            &queue.keys,
            field,
            self.queue_wait(queue),
            timing::epoch_millis(),
        );
        self.inner.node.run(self.inner.lane, &give_up).await
    }

    /// [`Lock::give_up`], in the background: tried again with backoff while
    /// the node fails, for as long as the entry could keep its turn (after
    /// that the queue drops it as stale anyway). A permanent refusal ends it
    /// at once: no retry can mend it.
    pub(super) fn give_up_later(&self, field: Arc<str>) {
        let Some(queue) = self.queue() else {
            return;
        };
        let give_up_by = tokio::time::Instant::now() + self.queue_wait(queue);
        let lock = self.clone();
        tokio::spawn(async move {
            let mut pause = lock.node().retry_pause(lock.lane());
            // What the last try met, logged once per change, not per try.
            let mut failing = None;
            loop {
                match lock.give_up(&field).await {
                    Ok(_) => return,
                    Err(err)
                        if !err.is_permanent()
                            && tokio::time::Instant::now() + pause.next() < give_up_by =>
                    {
                        let seen = err.to_string();
                        if failing.as_ref() != Some(&seen) {
                            tracing::debug!(lock = %lock.name(), error = %seen, "leaving the fair queue failed; retrying");
                            failing = Some(seen);
                        }
                        pause.wait(pause.next()).await;
                    }
                    Err(err) => {
                        tracing::warn!(lock = %lock.name(), node = %lock.node().addr(), error = %err, "a waiter could not leave the fair queue; it goes when its turn's deadline passes");
                        return;
                    }
                }
            }
        });
    }
}

/// A fair lock's waiter's place in the queue while its acquire runs. If the
/// acquire is dropped while no request is in flight, the place is given up
/// in the background; with a request in flight, that request's own
/// completion gives it up after the reply (a give-up sent now could be
/// overtaken by the request, which would then queue again).
pub(super) struct QueueSeat {
    lock: Lock,
    field: Arc<str>,
    /// No request in flight, and one may have queued this waiter.
    armed: bool,
}

impl QueueSeat {
    /// `None` for locks without a queue, and for an acquire that does not
    /// queue (no wait): nothing to give up.
    pub(super) fn new(lock: &Lock, owner: &Owner) -> Option<QueueSeat> {
        if !lock.queues() {
            return None;
        }
        Some(QueueSeat {
            lock: lock.clone(),
            field: lock.field(owner),
            armed: false,
        })
    }

    /// A request is about to be sent: until it returns, its completion owns
    /// the give-up.
    pub(super) fn sending(seat: &mut Option<QueueSeat>) {
        if let Some(seat) = seat {
            seat.armed = false;
        }
    }

    /// The request returned: the waiter may be queued.
    pub(super) fn returned(seat: &mut Option<QueueSeat>) {
        if let Some(seat) = seat {
            seat.armed = true;
        }
    }

    /// The wait ended without a grant: the waiter leaves the queue now, so
    /// the next waiter's turn comes at once. Armed until it is done: if the
    /// caller goes away meanwhile, the drop gives up in the background.
    pub(super) async fn give_up(seat: &mut Option<QueueSeat>) {
        let Some(seat) = seat.as_mut() else {
            return;
        };
        seat.armed = true;
        if let Err(err) = seat.lock.give_up(&seat.field).await {
            tracing::debug!(lock = %seat.lock.name(), error = %err, "giving up the queue failed; retrying in the background");
            seat.lock.give_up_later(seat.field.clone());
        }
        seat.armed = false;
    }

    /// Granted: the grant took the waiter out of the queue.
    pub(super) fn granted(seat: &mut Option<QueueSeat>) {
        if let Some(seat) = seat {
            seat.armed = false;
        }
    }
}

impl Drop for QueueSeat {
    fn drop(&mut self) {
        if self.armed {
            self.lock.give_up_later(self.field.clone());
        }
    }
}

/// The places a quorum lock's waiter may hold in the queues of its fair
/// parts, over a whole acquire (every round of it). When the acquire ends,
/// the waiter leaves every one of them: awaited when it was not granted (the
/// caller sees clean queues), in the background when it was (a granted part
/// left its queue already; a part that was not queued answers no). Dropped
/// unfinished (the acquire future was dropped), it leaves them in the
/// background; a request in flight then leaves by its own completion too.
pub(crate) struct QueueSeats {
    seats: Vec<(Lock, Arc<str>)>,
}

impl QueueSeats {
    /// The seats of the fair ones among `locks` that queue, for `owner`.
    pub(crate) fn new<'a>(locks: impl IntoIterator<Item = &'a Lock>, owner: &Owner) -> QueueSeats {
        QueueSeats {
            seats: locks
                .into_iter()
                .filter(|lock| lock.queues())
                .map(|lock| (lock.clone(), lock.field(owner)))
                .collect(),
        }
    }

    /// The acquire is over, `granted` or not. The seats are kept until the
    /// give-ups are done: dropped meanwhile, they give up in the background.
    pub(crate) async fn finish(mut self, granted: bool) {
        if granted {
            for (lock, field) in self.seats.drain(..) {
                lock.give_up_later(field);
            }
            return;
        }
        futures::future::join_all(self.seats.iter().map(|(lock, field)| async move {
            if lock.give_up(field).await.is_err() {
                lock.give_up_later(field.clone());
            }
        }))
        .await;
        self.seats.clear();
    }
}

impl Drop for QueueSeats {
    fn drop(&mut self) {
        for (lock, field) in self.seats.drain(..) {
            lock.give_up_later(field);
        }
    }
}
