//! The renewal of a node's holds: the per-node timer, and one round of
//! batched renewal calls whose replies update only the entries they were
//! sent for.

use std::sync::{Arc, Weak};

use tokio::time::Instant;
use tracing::Instrument;

use super::{EntryKey, NodeWatchdog, RENEW_BATCH_SIZE};
use crate::metrics;
use crate::node::Lane;
use crate::protocol;

impl NodeWatchdog {
    /// One round: renew every entry with a hold taken without a lease, in
    /// batches. Each batch takes the `renewing` lock and drops the entries
    /// left meanwhile: an entry left before that is not renewed, and one
    /// left after it waits for this batch only ([`NodeWatchdog::quiesce`]).
    pub(super) async fn renew_all(&self) {
        // Every guard of the node is gone with it: nothing to renew.
        let Some(node) = self.node.upgrade() else {
            return;
        };
        let now = Instant::now();
        let snapshot: Vec<(EntryKey, u64)> = {
            let mut entries = self.entries.lock().unwrap();
            for (key, entry) in entries.by_lock.iter_mut() {
                if !entry.renew_until.is_empty() && !entry.renews_at(now) && !entry.capped {
                    entry.capped = true;
                    tracing::warn!(lock = %key.lock, node = %self.addr, "the lock reached its maximum hold time: renewal stops, and it expires with its last lease");
                }
            }
            entries
                .by_lock
                .iter()
                .filter(|(_, entry)| entry.renews_at(now))
                .map(|(key, entry)| (key.clone(), entry.id))
                .collect()
        };
        for chunk in batches(snapshot, node.cluster_map().is_some()) {
            let chunk = &chunk[..];
            let _batch = self.renewing.lock().await;
            // Entries left meanwhile are not renewed; each one kept is
            // renewed as the kind of hold it is.
            let chunk: Vec<(&EntryKey, u64, bool)> = {
                let entries = self.entries.lock().unwrap();
                chunk
                    .iter()
                    .filter_map(|(key, id)| {
                        let entry = entries.by_lock.get(key)?;
                        (entry.id == *id && entry.renews_at(now)).then_some((key, *id, entry.reads))
                    })
                    .collect()
            };
            if chunk.is_empty() {
                continue;
            }
            let sent_at = Instant::now();
            let renew = protocol::renew_batch(
                chunk
                    .iter()
                    .map(|(key, _, reads)| (&*key.lock, &*key.field, *reads)),
                self.timeout,
            );
            let span = tracing::debug_span!("renew", node = %self.addr, locks = chunk.len());
            metrics::renewal(&self.addr);
            let lane = Lane::of(&chunk[0].0.lock);
            let result = node
                .run_despite_suspicion(lane, &renew)
                .instrument(span.clone())
                .await;
            let _enter = span.enter();
            match result {
                Ok(renewed) => {
                    tracing::debug!(elapsed_us = sent_at.elapsed().as_micros() as u64, "renewed");
                    let replied_at = Instant::now();
                    let mut entries = self.entries.lock().unwrap();
                    for ((key, id, _), ok) in chunk.iter().zip(renewed) {
                        // Only the entry this renewal was about: the same
                        // owner may hold the lock again under a new one.
                        if entries
                            .by_lock
                            .get(*key)
                            .is_none_or(|entry| entry.id != *id)
                        {
                            continue;
                        }
                        if !ok {
                            if let Some(entry) = entries.by_lock.remove(*key) {
                                tracing::warn!(lock = %key.lock, "lock found gone during renewal");
                                metrics::lost_hold(&self.addr);
                                entry.standing.send_modify(|s| s.gone = true);
                            }
                        } else if let Some(entry) = entries.by_lock.get(*key) {
                            entry.record_ttl(sent_at, replied_at, self.timeout, true);
                        }
                    }
                }
                // Refused untried by a server that keeps its data: the
                // holds stand on what their last renewal proved, and a
                // later one carries them on (their proof lapses on its own
                // if none lands in time).
                Err(err) if err.is_refused_in_passing() => {
                    tracing::debug!(error = %err, "renewal refused for now; the holds stand on their last proof");
                }
                Err(err) => {
                    tracing::debug!(error = %err, "renewal failed; the holds there are unproven");
                    let entries = self.entries.lock().unwrap();
                    for (key, id, _) in &chunk {
                        if let Some(entry) = entries.by_lock.get(*key)
                            && entry.id == *id
                        {
                            entry.mark_unproven();
                        }
                    }
                }
            }
        }
    }
}

/// The per-node timer. Holds only a weak reference (bb8's reaper pattern) and
/// ends when its node has nothing left to renew, or the client is gone.
pub(super) struct Timer {
    pub(super) dog: Weak<NodeWatchdog>,
    /// Which timer this is: only the running one clears `Entries::timer`.
    pub(super) number: u64,
    /// `Entries::timer_task`'s, held (not read) by the task from its
    /// spawning on, so that it goes with the task however it ends.
    pub(super) _task: Arc<()>,
}

/// Clears `Entries::timer` however the timer ends, returning or dropped with
/// its runtime: the next registration then starts a new one.
struct TimerRunning {
    dog: Weak<NodeWatchdog>,
    number: u64,
}

impl Drop for TimerRunning {
    fn drop(&mut self) {
        if let Some(dog) = self.dog.upgrade() {
            {
                let mut entries = dog.entries.lock().unwrap();
                if entries.timer == Some(self.number) {
                    entries.timer = None;
                }
            }
            dog.prune_if_empty();
        }
    }
}

impl Timer {
    pub(super) async fn run(self) {
        let _running = TimerRunning {
            dog: self.dog.clone(),
            number: self.number,
        };
        let period = match self.dog.upgrade() {
            Some(dog) => dog.timeout / 3,
            None => return,
        };
        let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(dog) = self.dog.upgrade() else {
                return;
            };
            {
                // Idle: stop, under the same lock a registration checks, so
                // a hold registered from now on starts a new timer.
                let mut entries = dog.entries.lock().unwrap();
                if !entries.renews_any(Instant::now()) {
                    if entries.timer == Some(self.number) {
                        entries.timer = None;
                    }
                    return;
                }
            }
            dog.renew_all().await;
        }
    }
}

/// The renewal batches of `holds` (entries and their ids): at most
/// [`RENEW_BATCH_SIZE`] each, and on a Redis Cluster of one hash slot each
/// (one script cannot span slots).
fn batches(mut holds: Vec<(EntryKey, u64)>, by_slot: bool) -> Vec<Vec<(EntryKey, u64)>> {
    if !by_slot {
        return holds.chunks(RENEW_BATCH_SIZE).map(<[_]>::to_vec).collect();
    }
    let slot = |(key, _): &(EntryKey, u64)| Lane::of(&key.lock).slot();
    holds.sort_by_cached_key(slot);
    holds
        .chunk_by(|a, b| slot(a) == slot(b))
        .flat_map(|same| same.chunks(RENEW_BATCH_SIZE).map(<[_]>::to_vec))
        .collect()
}
