//! Hash slots, and the slot map as `CLUSTER SLOTS` gives it.

use redis::Value;

/// Hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = crate::protocol::SLOTS as usize;

pub(crate) use crate::protocol::key_slot;

/// The primary of a range of slots, as `CLUSTER SLOTS` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SlotRange {
    pub(super) first: u16,
    pub(super) last: u16,
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) id: String,
}

/// `host:port` (the host may be an IPv6 address) as its parts.
pub(super) fn split_addr(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// The ranges of a `CLUSTER SLOTS` reply: `[first, last, [host, port,
/// id, ...], replicas...]` each. An empty host means the node answering.
pub(super) fn parse_slots(reply: &Value, asked_host: &str) -> Vec<SlotRange> {
    let Value::Array(entries) = reply else {
        return Vec::new();
    };
    let int = |v: Option<&Value>| match v {
        Some(Value::Int(i)) => u16::try_from(*i).ok(),
        _ => None,
    };
    let text = |v: Option<&Value>| match v {
        Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        Some(Value::SimpleString(s)) => Some(s.clone()),
        _ => None,
    };
    entries
        .iter()
        .filter_map(|entry| {
            let Value::Array(parts) = entry else {
                return None;
            };
            let Some(Value::Array(primary)) = parts.get(2) else {
                return None;
            };
            let host = text(primary.first())?;
            Some(SlotRange {
                first: int(parts.first())?,
                last: int(parts.get(1))?,
                host: if host.is_empty() || host == "?" {
                    asked_host.to_owned()
                } else {
                    host
                },
                port: int(primary.get(1))?,
                id: text(primary.get(2)).unwrap_or_default(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
    }

    #[test]
    fn slot_ranges_parse_and_an_empty_host_is_the_asked_node() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![bulk("10.0.0.1"), Value::Int(7000), bulk("abc")]),
                Value::Array(vec![bulk("10.0.0.4"), Value::Int(7003), bulk("def")]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                Value::Array(vec![bulk(""), Value::Int(7001), bulk("ghi")]),
            ]),
        ]);
        let ranges = parse_slots(&reply, "10.9.9.9");
        assert_eq!(ranges.len(), 2);
        assert_eq!(
            (ranges[0].first, ranges[0].last, ranges[0].port),
            (0, 5460, 7000)
        );
        assert_eq!(ranges[0].id, "abc");
        assert_eq!(ranges[1].host, "10.9.9.9");
        assert_eq!(split_addr("::1:7000"), Some(("::1".to_owned(), 7000)));
    }
}
