//! The lock kinds of Redisson's family that a single-node lock can be: each
//! supplies its scripts, the field its holds are counted under, and the
//! channel its waiters listen on. Everything else (waiting, the watchdog,
//! the guard, rollback, the quorum round) is the same for every kind.

use std::borrow::Cow;
use std::sync::Arc;

use super::Lock;
use super::fair::FairQueue;
use crate::owner::Owner;
use crate::protocol::{self, Acquired, Call, Released, fair, rw};
use crate::timing;

/// Which of Redisson's locks a [`Lock`] is.
#[derive(Debug, Clone)]
pub(super) enum Family {
    /// `getLock`: the reentrant lock.
    Reentrant,
    /// `getFairLock`: granted in the order waiters asked.
    Fair(FairQueue),
    /// `getReadWriteLock().readLock()`: shared.
    Read,
    /// `getReadWriteLock().writeLock()`: exclusive.
    Write,
}

impl Lock {
    /// A fair lock's queue.
    pub(super) fn queue(&self) -> Option<&FairQueue> {
        match &self.inner.family {
            Family::Fair(queue) => Some(queue),
            _ => None,
        }
    }

    /// The hash field `owner`'s holds are counted under:
    /// `<client-uuid>:<owner>`, and for a write lock `…:write`.
    pub(crate) fn field(&self, owner: &Owner) -> Arc<str> {
        let field = protocol::field(&self.inner.core.id, owner.as_str());
        match self.inner.family {
            Family::Write => rw::write_field(&field).into(),
            _ => field,
        }
    }

    /// The channel a waiter of `owner` listens on: the lock's, or a fair
    /// lock's waiter's own.
    pub(crate) fn wake_channel(&self, owner: &Owner) -> Cow<'_, str> {
        match &self.inner.family {
            Family::Fair(_) => Cow::Owned(fair::waiter_channel(
                &self.inner.keys.channel,
                &self.field(owner),
            )),
            _ => Cow::Borrowed(&self.inner.keys.channel),
        }
    }

    /// Whether this is a read lock: its holds live by their timeout keys.
    pub(crate) fn reads(&self) -> bool {
        matches!(self.inner.family, Family::Read)
    }

    /// For a write lock, the reader field of the writer `field`: a write
    /// request waits for the owner's read releases still under way too, or
    /// it would find the owner's read and refuse the upgrade.
    pub(super) fn upgrade_field<'a>(&self, field: &'a str) -> Option<&'a str> {
        match self.inner.family {
            Family::Write => Some(rw::reader_field(field)),
            _ => None,
        }
    }

    /// Whether the lock is held, as this kind sees it: a read lock in read
    /// mode, a write lock in write mode (as Redisson's); anyone else's
    /// hold of the name otherwise.
    pub(super) fn is_locked_call(&self) -> Call<bool> {
        let keys = &self.inner.keys;
        match &self.inner.family {
            Family::Reentrant | Family::Fair(_) => protocol::is_locked(keys),
            Family::Read => rw::is_locked_in(keys, false),
            Family::Write => rw::is_locked_in(keys, true),
        }
    }

    /// The hold count of `field`, as this kind counts holds: a read lock's
    /// live read holds, the field's count otherwise.
    pub(super) fn hold_count_call(&self, field: &str) -> Call<u32> {
        match &self.inner.family {
            Family::Read => rw::read_hold_count(&self.inner.keys, field),
            _ => protocol::hold_count(&self.inner.keys, field),
        }
    }

    /// The acquire request of this lock's kind.
    pub(super) fn acquire_call(
        &self,
        field: &str,
        lease: std::time::Duration,
        hold_id: &str,
    ) -> Call<Acquired> {
        let (keys, fencing) = (&self.inner.keys, self.inner.fencing);
        match &self.inner.family {
            Family::Reentrant => protocol::acquire(keys, field, lease, hold_id, fencing),
            Family::Fair(queue) => fair::acquire(
                keys,
                &queue.keys,
                field,
                lease,
                hold_id,
                fencing,
                self.queue_wait(queue),
                timing::epoch_millis(),
            ),
            Family::Read => rw::read_acquire(keys, field, lease, hold_id),
            Family::Write => rw::write_acquire(keys, field, lease, hold_id, fencing),
        }
    }

    /// The release request of this lock's kind (see `protocol::release`).
    pub(super) fn release_call(
        &self,
        field: &str,
        latch: &str,
        spent: impl IntoIterator<Item = String>,
    ) -> Call<Released> {
        let keys = &self.inner.keys;
        match &self.inner.family {
            Family::Reentrant => protocol::release(keys, field, latch, spent),
            Family::Fair(queue) => fair::release(
                keys,
                &queue.keys,
                field,
                latch,
                spent,
                timing::epoch_millis(),
            ),
            Family::Read => rw::read_release(keys, field, latch, spent),
            Family::Write => rw::write_release(keys, field, latch, spent),
        }
    }

    /// The rollback request of this lock's kind (see `protocol::rollback`).
    pub(super) fn rollback_call(
        &self,
        field: &str,
        hold_id: &str,
        known_holds: u64,
    ) -> Call<Released> {
        let keys = &self.inner.keys;
        let window = timing::ROLLBACK_WINDOW;
        match &self.inner.family {
            Family::Reentrant => protocol::rollback(keys, field, hold_id, known_holds, window),
            Family::Fair(queue) => fair::rollback(
                keys,
                &queue.keys,
                field,
                hold_id,
                known_holds,
                window,
                self.queue_wait(queue),
                timing::epoch_millis(),
            ),
            Family::Read => rw::rollback(keys, field, false, hold_id, known_holds, window),
            Family::Write => rw::rollback(keys, field, true, hold_id, known_holds, window),
        }
    }

    /// The force unlock of this lock's kind.
    pub(super) fn force_unlock_call(&self) -> Call<bool> {
        let keys = &self.inner.keys;
        match &self.inner.family {
            Family::Reentrant => protocol::force_unlock(keys),
            Family::Fair(queue) => fair::force_unlock(keys, &queue.keys, timing::epoch_millis()),
            Family::Read => rw::force_unlock(keys, false),
            Family::Write => rw::force_unlock(keys, true),
        }
    }
}
