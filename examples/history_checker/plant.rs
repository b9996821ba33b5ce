//! Planted bugs (`--plant`), to show the checker finds what it is there to
//! find in a real run:
//!
//! - a **rogue** holder that ignores its validity: it takes the first fenced
//!   RedLock name with a 1 s lease, then believes it holds for 3 s and keeps
//!   writing its token. Once its lease runs out a worker takes the lock and
//!   writes a higher token: the checker should report overlaps (the rogue's
//!   belief against the worker's hold) and the rogue's refused writes.
//! - a **leaked** guard: a RedLock taken with the watchdog and
//!   `mem::forget`-ten, so the watchdog renews it forever: the checker should
//!   report its key left on the nodes at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use multilock::{Client, Node, Owner, Result};
use multilock_testkit::{FencedStore, History};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::workers::store_key;

/// The rogue's holder name; every hold of a planted bug starts with `planted`.
pub const ROGUE: &str = "planted rogue";
/// The leaked guard's holder name.
pub const LEAKER: &str = "planted leak";
/// The lock name only the leaked guard uses.
pub const LEAKED_NAME: &str = "hc:red:leaked";

/// The rogue's real lease, and how long it believes it holds.
const ROGUE_LEASE: Duration = Duration::from_secs(1);
const ROGUE_BELIEF: Duration = Duration::from_secs(3);
/// The rogue strikes at 2 s, then every 8 s.
const ROGUE_FIRST: Duration = Duration::from_secs(2);
const ROGUE_EVERY: Duration = Duration::from_secs(8);

/// Whether a hold belongs to a planted bug.
pub fn is_planted(holder: &str) -> bool {
    holder.starts_with("planted")
}

/// Starts the rogue on `name` (a fenced RedLock name the workers take
/// too), and the leak at 60 % of the run.
pub fn spawn(
    client: &Client,
    red_nodes: &[Node],
    name: &'static str,
    store_url: &str,
    history: Arc<History>,
    run_for: Duration,
    stop: watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<()>>> {
    let rogue_lock = client
        .red_lock_on(red_nodes, name)?
        .with_fencing()
        .with_owner(Owner::new("planted-rogue")?);
    let store = FencedStore::new(store_url, store_key(name));
    let leak_lock = client
        .red_lock_on(red_nodes, LEAKED_NAME)?
        .with_owner(Owner::new("planted-leak")?);

    let rogue = {
        let history = history.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let mut next = Instant::now() + ROGUE_FIRST;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(next.into()) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                next += ROGUE_EVERY;
                let Ok(Some(guard)) = rogue_lock
                    .try_lock_for(Duration::from_secs(4), Some(ROGUE_LEASE))
                    .await
                else {
                    continue;
                };
                let token = guard.fencing_token().expect("fenced");
                // The bug: it trusts its own clock, not `valid_until()`.
                let believed_until = Instant::now() + ROGUE_BELIEF;
                let id = history.claimed(name, "RedLock", ROGUE, Some(believed_until), Some(token));
                while Instant::now() < believed_until {
                    let sent = Instant::now();
                    if let Ok(accepted) = store.write(token, ROGUE).await {
                        history.wrote(id, token, sent, accepted);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                history.released(id);
                drop(guard);
            }
        })
    };

    let leak = tokio::spawn(async move {
        let mut stop = stop;
        tokio::select! {
            _ = tokio::time::sleep(run_for.mul_f64(0.6)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let guard = match leak_lock.lock().await {
            Ok(guard) => guard,
            Err(err) => {
                println!("planted leak: could not take its lock: {err}");
                return;
            }
        };
        history.granted(&guard, "RedLock", LEAKER);
        // The bug: the guard is never dropped, so the watchdog renews it
        // forever and nothing ever releases it.
        std::mem::forget(guard);
    });
    Ok(vec![rogue, leak])
}
