//! Coalescing a shared connection's writes under concurrency.
//!
//! A multiplexed connection writes what its queue holds each time its
//! driver task runs. A request sent while the driver is idle wakes it, and
//! on a multi-threaded runtime the driver then tends to run at once and
//! write that one request: with many tasks on their own locks, the client
//! and the server each pay a socket call for every few commands. redis-rs's
//! `ClusterConnection` writes fewer times because every request goes
//! through one task first, which hands the connections all that queued
//! meanwhile in one go; that hop costs a lone request its latency.
//!
//! A [`Pipe`] takes the hop only when it pays: a request that finds none
//! other in flight on its connection goes straight to the connection; one
//! that finds others goes to the connection's forwarding task, which hands
//! over all that queued since it last ran in one poll, so the driver finds
//! them together and writes them in one call (measured in `BENCHMARKS.md`:
//! 64 tasks through a cluster, about a third less client CPU per
//! lock+unlock).
//!
//! Order: commands on one connection are applied in the order they reach
//! it, and a later request must not overtake an earlier one (a rollback
//! follows the acquire it undoes). A request counts as in flight from the
//! moment it is sent until its reply, so while any request is queued, every
//! later one queues behind it; a request goes straight to the connection
//! only when nothing is queued or in flight. (Two requests made at the same
//! moment by two tasks have no order to keep: either may go first.)
//!
//! A caller that goes away: a request dropped before the forwarding task
//! takes it is not sent, as redis-rs does not write a request whose caller
//! left before its driver took it; one taken is sent, and its reply dropped.
//!
//! Nagle's algorithm: on a socket without `TCP_NODELAY` the kernel holds
//! small writes back while earlier ones wait for their acknowledgement, so
//! it coalesces them already; the hop would only add its own cost (about a
//! twentieth more client CPU per lock+unlock, measured in `BENCHMARKS.md`).
//! Such a connection's pipe sends every request straight to it
//! ([`Pipe::direct`]).
//!
//! Time: a queued request's caller waits at most the connection's response
//! timeout on its own timer, as a direct request does: the forwarding task
//! runs on the runtime that made the connection, which may have stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, RedisError, RedisFuture, RedisResult, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::coop::unconstrained;

/// How many queued requests the forwarding task takes per wake-up.
const BATCH: usize = 256;

/// A handle on one pooled connection that coalesces its writes under
/// concurrency (see the module docs). Cheap to clone: clones share the
/// connection, its count of requests in flight and its forwarding task.
#[derive(Clone)]
pub(crate) struct Pipe {
    conn: MultiplexedConnection,
    /// The connection's response timeout, which a queued request's caller
    /// keeps too: its forwarding task may not be running.
    response_timeout: Option<Duration>,
    shared: Arc<Shared>,
}

/// What the clones of a [`Pipe`] share.
struct Shared {
    /// Requests sent and not yet answered, queued ones included.
    in_flight: AtomicUsize,
    /// The forwarding task's queue; none for a pipe that never coalesces.
    queue: Option<mpsc::UnboundedSender<Queued>>,
}

/// A request for the forwarding task: the connection to send it on (with
/// the response timeout its caller wants), the request, where its reply
/// goes, and its place in the count of requests in flight.
struct Queued {
    conn: MultiplexedConnection,
    cmd: Cmd,
    reply: oneshot::Sender<RedisResult<Value>>,
    _in_flight: InFlight,
}

/// One request counted in flight until this is dropped.
struct InFlight(Arc<Shared>);

impl InFlight {
    /// Counts a request in; whether none other was in flight.
    fn enter(shared: &Arc<Shared>) -> (InFlight, bool) {
        let before = shared.in_flight.fetch_add(1, Ordering::AcqRel);
        (InFlight(shared.clone()), before == 0)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Pipe {
    /// A pipe over `conn` (made with `response_timeout`), and its
    /// forwarding task on the current runtime (the one that drives `conn`).
    /// The task ends once every clone of the pipe is gone and what was
    /// queued is answered.
    pub(crate) fn start(conn: MultiplexedConnection, response_timeout: Option<Duration>) -> Pipe {
        let (queue, queued) = mpsc::unbounded_channel();
        tokio::spawn(forward(queued));
        Pipe::with_queue(conn, response_timeout, Some(queue))
    }

    /// A pipe over `conn` that sends every request straight to it: for a
    /// socket under Nagle's algorithm, where the kernel coalesces writes.
    pub(crate) fn direct(conn: MultiplexedConnection, response_timeout: Option<Duration>) -> Pipe {
        Pipe::with_queue(conn, response_timeout, None)
    }

    fn with_queue(
        conn: MultiplexedConnection,
        response_timeout: Option<Duration>,
        queue: Option<mpsc::UnboundedSender<Queued>>,
    ) -> Pipe {
        Pipe {
            conn,
            response_timeout,
            shared: Arc::new(Shared {
                in_flight: AtomicUsize::new(0),
                queue,
            }),
        }
    }

    /// This pipe, its requests waiting up to `timeout` for their replies
    /// instead of the connection's response timeout.
    pub(crate) fn with_response_timeout(&self, timeout: Duration) -> Pipe {
        let mut conn = self.conn.clone();
        conn.set_response_timeout(timeout);
        Pipe {
            conn,
            response_timeout: Some(timeout),
            shared: self.shared.clone(),
        }
    }

    /// Whether requests may take the forwarding task's hop.
    #[cfg(test)]
    pub(crate) fn coalesces(&self) -> bool {
        self.shared.queue.is_some()
    }

    async fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        let Some(queue) = &self.shared.queue else {
            return self.conn.send_packed_command(cmd).await;
        };
        let (in_flight, alone) = InFlight::enter(&self.shared);
        if alone {
            let reply = self.conn.send_packed_command(cmd).await;
            drop(in_flight);
            return reply;
        }
        let (reply, replied) = oneshot::channel();
        let queued = Queued {
            conn: self.conn.clone(),
            cmd: cmd.clone(),
            reply,
            _in_flight: in_flight,
        };
        if queue.send(queued).is_err() {
            return Err(task_gone());
        }
        // The caller's own timer: the forwarding task runs on the runtime
        // that made the connection, which may have stopped running (a
        // runtime kept but no longer driven), as a direct request's timer
        // runs on its caller's.
        let answer = match self.response_timeout {
            Some(limit) => match tokio::time::timeout(limit, replied).await {
                Ok(answer) => answer,
                Err(_) => return Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
            },
            None => replied.await,
        };
        answer.unwrap_or_else(|_| Err(task_gone()))
    }
}

/// The forwarding task: hands over what queued in one poll, and polls the
/// requests it handed over until they are answered.
async fn forward(mut queued: mpsc::UnboundedReceiver<Queued>) {
    let mut pending = FuturesUnordered::new();
    let mut batch = Vec::with_capacity(BATCH);
    let mut open = true;
    loop {
        tokio::select! {
            taken = queued.recv_many(&mut batch, BATCH), if open => {
                open = taken > 0;
                // One whose caller left is not sent, as redis-rs does not
                // write one whose caller left before it was written.
                let callers_waiting = batch.drain(..).filter(|request| !request.reply.is_closed());
                for request in callers_waiting {
                    // Unconstrained: a send that found this task's budget
                    // spent would wait for a deferred wake-up while a later
                    // one, polled at once, went ahead of it. Each request
                    // is one send and one reply; the queue's reads keep the
                    // budget, so the task still yields under load.
                    pending.push(unconstrained(async move {
                        let Queued { mut conn, cmd, reply, _in_flight } = request;
                        let answer = conn.send_packed_command(&cmd).await;
                        // Counted out before the caller hears: a caller's
                        // next request then finds this one answered.
                        drop(_in_flight);
                        let _ = reply.send(answer);
                    }));
                }
            }
            Some(()) = pending.next(), if !pending.is_empty() => {}
            else => return,
        }
    }
}

/// The error of a request whose forwarding task is gone (its runtime shut
/// down): the connection is unusable, as its driver is gone too.
fn task_gone() -> RedisError {
    RedisError::from((
        redis::ErrorKind::Io,
        "the connection's forwarding task is gone (its runtime shut down)",
    ))
}

impl ConnectionLike for Pipe {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.send(cmd))
    }

    /// A pipeline goes straight to the connection, so it must find nothing
    /// in flight there (it would overtake what is queued): none is sent on
    /// a connection others share (a new connection's setup is sent before
    /// its pipe exists).
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (_in_flight, alone) = InFlight::enter(&self.shared);
            debug_assert!(alone, "a pipeline on a connection others share");
            self.conn
                .send_packed_commands(pipeline, offset, count)
                .await
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use multilock_testkit::{RedisProcess, TestServer};
    use redis::aio::ConnectionLike;

    use super::*;

    async fn pipe_to(server: &RedisProcess) -> Pipe {
        let client = redis::Client::open(server.url()).unwrap();
        Pipe::start(
            client.get_multiplexed_async_connection().await.unwrap(),
            None,
        )
    }

    async fn get(pipe: &mut Pipe) -> Option<i64> {
        redis::cmd("GET").arg("k").query_async(pipe).await.unwrap()
    }

    fn push(entry: &str) -> Cmd {
        let mut cmd = redis::cmd("RPUSH");
        cmd.arg("log").arg(entry);
        cmd
    }

    fn set(value: i64) -> Cmd {
        let mut cmd = redis::cmd("SET");
        cmd.arg("k").arg(value);
        cmd
    }

    /// A request queued behind another stays ahead of every later one: a
    /// rollback sent after an acquire still queued must reach the server
    /// after it, or it finds nothing to undo and the acquire's hold stays.
    ///
    /// Runs on one thread: the forwarding task runs only when the test
    /// yields, so the later request is made while the other is queued and
    /// the connection has nothing else in flight (the first request's
    /// caller left before it was written: redis-rs does not send it).
    #[tokio::test]
    async fn a_queued_request_stays_ahead_of_later_ones() {
        let server = RedisProcess::start().await.unwrap();
        let pipe = pipe_to(&server).await;
        let (mut first, mut queued, mut later) = (pipe.clone(), pipe.clone(), pipe.clone());
        let (set_0, set_1) = (set(0), set(1));
        let mut in_flight = first.req_packed_command(&set_0);
        assert!(futures::poll!(&mut in_flight).is_pending());
        // Finds one in flight: queued.
        let mut waiting = queued.req_packed_command(&set_1);
        assert!(futures::poll!(&mut waiting).is_pending());
        drop(in_flight);
        let value: Option<i64> = get(&mut later).await;
        assert_eq!(value, Some(1), "the later GET overtook the queued SET");
        assert_eq!(waiting.await.unwrap(), Value::Okay);
    }

    /// A queued request whose caller left before the forwarding task took it
    /// is not sent, as redis-rs does not write one whose caller left.
    #[tokio::test]
    async fn a_queued_request_whose_caller_left_is_not_sent() {
        let server = RedisProcess::start().await.unwrap();
        let pipe = pipe_to(&server).await;
        let (mut first, mut queued, mut later) = (pipe.clone(), pipe.clone(), pipe.clone());
        let (set_0, set_1) = (set(0), set(1));
        let mut in_flight = first.req_packed_command(&set_0);
        assert!(futures::poll!(&mut in_flight).is_pending());
        let mut left = queued.req_packed_command(&set_1);
        assert!(futures::poll!(&mut left).is_pending());
        drop(left);
        assert_eq!(in_flight.await.unwrap(), Value::Okay);
        assert_eq!(get(&mut later).await, Some(0));
        assert_eq!(pipe.shared.in_flight.load(Ordering::Acquire), 0);
    }

    /// Requests queued at once leave in the order they were queued, however
    /// many: a send that found the forwarding task's cooperative budget
    /// spent must not wait while a later request goes ahead of it.
    #[tokio::test]
    async fn queued_requests_leave_in_order_however_many() {
        let server = RedisProcess::start().await.unwrap();
        let client = redis::Client::open(server.url()).unwrap();
        // Room for every request in the connection's own queue: only the
        // forwarding task decides their order.
        let config = redis::AsyncConnectionConfig::new().set_pipeline_buffer_size(1024);
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap();
        let pipe = Pipe::start(conn, None);
        let mut first = pipe.clone();
        let ping = redis::cmd("PING");
        let mut in_flight = first.req_packed_command(&ping);
        assert!(futures::poll!(&mut in_flight).is_pending());
        let pushes: Vec<Cmd> = (0..256).map(|i| push(&i.to_string())).collect();
        let mut pipes = vec![pipe.clone(); pushes.len()];
        let mut queued: Vec<_> = pipes
            .iter_mut()
            .zip(&pushes)
            .map(|(pipe, push)| pipe.req_packed_command(push))
            .collect();
        for request in &mut queued {
            assert!(futures::poll!(&mut *request).is_pending());
        }
        // Queued while the forwarding task works through the others.
        let mut late = pipe.clone();
        let late = tokio::spawn(async move { late.req_packed_command(&push("late")).await });
        for request in queued {
            request.await.unwrap();
        }
        in_flight.await.unwrap();
        late.await.unwrap().unwrap();
        let log: Vec<String> = redis::cmd("LRANGE")
            .arg("log")
            .arg(0)
            .arg(-1)
            .query_async(&mut pipe.clone())
            .await
            .unwrap();
        assert_eq!(log.len(), 257);
        let at = log.iter().position(|entry| entry == "late");
        assert_eq!(at, Some(256), "the late request overtook queued ones");
    }

    /// A queued request keeps its caller's response timeout when the
    /// runtime that made the connection is kept but no longer driven (its
    /// forwarding task never runs): it fails as a direct request does, it
    /// does not wait without end.
    #[tokio::test]
    async fn a_queued_request_times_out_when_its_connection_runtime_stands_still() {
        let server = RedisProcess::start().await.unwrap();
        let timeout = Duration::from_millis(200);
        let home = IdleHome::start(server.url(), Some(timeout));
        let (mut direct, mut queued) = (home.pipe.clone(), home.pipe.clone());
        let ping = redis::cmd("PING");
        let both = futures::future::join(
            direct.req_packed_command(&ping),
            queued.req_packed_command(&ping),
        );
        let answers = tokio::time::timeout(Duration::from_secs(5), both).await;
        home.shut_down();
        let (direct, queued) = answers.expect("a request waited past its response timeout");
        assert!(direct.is_err(), "{direct:?}");
        assert!(
            queued.as_ref().is_err_and(RedisError::is_timeout),
            "{queued:?}"
        );
    }

    /// A queued request whose forwarding task is dropped before answering
    /// it (its runtime shut down) fails at once: it has no timer of its own
    /// here, so without an answer from the dropped task it would wait
    /// without end.
    #[tokio::test]
    async fn a_queued_request_fails_when_its_connection_runtime_shuts_down() {
        let server = RedisProcess::start().await.unwrap();
        let home = IdleHome::start(server.url(), None);
        let (mut first, mut queued) = (home.pipe.clone(), home.pipe.clone());
        let ping = redis::cmd("PING");
        let mut in_flight = first.req_packed_command(&ping);
        assert!(futures::poll!(&mut in_flight).is_pending());
        let mut waiting = queued.req_packed_command(&ping);
        assert!(futures::poll!(&mut waiting).is_pending());
        home.shut_down();
        let answer = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("a request queued on a dropped forwarding task waited on");
        assert!(answer.is_err(), "{answer:?}");
    }

    /// A pipe made on a current-thread runtime of its own thread, which is
    /// kept and never driven again (its connection's driver and forwarding
    /// task stand still) until [`IdleHome::shut_down`] drops it.
    struct IdleHome {
        pipe: Pipe,
        stop: std::sync::mpsc::Sender<()>,
        thread: std::thread::JoinHandle<()>,
    }

    impl IdleHome {
        fn start(url: String, timeout: Option<Duration>) -> IdleHome {
            let (made, pipe) = std::sync::mpsc::channel();
            let (stop, stopped) = std::sync::mpsc::channel::<()>();
            let thread = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let pipe = runtime.block_on(async {
                    let client = redis::Client::open(url).unwrap();
                    let config = redis::AsyncConnectionConfig::new().set_response_timeout(timeout);
                    let conn = client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .unwrap();
                    Pipe::start(conn, timeout)
                });
                made.send(pipe).unwrap();
                let _ = stopped.recv();
                drop(runtime);
            });
            let pipe = pipe.recv().unwrap();
            IdleHome { pipe, stop, thread }
        }

        /// Drops the runtime, and with it the connection's tasks.
        fn shut_down(self) {
            self.stop.send(()).unwrap();
            self.thread.join().unwrap();
        }
    }

    /// Many tasks on one pipe, each with requests one after another: every
    /// reply reaches the request it answers, queued or not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_reply_reaches_its_request_under_concurrency() {
        let server = RedisProcess::start().await.unwrap();
        let coalescing = pipe_to(&server).await;
        let client = redis::Client::open(server.url()).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        for (kind, pipe) in [
            ("coalescing", coalescing),
            ("direct", Pipe::direct(conn, None)),
        ] {
            replies_reach_their_requests(kind, pipe).await;
        }
    }

    async fn replies_reach_their_requests(kind: &'static str, pipe: Pipe) {
        let tasks: Vec<_> = (0..64)
            .map(|task| {
                let mut pipe = pipe.clone();
                tokio::spawn(async move {
                    let key = format!("counter:{kind}:{task}");
                    for expected in 1..=50_i64 {
                        let value: i64 = redis::cmd("INCR")
                            .arg(&key)
                            .query_async(&mut pipe)
                            .await
                            .unwrap();
                        assert_eq!(value, expected, "{key}: a reply of another request");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(pipe.shared.in_flight.load(Ordering::Acquire), 0);
    }
}
