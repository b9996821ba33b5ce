//! The test kit's TCP proxy as a fault injector, against a real server:
//! latency per direction (precise below tokio's millisecond timer), byte
//! order under jitter, one-way black holes, and cut connections.

use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use crate::common::*;
use multilock_testkit::{ConnectionId, Delay, Direction, TcpProxy, TestServer};
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Generous: a reply that does not come within it is not coming.
const SHORT: Duration = Duration::from_millis(300);

async fn connect(url: &str, response_timeout: Duration) -> MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(response_timeout));
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap_or_else(|err| panic!("cannot connect to {url}: {err}"))
}

async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

/// The median round trip of `n` PINGs one after the other.
async fn median_ping(conn: &mut MultiplexedConnection, n: usize) -> Duration {
    let mut trips = Vec::with_capacity(n);
    for _ in 0..n {
        let sent = Instant::now();
        ping(conn).await.unwrap();
        trips.push(sent.elapsed());
    }
    trips.sort();
    trips[n / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ids(proxy: &TcpProxy) -> Vec<ConnectionId> {
    proxy.connections().iter().map(|c| c.id()).collect()
}

/// Waits until the proxy lists `n` connections; returns their ids.
async fn wait_listed(proxy: &TcpProxy, n: usize) -> Vec<ConnectionId> {
    eventually(
        PATIENCE,
        |seen: &Vec<ConnectionId>| format!("listed {seen:?}, expected {n}"),
        || async {
            let listed = ids(proxy);
            if listed.len() == n {
                Ok(listed)
            } else {
                Err(listed)
            }
        },
    )
    .await
}

/// 0.5 ms each way, set on a connection already open: the median round
/// trip grows by about 1 ms. The delay line, not tokio's 1 ms timer, keeps
/// it near 1 ms rather than 2 to 4.
#[tokio::test]
async fn half_a_millisecond_each_way_adds_a_millisecond_to_the_round_trip() {
    let server = server().await;
    let proxy = TcpProxy::start(server.port()).await.unwrap();
    let mut direct = connect(&server.url(), PATIENCE).await;
    let mut proxied = connect(&proxy.url(), PATIENCE).await;
    median_ping(&mut direct, 20).await; // warm-up
    let direct_median = median_ping(&mut direct, 200).await;
    proxy.set_delay(Direction::Both, Delay::fixed(Duration::from_micros(500)));
    let proxied_median = median_ping(&mut proxied, 200).await;
    eprintln!(
        "median PING: direct {:.3} ms, 0.5 ms each way {:.3} ms",
        ms(direct_median),
        ms(proxied_median)
    );
    assert!(
        proxied_median >= Duration::from_micros(900),
        "{proxied_median:?}"
    );
    assert!(
        proxied_median < Duration::from_millis(3),
        "{proxied_median:?}"
    );
    assert!(
        proxied_median >= direct_median + Duration::from_micros(800),
        "direct {direct_median:?}, proxied {proxied_median:?}"
    );
}

/// The delays benchmarks use, each way and one way, then none again: never
/// shorter than set, not much longer.
#[tokio::test]
async fn delays_hold_from_a_fifth_of_a_millisecond_and_per_direction() {
    let server = server().await;
    let proxy = TcpProxy::start(server.port()).await.unwrap();
    let mut conn = connect(&proxy.url(), PATIENCE).await;
    let undelayed = median_ping(&mut conn, 200).await;
    eprintln!(
        "median PING through the proxy, no delay: {:.3} ms",
        ms(undelayed)
    );
    for micros in [200, 500, 1_000] {
        let one_way = Duration::from_micros(micros);
        proxy.set_delay(Direction::Both, Delay::fixed(one_way));
        let median = median_ping(&mut conn, 200).await;
        eprintln!("median PING, {micros} µs each way: {:.3} ms", ms(median));
        assert!(median >= 2 * one_way, "{micros} µs each way: {median:?}");
        // What the proxy costs undelayed, and room for a busy machine
        // (2.43 ms for 200 µs each way under the suite's own load in CI).
        assert!(
            median < 2 * one_way + undelayed + Duration::from_millis(3),
            "{micros} µs each way: {median:?} (undelayed {undelayed:?})"
        );
    }
    proxy.set_delay(Direction::Both, Delay::NONE);
    proxy.set_delay(Direction::ToServer, Delay::fixed(Duration::from_millis(1)));
    let median = median_ping(&mut conn, 100).await;
    eprintln!("median PING, 1 ms to the server only: {:.3} ms", ms(median));
    assert!(median >= Duration::from_millis(1), "{median:?}");
    let bound = Duration::from_millis(1) + undelayed + Duration::from_millis(3);
    assert!(median < bound, "{median:?} (undelayed {undelayed:?})");
    proxy.set_delay(Direction::ToServer, Delay::NONE);
    let median = median_ping(&mut conn, 100).await;
    assert!(
        median < Duration::from_millis(1),
        "no delay again: {median:?}"
    );
}

/// Jitter larger than the base delay would reorder chunks if each were due
/// at its own now + delay: the replies of 2,000 pipelined INCRs still come
/// back 1 to 2,000, from one redis-rs pipeline and from 2,000 separate
/// small writes (many chunks each way).
#[tokio::test]
async fn jitter_keeps_the_byte_order() {
    let server = server().await;
    let proxy = TcpProxy::start(server.port()).await.unwrap();
    proxy.set_delay(
        Direction::Both,
        Delay::jittered(Duration::from_micros(200), Duration::from_micros(800)),
    );
    let expected: Vec<i64> = (1..=2_000).collect();

    let mut conn = connect(&proxy.url(), PATIENCE).await;
    let mut pipe = redis::pipe();
    for _ in 0..2_000 {
        pipe.cmd("INCR").arg("pipelined");
    }
    let replies: Vec<i64> = pipe.query_async(&mut conn).await.unwrap();
    assert!(replies == expected, "pipeline replies out of order");

    let port = proxy.port();
    let replies = tokio::task::spawn_blocking(move || {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_nodelay(true).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut writer = stream.try_clone().unwrap();
        let sender = std::thread::spawn(move || {
            for i in 0..2_000 {
                writer
                    .write_all(b"*2\r\n$4\r\nINCR\r\n$7\r\nchunked\r\n")
                    .unwrap();
                if i % 10 == 9 {
                    // Lets the proxy read a chunk of a few commands.
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        });
        let mut reader = BufReader::new(stream);
        let replies: Vec<i64> = (0..2_000)
            .map(|_| {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let value = line.trim_end().strip_prefix(':');
                value
                    .unwrap_or_else(|| panic!("not an integer reply: {line:?}"))
                    .parse()
                    .unwrap()
            })
            .collect();
        sender.join().unwrap();
        replies
    })
    .await
    .unwrap();
    assert!(replies == expected, "separate writes' replies out of order");
    let direct: i64 = run(&server.url(), redis::cmd("GET").arg("chunked"))
        .await
        .unwrap();
    assert_eq!(direct, 2_000);
}

/// Replies black-holed: the request is applied, its reply never comes;
/// after `restore`, a new connection through the proxy works.
#[tokio::test]
async fn a_black_hole_to_the_client_applies_requests_but_loses_replies() {
    let server = server().await;
    let proxy = TcpProxy::start(server.port()).await.unwrap();
    let mut conn = connect(&proxy.url(), SHORT).await;
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
    proxy.black_hole_direction(Direction::ToClient);
    let outcome: redis::RedisResult<()> = redis::cmd("SET")
        .arg("applied")
        .arg("yes")
        .query_async(&mut conn)
        .await;
    let err = outcome.expect_err("a reply came through the black hole");
    assert!(err.is_timeout(), "{err:?}");
    eventually(
        PATIENCE,
        |_: &()| "the SET never reached the server".into(),
        || async {
            let value: Option<String> = run(&server.url(), redis::cmd("GET").arg("applied"))
                .await
                .unwrap();
            if value.as_deref() == Some("yes") {
                Ok(())
            } else {
                Err(())
            }
        },
    )
    .await;
    assert_eq!(proxy.connections().len(), 1, "the sockets stay open");

    proxy.restore();
    let mut fresh = connect(&proxy.url(), PATIENCE).await;
    assert_eq!(ping(&mut fresh).await.unwrap(), "PONG");
    let value: Option<String> = redis::cmd("GET")
        .arg("applied")
        .query_async(&mut fresh)
        .await
        .unwrap();
    assert_eq!(value.as_deref(), Some("yes"));
}

/// Requests black-holed, on open and new connections: nothing is applied,
/// nothing answers, and what was swallowed is lost, not delivered after
/// `restore`.
#[tokio::test]
async fn a_black_hole_to_the_server_loses_requests() {
    let server = server().await;
    let proxy = TcpProxy::start(server.port()).await.unwrap();
    let mut conn = connect(&proxy.url(), SHORT).await;
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
    proxy.black_hole_direction(Direction::ToServer);
    let outcome: redis::RedisResult<()> = redis::cmd("SET")
        .arg("swallowed")
        .arg("yes")
        .query_async(&mut conn)
        .await;
    let err = outcome.expect_err("a request went through the black hole");
    assert!(err.is_timeout(), "{err:?}");

    // A connection opened while the hole is open is swallowed too.
    let mut late = tokio::net::TcpStream::connect(("127.0.0.1", proxy.port()))
        .await
        .unwrap();
    late.write_all(b"*3\r\n$3\r\nSET\r\n$4\r\nlate\r\n$3\r\nyes\r\n")
        .await
        .unwrap();
    let mut reply = [0u8; 64];
    let read = tokio::time::timeout(SHORT, late.read(&mut reply)).await;
    assert!(
        read.is_err(),
        "a reply on a black-holed connection: {read:?}"
    );
    assert!(!exists(&server.url(), "swallowed").await);
    assert!(!exists(&server.url(), "late").await);

    proxy.restore();
    let mut fresh = connect(&proxy.url(), PATIENCE).await;
    assert_eq!(ping(&mut fresh).await.unwrap(), "PONG");
    assert!(
        !exists(&server.url(), "swallowed").await,
        "delivered after restore"
    );
    assert!(
        !exists(&server.url(), "late").await,
        "delivered after restore"
    );
}

/// `cut` ends one connection for its client at once (not by a timeout) and
/// leaves the other alone; `cut_all` ends the rest; new connections work.
#[tokio::test]
async fn cut_ends_the_chosen_connection_only() {
    let server = server().await;
    let proxy = TcpProxy::start(server.port()).await.unwrap();
    let mut a = connect(&proxy.url(), PATIENCE).await;
    let a_id = wait_listed(&proxy, 1).await[0];
    let mut b = connect(&proxy.url(), PATIENCE).await;
    let both = wait_listed(&proxy, 2).await;
    assert!(both.contains(&a_id), "{both:?}");
    let b_id = *both.iter().find(|&&id| id != a_id).unwrap();
    let listed = proxy.connections();
    assert!(listed.iter().all(|c| c.peer().ip().is_loopback()));
    assert!(listed[0].opened() <= listed[1].opened());

    assert!(proxy.cut(a_id));
    assert_eq!(ids(&proxy), [b_id]);
    let sent = Instant::now();
    let err = ping(&mut a).await.expect_err("a cut connection answered");
    assert!(!err.is_timeout(), "the cut went unnoticed: {err:?}");
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(ping(&mut b).await.unwrap(), "PONG");
    assert!(!proxy.cut(a_id), "cut twice");

    assert_eq!(proxy.cut_all(), 1);
    assert!(proxy.connections().is_empty());
    let err = ping(&mut b).await.expect_err("a cut connection answered");
    assert!(!err.is_timeout(), "the cut went unnoticed: {err:?}");
    let mut fresh = connect(&proxy.url(), PATIENCE).await;
    assert_eq!(ping(&mut fresh).await.unwrap(), "PONG");
}
