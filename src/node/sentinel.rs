//! A node that is the primary of a Sentinel group: which server that is,
//! as the sentinels say, followed across failovers.
//!
//! The sentinels are asked `SENTINEL GET-MASTER-ADDR-BY-NAME` about once a
//! second, as Redisson does; at once, then every 100 ms for a while, when a
//! sentinel publishes `+switch-master` (each sentinel connection subscribes
//! to it), a connection to the primary is lost or it answers `READONLY`;
//! and before every new connection. All sentinels are asked at once; the
//! primary named by a majority of them wins as soon as their answers are in
//! (a paused minority costs nothing), else the one most of those who
//! answered name, the known one on a tie. A new primary bumps the node's
//! epoch: every connection of the old one is unusable from then on, so no
//! lock is written there once the switch is known, and the subscription
//! moves (its waiters re-check).
//!
//! Why not redis-rs's `Sentinel`: it takes the first sentinel, in the
//! configured order, whose named master answers `ROLE` as a master. For
//! 10-20 s after a failover the demoted primary still does, so a sentinel
//! that missed the failover, listed first, would send the node back to it.
//! It does not follow failovers either (redis-rs #1438): something must
//! poll, and compare answers, anyway.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult};
use tokio::sync::watch;

use super::poller::{Nudge, Poller};

#[cfg(test)]
impl SentinelPrimary {
    /// How the data nodes are connected to, but for the address.
    pub(crate) fn data_template(&self) -> &ConnectionInfo {
        &self.data
    }
}

/// The primary of one master name, as its sentinels name it.
pub(crate) struct SentinelPrimary {
    /// The node's name in logs: `sentinel/<master>@<lowest sentinel>`.
    node: String,
    master: String,
    sentinels: Vec<SentinelLink>,
    /// How to connect to a data node: everything but the address.
    data: ConnectionInfo,
    data_tls: bool,
    data_root_cert: Option<Vec<u8>>,
    connect_timeout: Duration,
    response_timeout: Duration,
    current: Mutex<Option<Primary>>,
    epoch: AtomicU64,
    switched: watch::Sender<u64>,
    /// Asks the sentinels about once a second, and at once when told.
    poller: Poller,
}

#[derive(Clone)]
struct Primary {
    host: String,
    port: u16,
    client: redis::Client,
}

/// One sentinel and the connection it is asked on.
struct SentinelLink {
    addr: String,
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
}

/// What building a [`SentinelPrimary`] takes; see `NodeBuilder`.
pub(crate) struct SentinelSettings {
    pub(crate) master: String,
    pub(crate) sentinels: Vec<ConnectionInfo>,
    pub(crate) data: ConnectionInfo,
    pub(crate) data_tls: bool,
    /// A certificate authority (PEM) the data nodes' TLS may be signed by.
    pub(crate) data_root_cert: Option<Vec<u8>>,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

impl SentinelPrimary {
    pub(crate) fn new(settings: SentinelSettings) -> RedisResult<SentinelPrimary> {
        let sentinels = settings
            .sentinels
            .into_iter()
            .map(|info| {
                let addr = super::addr_of(&info);
                let client = redis::Client::open(info)?;
                Ok(SentinelLink {
                    addr,
                    client,
                    conn: tokio::sync::Mutex::new(None),
                })
            })
            .collect::<RedisResult<Vec<_>>>()?;
        // Named by the master name and the lowest sentinel address: groups
        // that share the default name "mymaster" are still told apart (a
        // RedLock refuses the same node twice), in whatever order the
        // sentinels were listed.
        let first = sentinels
            .iter()
            .map(|s| s.addr.as_str())
            .min()
            .unwrap_or("");
        Ok(SentinelPrimary {
            node: format!("sentinel/{}@{first}", settings.master),
            master: settings.master,
            sentinels,
            data: settings.data,
            data_tls: settings.data_tls,
            data_root_cert: settings.data_root_cert,
            connect_timeout: settings.connect_timeout,
            response_timeout: settings.response_timeout,
            current: Mutex::new(None),
            epoch: AtomicU64::new(0),
            switched: watch::channel(0).0,
            poller: Poller::new(),
        })
    }

    /// Which switch of primary this is: connections of another are stale.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Follows [`SentinelPrimary::epoch`].
    pub(crate) fn switches(&self) -> watch::Receiver<u64> {
        self.switched.subscribe()
    }

    /// Asks the sentinels now, then fast for a while: a failover may be
    /// under way.
    pub(crate) fn check_soon(&self) {
        self.poller.check_soon();
    }

    /// The primary's client, as the sentinels name it now, and the epoch.
    /// When no sentinel answers within half the connect timeout (the
    /// connection must still be made within it), the primary known so far
    /// (its connections check `ROLE`), or an error of kind
    /// `MasterNameNotFoundBySentinel` when none is known.
    pub(crate) async fn resolve(self: &Arc<Self>) -> RedisResult<(redis::Client, u64)> {
        self.start_poller();
        let asked = tokio::time::timeout(self.connect_timeout / 2, self.ask_sentinels()).await;
        let asked = asked.unwrap_or_else(|_| {
            Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no sentinel answered in time",
                self.node.clone(),
            )))
        });
        match asked {
            Ok(named) => Ok(self.switch_to(named)),
            Err(err) => {
                let known = self.current.lock().unwrap().clone();
                match known {
                    Some(primary) => {
                        tracing::debug!(node = %self.node, error = %err, "no sentinel answered; keeping the known primary");
                        Ok((primary.client, self.epoch()))
                    }
                    None => Err(err),
                }
            }
        }
    }

    /// Makes `named` the primary if it is not already; returns its client
    /// and the epoch.
    fn switch_to(&self, named: (String, u16)) -> (redis::Client, u64) {
        let mut current = self.current.lock().unwrap();
        if let Some(primary) = current
            .as_ref()
            .filter(|p| (p.host.as_str(), p.port) == (named.0.as_str(), named.1))
        {
            return (primary.client.clone(), self.epoch());
        }
        let (host, port) = named;
        let addr = match self.data_tls {
            false => ConnectionAddr::Tcp(host.clone(), port),
            true => ConnectionAddr::TcpTls {
                host: host.clone(),
                port,
                insecure: false,
                tls_params: None,
            },
        };
        let info = self.data.clone().set_addr(addr);
        // Opening a client does no I/O and cannot fail for a TCP address
        // (a root certificate was checked when the node was built).
        let client = super::open_client(info, self.data_root_cert.as_deref())
            .expect("a TCP connection info");
        let from = current
            .as_ref()
            .map(|p| format!("{}:{}", p.host, p.port))
            .unwrap_or_else(|| "none".to_owned());
        tracing::info!(node = %self.node, from, to = %format!("{host}:{port}"), "the sentinels name a new primary");
        *current = Some(Primary {
            host,
            port,
            client: client.clone(),
        });
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        drop(current);
        self.switched.send_replace(epoch);
        crate::metrics::primary_switched(&self.node);
        (client, epoch)
    }

    /// Asks every sentinel at once; returns the primary a majority names
    /// as soon as they have, else, once all have answered or failed, the
    /// one most name (the known one on a tie).
    async fn ask_sentinels(&self) -> RedisResult<(String, u16)> {
        let majority = self.sentinels.len() / 2 + 1;
        let mut asks: FuturesUnordered<_> = self.sentinels.iter().map(|s| self.ask(s)).collect();
        let mut votes: HashMap<(String, u16), usize> = HashMap::new();
        let mut last_err = None;
        while let Some(answer) = asks.next().await {
            match answer {
                Ok(named) => {
                    let count = votes.entry(named.clone()).or_default();
                    *count += 1;
                    if *count >= majority {
                        return Ok(named);
                    }
                }
                Err(err) => last_err = Some(err),
            }
        }
        let known = self
            .current
            .lock()
            .unwrap()
            .as_ref()
            .map(|p| (p.host.clone(), p.port));
        match (most_named(votes, known.as_ref()), last_err) {
            (Some(named), _) => Ok(named),
            (None, Some(err)) => Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no sentinel answered",
                format!("{}: {err}", self.node),
            ))),
            (None, None) => Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no sentinel names a primary",
                self.node.clone(),
            ))),
        }
    }

    /// One sentinel's answer, on its cached connection (made again after a
    /// failure). A sentinel that does not know the master name fails.
    async fn ask(&self, sentinel: &SentinelLink) -> RedisResult<(String, u16)> {
        let attempt = async {
            let mut cached = sentinel.conn.lock().await;
            let conn = match cached.as_mut() {
                Some(conn) => conn,
                None => {
                    let notice = SwitchNotice(self.poller.nudge());
                    let config = redis::AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(self.response_timeout))
                        .set_response_timeout(Some(self.response_timeout))
                        .set_push_sender(notice);
                    let mut conn = sentinel
                        .client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?;
                    // Told of a failover the moment this sentinel switches,
                    // between polls; without it, polling still finds it.
                    if let Err(err) = conn.subscribe("+switch-master").await {
                        tracing::debug!(node = %self.node, sentinel = %sentinel.addr, error = %err, "no +switch-master subscription");
                    }
                    cached.insert(conn)
                }
            };
            let reply: RedisResult<Option<(String, u16)>> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.master)
                .query_async(conn)
                .await;
            if reply.is_err() {
                *cached = None;
            }
            reply?.ok_or_else(|| {
                RedisError::from((
                    ErrorKind::MasterNameNotFoundBySentinel,
                    "the sentinel does not know the master name",
                    sentinel.addr.clone(),
                ))
            })
        };
        // Bounded twice over: a paused sentinel accepts the connection and
        // then says nothing.
        match tokio::time::timeout(self.response_timeout * 2, attempt).await {
            Ok(answer) => answer,
            Err(_) => {
                *sentinel.conn.lock().await = None;
                Err(RedisError::from((
                    ErrorKind::Io,
                    "the sentinel did not answer in time",
                    sentinel.addr.clone(),
                )))
            }
        }
    }

    /// Starts the poller on the current runtime unless it runs.
    fn start_poller(self: &Arc<Self>) {
        self.poller.start(self, |primary: Arc<SentinelPrimary>| async move {
            match primary.ask_sentinels().await {
                Ok(named) => drop(primary.switch_to(named)),
                Err(err) => {
                    tracing::debug!(node = %primary.node, error = %err, "no sentinel named the primary")
                }
            }
        });
    }
}

/// The primary most sentinels named; on a tie the `known` one if it is
/// among the most named, else the lowest address (any fixed rule: every
/// client of the group then picks the same).
fn most_named(
    votes: HashMap<(String, u16), usize>,
    known: Option<&(String, u16)>,
) -> Option<(String, u16)> {
    let most = votes.values().copied().max()?;
    let mut tied: Vec<(String, u16)> = votes
        .into_iter()
        .filter(|(_, n)| *n == most)
        .map(|(named, _)| named)
        .collect();
    if let Some(known) = known.filter(|k| tied.contains(k)) {
        return Some(known.clone());
    }
    tied.sort();
    tied.into_iter().next()
}

/// Hears a sentinel's `+switch-master` (the only channel its connection
/// subscribes): the poller asks at once, then fast.
struct SwitchNotice(Arc<Nudge>);

impl redis::aio::AsyncPushSender for SwitchNotice {
    fn send(&self, info: redis::PushInfo) -> Result<(), redis::aio::SendError> {
        if info.kind == redis::PushKind::Message {
            self.0.check_soon();
        }
        Ok(())
    }
}

/// A Sentinel node's part of a `NodeBuilder`.
#[derive(Clone, Default)]
pub(crate) struct SentinelSource {
    pub(super) master: String,
    pub(super) sentinel_urls: Vec<String>,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) database: i64,
    pub(super) tls: bool,
}

impl std::fmt::Debug for SentinelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self
            .sentinel_urls
            .iter()
            .map(|u| super::redact_url(u))
            .collect();
        f.debug_struct("SentinelSource")
            .field("master", &self.master)
            .field("sentinel_urls", &urls)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("database", &self.database)
            .field("tls", &self.tls)
            .finish()
    }
}

impl SentinelSource {
    /// Validates the settings; the node's name and the primary its
    /// connections go to (the builder makes it the node's target).
    pub(crate) fn primary(
        &self,
        node: &super::ShardSettings,
    ) -> crate::Result<(String, Arc<SentinelPrimary>)> {
        use crate::Error;
        if self.master.is_empty() {
            return Err(Error::invalid("the Sentinel master name must not be empty"));
        }
        if self.sentinel_urls.is_empty() {
            return Err(Error::invalid(
                "a Sentinel node needs at least one sentinel URL",
            ));
        }
        if self.tls && !cfg!(feature = "tls") {
            return Err(Error::invalid(
                "TLS to the data nodes: enable the `tls` feature of multilock",
            ));
        }
        let sentinels = self
            .sentinel_urls
            .iter()
            .map(|url| super::connection_info(url))
            .collect::<crate::Result<Vec<_>>>()?;
        let mut settings = redis::RedisConnectionInfo::default()
            .set_protocol(redis::ProtocolVersion::RESP3)
            .set_db(self.database);
        if let Some(username) = &self.username {
            settings = settings.set_username(username);
        }
        if let Some(password) = &self.password {
            settings = settings.set_password(password);
        }
        // A template: the address is the primary's, once known.
        let data = super::connection_info("redis://127.0.0.1:6379")?
            .set_redis_settings(settings)
            .set_tcp_settings(super::tcp_settings(node.nodelay));
        let primary = SentinelPrimary::new(SentinelSettings {
            master: self.master.clone(),
            sentinels,
            data,
            data_tls: self.tls,
            data_root_cert: node.tls_root_cert.clone(),
            connect_timeout: node.connect_timeout,
            response_timeout: node.response_timeout,
        })
        .map_err(|_| Error::invalid("a sentinel URL is not usable"))?;
        let name = primary.node.clone();
        Ok((name, Arc::new(primary)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn votes(named: &[(&str, u16, usize)]) -> HashMap<(String, u16), usize> {
        named
            .iter()
            .map(|&(host, port, n)| ((host.to_owned(), port), n))
            .collect()
    }

    #[test]
    fn the_most_named_primary_wins_and_a_tie_keeps_the_known_one() {
        let known = ("10.0.0.1".to_owned(), 6379);
        let fresh = ("10.0.0.2".to_owned(), 6379);
        let split = votes(&[("10.0.0.1", 6379, 1), ("10.0.0.2", 6379, 2)]);
        assert_eq!(most_named(split, Some(&known)), Some(fresh.clone()));
        let tie = votes(&[("10.0.0.1", 6379, 1), ("10.0.0.2", 6379, 1)]);
        assert_eq!(most_named(tie.clone(), Some(&known)), Some(known.clone()));
        assert_eq!(most_named(tie.clone(), Some(&fresh)), Some(fresh));
        assert_eq!(most_named(tie, None), Some(known));
        assert_eq!(most_named(HashMap::new(), None), None);
    }
}
