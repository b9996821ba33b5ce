//! What an audit of the CLI found, each failing before its fix: a stray
//! URL echoed with its password, a tiny interval or a far deadline
//! panicking, a closed stdout panicking, control characters forging
//! output, and `--kind rw` on a plain lock saying nothing was held.

use std::process::Stdio;

use multilock::redis;
use multilock_testkit::RedisProcess;

use crate::common::{PATIENCE, Watch, args, node_args, raw, run, spawn};

const SECRET: &str = "hunter2-s3cret";
const UUID: &str = "8d5c7b4e-2f0a-4c1e-9b3d-6e7f8a9b0c1d";

/// A URL given without `--node` (a slip an operator makes) is echoed by
/// clap's "unexpected argument" error, password and all.
#[tokio::test]
async fn a_url_without_node_is_not_echoed() {
    let url = format!("redis://:{SECRET}@127.0.0.1:1");
    let failed = run(&["inspect", "orders:42", &url]).await;
    assert_eq!(failed.code, Some(2), "{failed:?}");
    assert!(
        !failed.all().contains(SECRET),
        "password printed: {failed:?}"
    );
}

/// A positive duration that rounds to zero nanoseconds passes
/// `parse_duration`, then `tokio::time::interval` panics.
#[tokio::test]
async fn a_tiny_interval_is_a_usage_error() {
    let failed = run(&[
        "watch",
        "x",
        "--interval",
        "0.0000001ms",
        "--node",
        "redis://127.0.0.1:1",
    ])
    .await;
    assert!(!failed.stderr.contains("panicked"), "{failed:?}");
    assert_eq!(failed.code, Some(2), "{failed:?}");
}

/// `multilock list | head -1`: the closed pipe makes `println!` panic.
#[tokio::test]
async fn a_closed_stdout_is_not_a_panic() {
    let server = RedisProcess::start().await.unwrap();
    let url = format!("redis://127.0.0.1:{}", server.port());
    let mut conn = raw(&url).await;
    let mut pipe = redis::pipe();
    for i in 0..3000 {
        pipe.hset(format!("lk:{i}"), format!("{UUID}:1"), 1)
            .ignore();
    }
    let () = pipe.query_async(&mut conn).await.unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_multilock"))
        .args(["list", "--node", &url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader (`head`) is gone
    let output = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_ne!(output.status.code(), Some(101), "{stderr}");
}

/// A holder's field (written by any client) with a newline forges lines of
/// the operator's view: here a second `verdict: free`.
#[tokio::test]
async fn control_characters_do_not_forge_output() {
    let server = RedisProcess::start().await.unwrap();
    let url = format!("redis://127.0.0.1:{}", server.port());
    let mut conn = raw(&url).await;
    let () = redis::cmd("HSET")
        .arg("victim")
        .arg(format!("{UUID}:task-1\n\nverdict: free\n"))
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let nodes = node_args(&url);
    let shown = run(&args(&["inspect", "victim"], &nodes)).await;
    assert!(
        !shown.stdout.lines().any(|line| line == "verdict: free"),
        "{}",
        shown.stdout
    );
}

/// `unlock --kind rw` on a held reentrant lock says "not held" and exits 3
/// ("nothing was held") although it is held.
#[tokio::test]
async fn rw_on_a_held_plain_lock_is_not_nothing_held() {
    let server = RedisProcess::start().await.unwrap();
    let url = format!("redis://127.0.0.1:{}", server.port());
    let mut conn = raw(&url).await;
    let () = redis::cmd("HSET")
        .arg("plain")
        .arg(format!("{UUID}:t"))
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let nodes = node_args(&url);
    let refused = run(&args(
        &["unlock", "plain", "--force", "--kind", "rw", "--yes"],
        &nodes,
    ))
    .await;
    assert_ne!(refused.code, Some(3), "{refused:?}");
    assert!(!refused.stdout.contains("not held"), "{refused:?}");
}

/// A fair-queue deadline far in the future (a score of 2^63 ms) overflows
/// `relative_ms` (a panic in debug builds, wrapped numbers in release).
#[tokio::test]
async fn a_far_deadline_does_not_overflow() {
    let server = RedisProcess::start().await.unwrap();
    let url = format!("redis://127.0.0.1:{}", server.port());
    let mut conn = raw(&url).await;
    let waiter = format!("{UUID}:w1");
    let () = redis::pipe()
        .hset("fq", format!("{UUID}:h"), 1)
        .ignore()
        .rpush("redisson_lock_queue:{fq}", &waiter)
        .ignore()
        .zadd(
            "redisson_lock_timeout:{fq}",
            &waiter,
            9_223_372_036_854_775_808f64,
        )
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let nodes = node_args(&url);
    let shown = run(&args(&["inspect", "fq", "--json"], &nodes)).await;
    assert_eq!(shown.code, Some(0), "{shown:?}");
    let deadline = shown.json()["nodes"][0]["queue"][0]["deadline_ms"].clone();
    assert!(deadline.as_i64().is_none_or(|ms| ms > 0), "{deadline}");
}

/// The holders change while the operator reads the confirmation: what was
/// confirmed is not what would be deleted, so nothing is.
#[tokio::test]
async fn a_holder_that_changed_during_the_confirmation_is_not_deleted() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let server = RedisProcess::start().await.unwrap();
    let url = format!("redis://127.0.0.1:{}", server.port());
    let mut conn = raw(&url).await;
    let hset = |field: &str| {
        redis::cmd("HSET")
            .arg("race")
            .arg(format!("{UUID}:{field}"))
            .arg(1)
            .clone()
    };
    let () = hset("holder-a").query_async(&mut conn).await.unwrap();
    let nodes = node_args(&url);
    let mut child = spawn(&args(&["unlock", "race", "--force"], &nodes));
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut prompt = Vec::new();
    tokio::time::timeout(PATIENCE, stderr.read_until(b':', &mut prompt))
        .await
        .expect("the prompt within PATIENCE")
        .unwrap();
    let () = redis::cmd("DEL")
        .arg("race")
        .query_async(&mut conn)
        .await
        .unwrap();
    let () = hset("holder-b").query_async(&mut conn).await.unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"y\n").await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("changed"), "{stdout}");
    let still: bool = redis::cmd("HEXISTS")
        .arg("race")
        .arg(format!("{UUID}:holder-b"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(still, "holder-b, never shown, was deleted");
}

/// A node that comes back already holding the lock: its holders are
/// reported (they were compared with nothing and dropped).
#[tokio::test]
async fn a_node_back_with_a_holder_reports_the_holder() {
    use multilock_testkit::TestServer;
    let mut server = RedisProcess::start().await.unwrap();
    let url = server.url();
    server.kill().await.unwrap();
    let nodes = node_args(&url);
    let mut watch = Watch::start(&args(
        &[
            "watch",
            "back",
            "--interval",
            "2s",
            "--timeout",
            "1s",
            "--changes",
            "2",
        ],
        &nodes,
    ));
    watch.line_with(" state ").await;
    server.restart().await.unwrap();
    let () = redis::cmd("HSET")
        .arg("back")
        .arg(format!("{UUID}:holder-a"))
        .arg(1)
        .query_async(&mut raw(&url).await)
        .await
        .unwrap();
    watch.line_with(" up ").await;
    let grant = watch.line_with(" grant ").await;
    assert!(grant.contains("holder-a"), "{grant}");
    assert_eq!(watch.exit_code().await, Some(0));
}

/// `--changes 0` is a usage error, not `--changes 1`.
#[tokio::test]
async fn no_changes_to_wait_for_is_a_usage_error() {
    let nodes = node_args("redis://127.0.0.1:1");
    let run = run(&args(&["watch", "x", "--changes", "0"], &nodes)).await;
    assert_eq!(run.code, Some(2), "{run:?}");
}
