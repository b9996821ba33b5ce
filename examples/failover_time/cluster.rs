//! The Cluster rounds: a fresh `RedisCluster` each, a `Node::cluster` that
//! took and released a lock of the measured name's slot (so it has the slot
//! map and its connection to that shard), then, from one instant, four
//! loops side by side:
//!
//! - Redis, as the taken-over replica sees it: every 10 ms, `CLUSTER SLOTS`
//!   on the replica, until it names itself for the slot (it has taken over);
//! - Redis, as every node sees it: every 10 ms, `CLUSTER SLOTS` on each
//!   running node (the old primary too, when it stays up), until all name
//!   the replica for the slot: whichever node a client asks then tells it.
//!   The "Redis failover" the overhead is counted from, as the sentinels'
//!   majority is for a Sentinel group;
//! - ours: `try_lock` then `unlock` (500 ms each, 10 ms between failed
//!   attempts) of a fresh name of the slot each attempt, as the Sentinel
//!   loop, until both succeed with the grant on the new primary. The time
//!   is taken once the release succeeded;
//! - ours again, beside it: the same loop on one name of that slot, retried
//!   (the lock a client wants whatever happened). An attempt whose request
//!   was on the wire when the primary died has an unknown outcome, which
//!   the lock's rollback settles; that name's next attempts wait for it.
//!
//! Round r of N strikes (r - 1) / N s into the node's 1 s poll of the slot
//! map. Two faults: the primary of the name's slot SIGKILLed (the replica
//! takes over once the others mark it failed, after `cluster-node-timeout`
//! 1 s), and `CLUSTER FAILOVER` sent to the replica by the kit (clock
//! started at that call), where the old primary stays up as the new one's
//! replica: an acquire whose key is on the old primary while it still serves
//! the slot does not count, and once one was granted by the new primary a
//! burst of lock/unlock cycles of the name (3 s, 100 cycles) counts the
//! scripts sent to the old primary (`INFO commandstats`, refused ones
//! included: a replica answers `MOVED`).

use std::time::{Duration, Instant};

use multilock::redis::{self, Value, aio::MultiplexedConnection};
use multilock::{Client, Node};
use multilock_testkit::{RedisCluster, key_slot};

use super::{
    Fault, GIVE_UP, LEASE, PROBE_TIMEOUT, Res, Round, SENTINEL_POLL, Waiter,
    acquire_on_new_primary, burst, connect,
};

/// The lock whose slot's primary fails.
const NAME: &str = "failover:cluster";
/// Hash slots of a Redis Cluster.
const SLOTS: u16 = 16384;

pub(crate) async fn run_round(fault: Fault, round: usize, rounds: usize) -> Res<Round> {
    let mut cluster = RedisCluster::start().await?;
    let node = Node::cluster(cluster.seed_urls()).build()?;
    let client = Client::new();
    let old = cluster.primary_for_key(NAME).await?;
    let replica = cluster.replica_of(old).await?;
    // Another name of the same slot: the measured one is first asked for
    // after the fault, free whatever replication lost.
    let warm_up = SlotNames::new("failover:warm-up:", key_slot(NAME)).next();
    let warm_up = client.lock(&node, warm_up.ok_or("no name")?)?;
    let guard = warm_up.try_lock_for(Duration::ZERO, Some(LEASE)).await?;
    guard.ok_or("warm-up not granted")?.unlock().await?;

    let slot = key_slot(NAME);
    let replica_port = cluster.nodes()[replica].port();
    let replica_conn = [connect(&cluster.nodes()[replica].url()).await?];
    let mut old_conn = connect(&cluster.nodes()[old].url()).await?;
    // The nodes that stay up.
    let mut running = Vec::new();
    for (i, node) in cluster.nodes().iter().enumerate() {
        if i != old || fault.planned() {
            running.push(connect(&node.url()).await?);
        }
    }

    let held = SlotNames::new(&format!("failover:{round}:held:"), slot).next();
    let held = held.ok_or("no name")?;
    let waiter = Waiter::start(&client, &node, &held, &cluster.nodes()[old].url(), 1).await?;

    // The node asks for the slot map every second from its first request:
    // round r of N strikes (r - 1) / N s later into that second.
    tokio::time::sleep(Duration::from_secs(1) * (round as u32 - 1) / rounds as u32).await;
    let started = Instant::now();
    if fault == Fault::ClusterKill {
        cluster.kill(old).await?;
    }
    let cluster = &cluster;
    let failover = async {
        match fault {
            Fault::ClusterFailover => cluster.failover(replica).await,
            _ => Ok(()),
        }
    };
    // The old primary is only asked where an acquire landed while it lives.
    let mut old_too = old_conn.clone();
    let old_alive = fault.planned().then_some(&mut old_conn);
    let mut fresh = SlotNames::new(&format!("failover:{round}:"), slot);
    let fresh = |_| fresh.next().expect("names never run out");
    let ours = acquire_on_new_primary(&client, &node, old_alive, started, fresh, true);
    let old_alive = fault.planned().then_some(&mut old_too);
    let one = acquire_on_new_primary(&client, &node, old_alive, started, |_| NAME.into(), true);
    let (failover, claimed, agreed, mut measured, one, waiter) = tokio::join!(
        failover,
        named(&replica_conn, slot, replica_port, started),
        named(&running, slot, replica_port, started),
        ours,
        one,
        waiter.released_at_fault(started),
    );
    failover?;
    measured.waiter = waiter;
    measured.claimed = claimed;
    measured.redis = agreed;
    measured.first_same = one.first_new;
    for (kind, n) in one.errors {
        *measured
            .errors
            .entry(format!("one name: {kind}"))
            .or_default() += n;
    }
    if fault.planned() && measured.first_new.is_some() {
        let burst = burst(&client, &node, NAME, &old_conn, &mut measured.errors);
        measured.burst = Some(burst.await?);
    }
    Ok(measured)
}

/// Names `<prefix><n>`, n = 0, 1, ..., that lie in one slot, found as
/// the kit's `key_slot` would, but from the prefix's CRC on: a few hundred
/// µs per name.
struct SlotNames {
    prefix: String,
    /// The CRC16 of the prefix.
    crc: u16,
    slot: u16,
    n: u64,
}

impl SlotNames {
    /// `prefix` must hold no `{`: the whole name is hashed.
    fn new(prefix: &str, slot: u16) -> SlotNames {
        assert!(!prefix.contains('{'), "a hash tag in {prefix}");
        let (prefix, crc) = (prefix.to_owned(), crc16(0, prefix.as_bytes()));
        SlotNames {
            prefix,
            crc,
            slot,
            n: 0,
        }
    }
}

impl Iterator for SlotNames {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        loop {
            let digits = self.n.to_string();
            self.n = self.n.checked_add(1)?;
            if crc16(self.crc, digits.as_bytes()) % SLOTS == self.slot {
                let name = format!("{}{digits}", self.prefix);
                debug_assert_eq!(key_slot(&name), self.slot);
                return Some(name);
            }
        }
    }
}

/// CRC16 (XMODEM) of `bytes`, from `crc` on: Redis Cluster's key hash.
fn crc16(crc: u16, bytes: &[u8]) -> u16 {
    bytes.iter().fold(crc, |mut crc, &byte| {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = (crc << 1) ^ if crc & 0x8000 != 0 { 0x1021 } else { 0 };
        }
        crc
    })
}

/// Until the `CLUSTER SLOTS` of every node of `nodes` names the one at
/// `port` for `slot`.
async fn named(
    nodes: &[MultiplexedConnection],
    slot: u16,
    port: u16,
    started: Instant,
) -> Option<i64> {
    while started.elapsed() < GIVE_UP {
        let asks = nodes.iter().map(|conn| async move {
            let (mut conn, mut ask) = (conn.clone(), redis::cmd("CLUSTER"));
            let ask = ask.arg("SLOTS").query_async::<Vec<Vec<Value>>>(&mut conn);
            match tokio::time::timeout(PROBE_TIMEOUT, ask).await {
                Ok(Ok(ranges)) => primary_port(&ranges, slot) == Some(port),
                _ => false,
            }
        });
        if futures::future::join_all(asks)
            .await
            .into_iter()
            .all(|named| named)
        {
            return Some(started.elapsed().as_millis() as i64);
        }
        tokio::time::sleep(SENTINEL_POLL).await;
    }
    None
}

/// The port of the primary `CLUSTER SLOTS` names for `slot`.
fn primary_port(ranges: &[Vec<Value>], slot: u16) -> Option<u16> {
    let number = |value: &Value| match value {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    ranges.iter().find_map(|range| match range.as_slice() {
        [first, last, Value::Array(primary), ..]
            if (number(first)?..=number(last)?).contains(&slot) =>
        {
            primary.get(1).and_then(number)
        }
        _ => None,
    })
}
