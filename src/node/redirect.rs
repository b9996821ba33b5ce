//! A Cluster node's request that met an answer proving it did not run:
//! `MOVED` (the slot is served elsewhere now), `ASK` (the slot is being
//! migrated and the key is at the target already), `TRYAGAIN` (a
//! multi-key request whose keys are split by a migration), `CLUSTERDOWN`
//! (a slot without a primary while a failover runs) or `READONLY` (the
//! primary was demoted). It is sent again where the answer says, within the
//! node's response timeout. Any other answer, and a broken connection (an
//! unknown outcome), is the caller's, as on any node.

use std::time::Duration;

use redis::{ErrorKind, RedisResult, ServerErrorKind, Value};
use tokio::time::Instant;

use super::{Conn, Kind, Lane, send};
use crate::node::Node;
use crate::node::target::Target;
use crate::protocol::Request;

/// The most answers followed for one request (the response timeout ends
/// it first: pauses grow to [`MAX_PAUSE`]).
const MAX_FOLLOWED: usize = 64;
/// First pause before sending again after `TRYAGAIN`, `CLUSTERDOWN` or
/// `READONLY`; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// What a cluster's answer asks of the request.
enum Step {
    Moved(String),
    Ask(String),
    /// Again after a pause, on the map's shard for the slot then.
    Retry {
        refresh: bool,
    },
}

impl Step {
    fn of(err: &redis::RedisError) -> Option<Step> {
        match err.kind() {
            ErrorKind::Server(ServerErrorKind::Moved) => {
                Some(Step::Moved(err.redirect_node()?.0.to_owned()))
            }
            ErrorKind::Server(ServerErrorKind::Ask) => {
                Some(Step::Ask(err.redirect_node()?.0.to_owned()))
            }
            ErrorKind::Server(ServerErrorKind::TryAgain) => Some(Step::Retry { refresh: false }),
            ErrorKind::Server(ServerErrorKind::ClusterDown | ServerErrorKind::ReadOnly) => {
                Some(Step::Retry { refresh: true })
            }
            _ => None,
        }
    }
}

/// Whether `reply` is an answer [`Conn::follow`] acts on.
pub(super) fn applies(reply: &RedisResult<Value>) -> bool {
    matches!(reply, Err(err) if Step::of(err).is_some())
}

impl Conn {
    /// Sends `request` again where the cluster's answers say, until it gets
    /// another answer, or the node's response timeout has passed; the
    /// last reply. After a `MOVED` this connection is the new shard's, so a
    /// rollback that follows on it goes there too.
    pub(super) async fn follow(
        &mut self,
        request: &Request,
        (lane, kind): (Lane, Kind),
        mut reply: RedisResult<Value>,
        patience: Option<Duration>,
    ) -> RedisResult<Value> {
        let Target::Shard(shard) = &self.node.inner.target else {
            return reply;
        };
        let Some(map) = shard.map() else {
            return reply;
        };
        let deadline = Instant::now() + self.node.response_timeout();
        let mut pause = FIRST_PAUSE;
        for _ in 0..MAX_FOLLOWED {
            let Some(step) = reply.as_ref().err().and_then(Step::of) else {
                break;
            };
            match step {
                Step::Moved(addr) => {
                    let Some(shard) = map.moved(lane.slot(), &addr) else {
                        break;
                    };
                    if self.move_to(&shard, lane, kind).await.is_err() {
                        break;
                    }
                }
                Step::Ask(addr) => {
                    let Some(target) = map.node_at(&addr) else {
                        break;
                    };
                    reply = ask(&target, request, patience).await;
                    continue;
                }
                Step::Retry { refresh } => {
                    if Instant::now() + pause > deadline {
                        break;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                    if refresh {
                        // A demoted primary's connections go; the map
                        // may name the new one by now.
                        self.broken
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                        // Cut off at the deadline: a vote nobody can
                        // decide (most primaries down) waits far longer.
                        let refresh = map.refresh();
                        let _ = tokio::time::timeout_at(deadline, refresh).await;
                    }
                    if let Some(shard) = map.known_shard(lane.slot())
                        && (shard.id() != self.node.id() || refresh)
                        && self.move_to(&shard, lane, kind).await.is_err()
                    {
                        break;
                    }
                }
            }
            reply = send_within(request, self, patience).await;
            if Instant::now() >= deadline {
                break;
            }
        }
        reply
    }

    /// Makes this a connection of `shard`, of the same kind.
    async fn move_to(&mut self, shard: &Node, lane: Lane, kind: Kind) -> crate::Result<()> {
        let mut conn = match kind {
            Kind::Shared => shard.checkout(lane).await?,
            Kind::Exclusive => shard.checkout_exclusive(lane).await?,
            Kind::DespiteSuspicion => shard.checkout_shared(Some(lane)).await?,
        };
        conn.route = Some((lane, kind));
        *self = conn;
        Ok(())
    }
}

/// `request` on `conn`, waiting up to `patience` when given.
async fn send_within(
    request: &Request,
    conn: &mut Conn,
    patience: Option<Duration>,
) -> RedisResult<Value> {
    match patience {
        None => send(request, &mut conn.conn).await,
        Some(patience) => {
            let mut patient = conn.conn.with_response_timeout(patience);
            send(request, &mut patient).await
        }
    }
}

/// `ASKING`, then `request`, on a connection of `target` nobody else uses
/// meanwhile (`ASKING` holds for the next command on its connection only).
async fn ask(target: &Node, request: &Request, patience: Option<Duration>) -> RedisResult<Value> {
    let mut conn = match target.checkout_exclusive_now().await {
        Ok(conn) => conn,
        Err(err) => return Err(unavailable(err)),
    };
    redis::cmd("ASKING")
        .query_async::<Value>(&mut conn.conn)
        .await?;
    send_within(request, &mut conn, patience).await
}

/// A connection error as redis-rs's, for the reply it stands in for.
fn unavailable(err: crate::Error) -> redis::RedisError {
    redis::RedisError::from((
        ErrorKind::Server(ServerErrorKind::TryAgain),
        "the ASK target gave no connection",
        err.to_string(),
    ))
}
