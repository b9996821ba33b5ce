//! The slot map by vote: every node asked gives its view, and for each slot
//! the claim of the primary with the highest config epoch wins, as Redis
//! Cluster itself settles who serves a slot.
//!
//! Why not the first answer: a primary cut off on a minority side keeps
//! claiming its slots, at the epoch it had before the failover that
//! replaced it, and answers `CLUSTER SLOTS` as readily as any node. Trusted
//! first, it would send the lock's requests to a server that refuses them
//! (`CLUSTERDOWN`) or, within its node timeout, applies them where the
//! cluster no longer looks.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo, RedisResult, Value};

use super::slots::{SLOTS, SlotRange, parse_slots};
use crate::node::ShardSettings;

/// One node's answer: its id, the ranges it lists, and the config epoch it
/// knows for each primary.
#[derive(Debug, Default)]
pub(super) struct Answer {
    /// The answering node's id (`myself` in `CLUSTER NODES`).
    pub(super) id: String,
    pub(super) ranges: Vec<SlotRange>,
    /// By node id, from `CLUSTER NODES`.
    pub(super) epochs: HashMap<String, u64>,
    /// The server's major version.
    pub(super) version: Option<u32>,
}

/// The answers gathered so far.
#[derive(Debug, Default)]
pub(super) struct Ballot {
    answers: Vec<Answer>,
}

/// The claim a slot goes to: the claiming primary's epoch, and which
/// answer's range made it.
#[derive(Clone, Copy)]
struct Claim {
    epoch: u64,
    answer: usize,
    range: usize,
}

impl Ballot {
    pub(super) fn add(&mut self, answer: Answer) {
        self.answers.push(answer);
    }

    /// Each slot's claim of highest epoch (the earliest answer's on a tie,
    /// which Redis does not leave standing), as ranges.
    pub(super) fn tally(&self) -> Vec<SlotRange> {
        let mut won: Vec<Option<Claim>> = vec![None; SLOTS];
        for (answer_index, answer) in self.answers.iter().enumerate() {
            for (range_index, range) in answer.ranges.iter().enumerate() {
                let epoch = answer.epochs.get(&range.id).copied().unwrap_or(0);
                let claim = Claim {
                    epoch,
                    answer: answer_index,
                    range: range_index,
                };
                let last = usize::from(range.last).min(SLOTS - 1);
                for slot in won.iter_mut().take(last + 1).skip(usize::from(range.first)) {
                    if slot.is_none_or(|held| held.epoch < epoch) {
                        *slot = Some(claim);
                    }
                }
            }
        }
        let range_of = |claim: Claim| &self.answers[claim.answer].ranges[claim.range];
        let mut ranges: Vec<SlotRange> = Vec::new();
        for (slot, claim) in won.into_iter().enumerate() {
            let Some(claim) = claim else { continue };
            let winner = range_of(claim);
            match ranges.last_mut() {
                Some(open)
                    if usize::from(open.last) + 1 == slot
                        && (&open.host, open.port) == (&winner.host, winner.port) =>
                {
                    open.last = slot as u16;
                }
                _ => ranges.push(SlotRange {
                    first: slot as u16,
                    last: slot as u16,
                    ..winner.clone()
                }),
            }
        }
        ranges
    }

    /// Whether more than half of the primaries the tally names have
    /// answered themselves: a primary replaced on the majority side is
    /// then outvoted by a node that saw it replaced, and the nodes still
    /// silent (frozen, or far) need not be waited for.
    pub(super) fn decided(&self) -> bool {
        let primaries: HashSet<String> = self.tally().into_iter().map(|r| r.id).collect();
        // Distinct nodes: one asked under two names answers twice.
        let answered: HashSet<&str> = self
            .answers
            .iter()
            .filter(|a| !a.id.is_empty() && primaries.contains(&a.id))
            .map(|a| a.id.as_str())
            .collect();
        !primaries.is_empty() && answered.len() * 2 > primaries.len()
    }

    /// The lowest server version among the answers: sharded pub/sub only
    /// when every server asked has it.
    pub(super) fn version(&self) -> Option<u32> {
        self.answers.iter().filter_map(|a| a.version).min()
    }
}

/// The connections the votes ask on, one per node asked, kept from one
/// vote to the next: the map is polled every second (ten times a second
/// while a change settles), and a connection per node per poll would cost
/// a handshake (TLS and `AUTH` too) each time. A connection that failed
/// is dropped and opened afresh on the next vote.
#[derive(Default)]
pub(super) struct Voters {
    by_addr: Mutex<HashMap<String, MultiplexedConnection>>,
}

impl Voters {
    /// One node's view: `CLUSTER SLOTS` (the ranges, at the addresses
    /// clients are to use), `CLUSTER NODES` (each primary's config epoch)
    /// and the server's major version.
    pub(super) async fn ask(
        &self,
        info: ConnectionInfo,
        settings: &ShardSettings,
    ) -> RedisResult<Answer> {
        let addr = crate::node::addr_of(&info);
        let asked_host = match info.addr() {
            ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host.clone(),
            _ => String::new(),
        };
        let mut kept = self.connections().get(&addr).cloned();
        let (slots, nodes, server) = loop {
            let fresh = kept.is_none();
            let mut conn = match kept.take() {
                Some(conn) => conn,
                None => self.open(&addr, &info, settings).await?,
            };
            let asked: RedisResult<(Value, String, String)> = redis::pipe()
                .cmd("CLUSTER")
                .arg("SLOTS")
                .cmd("CLUSTER")
                .arg("NODES")
                .cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await;
            match asked {
                Ok(view) => break view,
                Err(err) => {
                    self.connections().remove(&addr);
                    // A kept connection may have closed with its server or
                    // with the runtime that drove it: once more, afresh.
                    if fresh || !err.is_connection_dropped() {
                        return Err(err);
                    }
                }
            }
        };
        let version = server
            .lines()
            .find_map(|line| line.strip_prefix("redis_version:"))
            .and_then(|v| v.trim().split('.').next()?.parse().ok());
        let (id, epochs) = parse_nodes(&nodes);
        Ok(Answer {
            id,
            ranges: parse_slots(&slots, &asked_host),
            epochs,
            version,
        })
    }

    async fn open(
        &self,
        addr: &str,
        info: &ConnectionInfo,
        settings: &ShardSettings,
    ) -> RedisResult<MultiplexedConnection> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.response_timeout));
        let client = crate::node::open_client(info.clone(), settings.tls_root_cert.as_deref())?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        self.connections().insert(addr.to_owned(), conn.clone());
        Ok(conn)
    }

    /// Closes the connections to nodes no longer asked.
    pub(super) fn keep_only(&self, asked: &HashSet<String>) {
        self.connections().retain(|addr, _| asked.contains(addr));
    }

    fn connections(&self) -> MutexGuard<'_, HashMap<String, MultiplexedConnection>> {
        // Nothing panics while holding it.
        self.by_addr.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The answering node's id and each primary's config epoch, from a `CLUSTER
/// NODES` reply: `<id> <ip:port@cport[,hostname]> <flags> <primary>
/// <ping-sent> <pong-recv> <config-epoch> <link-state> <slot>...` a line.
pub(super) fn parse_nodes(reply: &str) -> (String, HashMap<String, u64>) {
    let mut myself = String::new();
    let mut epochs = HashMap::new();
    for line in reply.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(id), Some(flags), Some(epoch)) = (fields.first(), fields.get(2), fields.get(6))
        else {
            continue;
        };
        let flags: Vec<&str> = flags.split(',').collect();
        if flags.contains(&"myself") {
            (*id).clone_into(&mut myself);
        }
        if flags.contains(&"handshake") || flags.contains(&"noaddr") {
            continue;
        }
        if let Ok(epoch) = epoch.parse() {
            epochs.insert((*id).to_owned(), epoch);
        }
    }
    (myself, epochs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first: u16, last: u16, port: u16, id: &str) -> SlotRange {
        SlotRange {
            first,
            last,
            host: "127.0.0.1".to_owned(),
            port,
            id: id.to_owned(),
        }
    }

    fn answer(id: &str, ranges: Vec<SlotRange>, epochs: &[(&str, u64)]) -> Answer {
        Answer {
            id: id.to_owned(),
            ranges,
            epochs: epochs.iter().map(|(i, e)| ((*i).to_owned(), *e)).collect(),
            version: Some(7),
        }
    }

    /// A: the primary cut off, still claiming 0-5460 at epoch 1; R: its
    /// replica, promoted at epoch 7 on the majority side.
    fn stale_and_promoted() -> (Answer, Answer, Answer) {
        let stale = answer(
            "a",
            vec![range(0, 5460, 7000, "a"), range(5461, 16383, 7001, "b")],
            &[("a", 1), ("b", 2)],
        );
        let majority = |me: &str| {
            answer(
                me,
                vec![range(0, 5460, 7003, "r"), range(5461, 16383, 7001, "b")],
                &[("a", 1), ("b", 2), ("r", 7)],
            )
        };
        (stale, majority("b"), majority("r"))
    }

    #[test]
    fn the_highest_epoch_wins_whoever_answered_first() {
        let (stale, b, _) = stale_and_promoted();
        let mut ballot = Ballot::default();
        ballot.add(stale);
        assert_eq!(ballot.tally()[0].port, 7000, "alone, the stale view is all");
        ballot.add(b);
        let tally = ballot.tally();
        assert_eq!(tally.len(), 2, "{tally:?}");
        assert_eq!(
            (tally[0].first, tally[0].last, tally[0].port),
            (0, 5460, 7003)
        );
        assert_eq!(tally[0].id, "r");
        assert_eq!(
            (tally[1].first, tally[1].last, tally[1].port),
            (5461, 16383, 7001)
        );
    }

    #[test]
    fn a_ballot_is_decided_by_a_majority_of_the_primaries_it_names() {
        let (stale, b, r) = stale_and_promoted();
        let mut ballot = Ballot::default();
        ballot.add(stale);
        // The stale primary names itself and b: one of two is no majority.
        assert!(!ballot.decided());
        ballot.add(b);
        // Now r and b are the primaries; b answered, r did not.
        assert!(!ballot.decided());
        ballot.add(r);
        assert!(ballot.decided());
    }

    /// One server asked under two names (a seed's hostname, the map's
    /// address) answers twice, and is one vote.
    #[test]
    fn one_node_answering_twice_is_one_vote() {
        let three_shards = || {
            let ranges = vec![
                range(0, 5460, 7000, "a"),
                range(5461, 10922, 7001, "b"),
                range(10923, 16383, 7002, "c"),
            ];
            answer("a", ranges, &[("a", 1), ("b", 2), ("c", 3)])
        };
        let mut ballot = Ballot::default();
        ballot.add(three_shards());
        ballot.add(three_shards());
        assert!(!ballot.decided(), "one node of three decided the vote");
    }

    #[test]
    fn slots_nobody_else_claims_keep_a_lower_claim() {
        let low = answer("a", vec![range(0, 99, 7000, "a")], &[("a", 1)]);
        let high = answer("b", vec![range(50, 16383, 7001, "b")], &[("b", 5)]);
        let mut ballot = Ballot::default();
        ballot.add(low);
        ballot.add(high);
        let tally = ballot.tally();
        assert_eq!(
            (tally[0].first, tally[0].last, tally[0].port),
            (0, 49, 7000)
        );
        assert_eq!((tally[1].first, tally[1].last), (50, 16383));
    }

    #[test]
    fn cluster_nodes_lines_give_the_epochs_and_who_answered() {
        let reply = "\
07c3 127.0.0.1:30004@31004,host-a slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
292f 127.0.0.1:30003@31003 master - 0 1426238318243 3 connected 10923-16383 [93->-e7d1]
e7d1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460
ffff :0@0 handshake - 0 0 0 disconnected
";
        let (myself, epochs) = parse_nodes(reply);
        assert_eq!(myself, "e7d1");
        assert_eq!(epochs.get("67ed"), Some(&2));
        assert_eq!(epochs.get("292f"), Some(&3));
        assert_eq!(epochs.get("e7d1"), Some(&1));
        assert_eq!(epochs.get("ffff"), None);
    }
}
