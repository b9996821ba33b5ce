//! What the client knows of one entry's key, shared between the entry (the
//! one writer) and the guards' records (readers that can wait for a
//! change): a value, a version, and a wake-up.
//!
//! Not `tokio::sync::watch`: every grant makes one and every release drops
//! it, and a watch channel is a large allocation (eight `Notify`s) whose
//! sender, dropped, locks all eight. This is one small allocation and one
//! `Notify`, with the same rule for waiters: a change since the last look,
//! or the writer gone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

/// What the client knows of one entry's key.
#[derive(Debug, Clone, Copy)]
pub(super) struct Standing {
    /// A renewal found the hold gone, or a fresh grant proved it over.
    pub(super) gone: bool,
    /// Until when the key surely lives: the latest TTL set for it, counted
    /// from when its request was sent, less clock drift.
    pub(super) trusted_until: Instant,
    /// From when the key has surely expired, unless renewed: the latest TTL
    /// counted from when its reply arrived, plus clock drift.
    pub(super) expired_by: Instant,
    /// The last renewal was refused or timed out.
    pub(super) unproven: bool,
    /// How many times the proof of this entry's holds broke: a renewal was
    /// refused or timed out, or the trusted TTL ran out before a renewal
    /// or grant extended it. A hold is proven only while this is what it
    /// was when the hold joined: once a guard could not prove its hold, it
    /// never claims it again (its `lost()` has fired, or could have), even
    /// when a later renewal finds the field (which a read hold's field
    /// outlives: the timeout keys are what expire).
    pub(super) breaks: u64,
}

struct Shared {
    value: Mutex<Standing>,
    /// Bumped by every change, under the value's lock.
    version: AtomicU64,
    /// The entry is gone (its holds with it).
    closed: AtomicBool,
    changed: Notify,
}

/// The entry's side: changes the standing, and closes it when dropped.
pub(super) struct StandingSender(Arc<Shared>);

/// A record's side: reads the standing, and waits for it to change.
#[derive(Clone)]
pub(super) struct StandingReceiver {
    shared: Arc<Shared>,
    /// The version last seen by [`StandingReceiver::borrow_and_update`].
    seen: u64,
}

/// The entry was dropped: no change will come.
#[derive(Debug)]
pub(super) struct Closed;

impl StandingSender {
    pub(super) fn new(standing: Standing) -> StandingSender {
        StandingSender(Arc::new(Shared {
            value: Mutex::new(standing),
            version: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            changed: Notify::new(),
        }))
    }

    /// Changes the standing and wakes the waiters.
    pub(super) fn send_modify(&self, change: impl FnOnce(&mut Standing)) {
        self.send_if_modified(|standing| {
            change(standing);
            true
        });
    }

    /// Changes the standing, and wakes the waiters if `change` says it
    /// changed it.
    pub(super) fn send_if_modified(&self, change: impl FnOnce(&mut Standing) -> bool) {
        let mut value = self.0.value.lock().unwrap();
        if change(&mut value) {
            self.0.version.fetch_add(1, Ordering::Release);
            drop(value);
            self.0.changed.notify_waiters();
        }
    }

    pub(super) fn borrow(&self) -> Standing {
        *self.0.value.lock().unwrap()
    }

    /// A reader that has seen the standing as it is now.
    pub(super) fn subscribe(&self) -> StandingReceiver {
        // The version is read under the value's lock, as changes bump it.
        let _value = self.0.value.lock().unwrap();
        StandingReceiver {
            shared: self.0.clone(),
            seen: self.0.version.load(Ordering::Acquire),
        }
    }
}

impl Drop for StandingSender {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        self.0.changed.notify_waiters();
    }
}

impl StandingReceiver {
    pub(super) fn borrow(&self) -> Standing {
        *self.shared.value.lock().unwrap()
    }

    /// The standing now, marked as seen.
    pub(super) fn borrow_and_update(&mut self) -> Standing {
        let value = self.shared.value.lock().unwrap();
        self.seen = self.shared.version.load(Ordering::Acquire);
        *value
    }

    /// Waits until the standing changed since it was last seen (then marks
    /// it seen), or the entry is gone.
    ///
    /// Cancel safe: it only waits.
    pub(super) async fn changed(&mut self) -> Result<(), Closed> {
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            // Registered before the checks: a change between them and the
            // wait still wakes it.
            notified.as_mut().enable();
            let version = self.shared.version.load(Ordering::Acquire);
            if version != self.seen {
                self.seen = version;
                return Ok(());
            }
            if self.shared.closed.load(Ordering::Acquire) {
                return Err(Closed);
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn standing() -> Standing {
        Standing {
            gone: false,
            trusted_until: Instant::now(),
            expired_by: Instant::now(),
            unproven: false,
            breaks: 0,
        }
    }

    #[tokio::test]
    async fn a_waiter_wakes_on_a_change_and_on_the_end() {
        let sender = StandingSender::new(standing());
        let mut receiver = sender.subscribe();
        let waiting = tokio::spawn({
            let mut receiver = receiver.clone();
            async move { receiver.changed().await.is_ok() }
        });
        tokio::task::yield_now().await;
        sender.send_modify(|s| s.breaks += 1);
        assert!(waiting.await.unwrap(), "woken by the change");
        assert_eq!(receiver.borrow_and_update().breaks, 1);
        // Nothing new: a change that changed nothing wakes no one.
        sender.send_if_modified(|_| false);
        let waiting = tokio::spawn(async move { receiver.changed().await.is_err() });
        tokio::task::yield_now().await;
        drop(sender);
        assert!(
            tokio::time::timeout(Duration::from_secs(5), waiting)
                .await
                .unwrap()
                .unwrap(),
            "the end wakes it, with no change"
        );
    }

    #[tokio::test]
    async fn a_change_before_the_wait_is_not_missed() {
        let sender = StandingSender::new(standing());
        let mut receiver = sender.subscribe();
        sender.send_modify(|s| s.gone = true);
        receiver.changed().await.unwrap();
        assert!(receiver.borrow().gone);
    }
}
