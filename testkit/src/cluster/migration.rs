//! Slot migrations of a [`RedisCluster`]: the whole move, or one held
//! midway so a test sees `ASK` and `TRYAGAIN`.

use std::io;

use super::{READY_LIMIT, RedisCluster, SLOTS, owner_of};
use crate::command::{Role, ask, command, poll_ready, role};

/// How many keys one `MIGRATE` of a slot migration moves, as `redis-cli
/// --cluster reshard` does by default.
const MIGRATE_BATCH: &str = "100";

/// The `MIGRATE` timeout, in milliseconds: how long the source may wait on
/// the target.
const MIGRATE_TIMEOUT_MS: &str = "5000";

impl RedisCluster {
    /// Moves hash slot `slot` from the primary serving it to node `to`, the
    /// standard way: [`RedisCluster::begin_slot_migration`], then
    /// `SlotMigration::finish` (every key moved with `MIGRATE`, then
    /// `CLUSTER SETSLOT <slot> NODE` on every primary). Returns once the
    /// running nodes all report the slot at `to` in `CLUSTER SLOTS`.
    ///
    /// Fails ([`io::ErrorKind::InvalidInput`]) when `slot` is not below
    /// 16384, node `to` is not a primary, or it serves the slot already;
    /// fails when a step fails, or the nodes do not agree within 30 s.
    ///
    /// ```no_run
    /// # async fn f(cluster: &multilock_testkit::RedisCluster) -> std::io::Result<()> {
    /// use multilock_testkit::key_slot;
    ///
    /// let slot = key_slot("lock");
    /// let to = (cluster.primary_for_slot(slot).await? + 1) % 3;
    /// cluster.migrate_slot(slot, to).await?;
    /// assert_eq!(cluster.primary_for_slot(slot).await?, to);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Dropping the future may leave the slot migrating, its keys split
    /// between both nodes (`CLUSTER SETSLOT <slot> STABLE` on both undoes
    /// the states, not the moves), or reassigned on some primaries only
    /// (gossip then spreads the target's claim).
    pub async fn migrate_slot(&self, slot: u16, to: usize) -> io::Result<()> {
        self.begin_slot_migration(slot, to)
            .await?
            .finish(self)
            .await
    }

    /// Starts moving hash slot `slot` from the primary serving it to node
    /// `to`, and holds it there: `CLUSTER SETSLOT <slot> IMPORTING
    /// <source-id>` on the target, then `CLUSTER SETSLOT <slot> MIGRATING
    /// <target-id>` on the source. No key moves yet: move them with
    /// `SlotMigration::move_keys`, end with `SlotMigration::finish`.
    ///
    /// While the slot migrates, the source still serves the keys it holds;
    /// for a key it does not hold (moved, or new) it answers `-ASK <slot>
    /// 127.0.0.1:<target-port>`, and the target serves that key only to a
    /// connection that sent `ASKING` just before (otherwise it answers
    /// `MOVED` back to the source). A command on several keys of the slot,
    /// some there and some not (moved, or never written: a lock's Pub/Sub
    /// channel name passed as a key, say), gets `-TRYAGAIN` from the
    /// source, and from the target after `ASKING`, until the migration
    /// ends; with none of its keys on the source, `-ASK`.
    ///
    /// Fails ([`io::ErrorKind::InvalidInput`]) when `slot` is not below
    /// 16384, node `to` is not a primary, or it serves the slot already;
    /// fails when the nodes do not agree on `CLUSTER SLOTS` within 30 s,
    /// or a node refuses its `SETSLOT`.
    ///
    /// ```no_run
    /// # async fn f(cluster: &multilock_testkit::RedisCluster) -> std::io::Result<()> {
    /// use multilock_testkit::key_slot;
    ///
    /// let slot = key_slot("{user1000}");
    /// let to = (cluster.primary_for_slot(slot).await? + 1) % 3;
    /// let migration = cluster.begin_slot_migration(slot, to).await?;
    /// let moved = migration.move_keys(cluster).await?;
    /// // Here the source answers ASK for every key of the slot.
    /// migration.finish(cluster).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Dropping the future may leave the slot importing on the target, and
    /// migrating on the source, without a handle: `CLUSTER SETSLOT <slot>
    /// STABLE` on both undoes that.
    pub async fn begin_slot_migration(&self, slot: u16, to: usize) -> io::Result<SlotMigration> {
        let target = &self.nodes[to];
        let invalid = |message| Err(io::Error::new(io::ErrorKind::InvalidInput, message));
        if slot >= SLOTS {
            return invalid(format!("no hash slot {slot}: there are {SLOTS}"));
        }
        if role(&target.url()).await?.0 != Role::Primary {
            return invalid(format!("slot {slot}: {} is not a primary", target.url()));
        }
        let from = self.primary_for_slot(slot).await?;
        if from == to {
            return invalid(format!("slot {slot}: {} serves it already", target.url()));
        }
        let (source, slot_arg) = (&self.nodes[from], slot.to_string());
        let importing = ["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &source.id];
        ask::<()>(&target.url(), &importing).await?;
        let migrating = ["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &target.id];
        ask::<()>(&source.url(), &migrating).await?;
        Ok(SlotMigration { slot, from, to })
    }
}

/// A hash slot held mid-migration between two primaries of a
/// [`RedisCluster`], from [`RedisCluster::begin_slot_migration`]: the slot
/// is importing on the target and migrating on the source, so the source
/// answers `ASK` for every key of the slot it no longer holds.
///
/// Dropping it leaves the slot migrating; [`SlotMigration::finish`] ends
/// the migration.
///
/// ```no_run
/// # async fn f(cluster: &multilock_testkit::RedisCluster) -> std::io::Result<()> {
/// let migration = cluster.begin_slot_migration(42, 1).await?;
/// println!("slot {} from node {} to node {}", migration.slot(), migration.from(), migration.to());
/// migration.move_keys(cluster).await?;
/// migration.finish(cluster).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "the slot stays migrating until `finish`"]
pub struct SlotMigration {
    slot: u16,
    from: usize,
    to: usize,
}

impl SlotMigration {
    /// The hash slot.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The index of the source, the primary that served the slot.
    pub fn from(&self) -> usize {
        self.from
    }

    /// The index of the target, the primary the slot moves to.
    pub fn to(&self) -> usize {
        self.to
    }

    /// Moves every key the source holds in the slot to the target
    /// (`CLUSTER GETKEYSINSLOT <slot> 100` on the source, then `MIGRATE
    /// 127.0.0.1 <target-port> "" 0 5000 KEYS <keys>`, until it holds
    /// none), and returns how many it moved (a key that expired before its
    /// `MIGRATE` counts). `cluster` is the cluster that began the
    /// migration. Fails when a node does not answer within 5 s or refuses
    /// a `MIGRATE` (for one, when the target holds one of the keys
    /// already: `BUSYKEY`).
    ///
    /// # Cancel safety
    /// Dropping the future leaves some of the keys moved; each key is on
    /// one node or the other.
    pub async fn move_keys(&self, cluster: &RedisCluster) -> io::Result<usize> {
        let (source, target) = (cluster.nodes[self.from].url(), &cluster.nodes[self.to]);
        let slot = self.slot.to_string();
        let mut moved = 0;
        loop {
            let batch = ["CLUSTER", "GETKEYSINSLOT", &slot, MIGRATE_BATCH];
            let keys: Vec<Vec<u8>> = ask(&source, &batch).await?;
            if keys.is_empty() {
                return Ok(moved);
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate.arg("127.0.0.1").arg(target.port()).arg("").arg(0);
            migrate.arg(MIGRATE_TIMEOUT_MS).arg("KEYS").arg(&keys);
            command::<()>(&source, &migrate).await?;
            moved += keys.len();
        }
    }

    /// Ends the migration: moves the keys left ([`SlotMigration::move_keys`]),
    /// assigns the slot to the target with `CLUSTER SETSLOT <slot> NODE
    /// <target-id>` on the target, the source, then every other running
    /// primary, and waits until the running nodes all report the slot at
    /// the target in `CLUSTER SLOTS`. `cluster` is the cluster that began
    /// the migration. Fails when a step fails, or the nodes do not agree
    /// within 30 s.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the slot migrating, or reassigned on
    /// some primaries only (gossip then spreads the target's claim, which
    /// has the newer config epoch).
    pub async fn finish(self, cluster: &RedisCluster) -> io::Result<()> {
        self.move_keys(cluster).await?;
        let (slot, target) = (self.slot.to_string(), &cluster.nodes[self.to]);
        let assign = ["CLUSTER", "SETSLOT", &slot, "NODE", &target.id];
        // The target first: it takes the slot with a config epoch of its
        // own, so gossip cannot hand the slot back to the source.
        ask::<()>(&target.url(), &assign).await?;
        ask::<()>(&cluster.nodes[self.from].url(), &assign).await?;
        let others = cluster.nodes.iter().enumerate();
        let others = others.filter(|&(i, node)| i != self.from && i != self.to && node.is_up());
        for (_, node) in others {
            // Replicas refuse SETSLOT; they learn the owner from gossip.
            if role(&node.url()).await?.0 == Role::Primary {
                ask::<()>(&node.url(), &assign).await?;
            }
        }
        let port = target.port();
        let what = format!("slot {slot} did not move to {}", target.url());
        poll_ready(READY_LIMIT, &what, || async {
            let owner = owner_of(&cluster.agreement().await?, self.slot);
            match owner {
                Some(owner) if owner == port => Ok(()),
                owner => Err(io::Error::other(format!("the nodes agree on {owner:?}"))),
            }
        })
        .await
    }
}
