//! Scenarios from the Redis distlock spec and its critiques: a key that
//! expires early on one node (a server clock jump), a client paused while it
//! acquires, a wall-clock jump on the client, and extending a lock within
//! its validity.
//!
//! Two of them need a process of their own: the test runs the suite's own
//! binary again as a child (see [`child_role`]), which a signal can stop or
//! whose wall clock libfaketime moves.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use multilock::{Client, Node};
use multilock_testkit::{FencedStore, RedisProcess, TestServer};

/// The environment variable that makes a scenario test play its child part.
const CHILD: &str = "MULTILOCK_SUITE_CHILD";

/// The part this process plays in `test`: `None` for the test itself (the
/// parent), else what the parent asked for.
fn child_role(test: &str) -> Option<String> {
    std::env::var(CHILD)
        .ok()
        .and_then(|role| role.strip_prefix(&format!("{test}:")).map(str::to_owned))
}

/// How a child's reports start, among libtest's own lines on its stdout.
const REPORT: &str = "scenario report: ";

/// The reports of a child, read from its stdout as they come.
fn reports(stdout: std::process::ChildStdout) -> impl Iterator<Item = String> {
    BufReader::new(stdout).lines().filter_map(|line| {
        let line = line.ok()?;
        line.find(REPORT)
            .map(|at| line[at + REPORT.len()..].to_owned())
    })
}

/// The suite binary running `scenarios::<test>` alone, as the child `role`.
fn child(test: &str, role: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        &format!("scenarios::{test}"),
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, format!("{test}:{role}"))
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    cmd
}

/// A node that waits long for replies: a stalled client or server must not
/// turn into a timeout in these scenarios.
fn patient_node(url: &str) -> Node {
    node_at(url, Duration::from_secs(30))
}

// ---------------------------------------------------------------------------
// One node's key expires early

/// The holder has a bare majority (nodes 0 and 1; node 2 was down). Node 1's
/// clock jumps and the key expires early there (PEXPIRE 1). A second client
/// then wins nodes 1 and 2 while the first still believes it holds: two
/// holders, the limit every Redlock shares with server clocks. The fencing
/// token catches it: the second holder's token is higher, and the store
/// rejects the first holder's late write.
#[tokio::test]
async fn a_key_that_expires_early_on_one_node_is_caught_by_fencing() {
    let mut servers = servers(3).await;
    let store_server = server().await;
    let store = FencedStore::new(store_server.url(), "account");
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    let fenced = client()
        .red_lock_on(&nodes, "account")
        .unwrap()
        .with_fencing();
    // The name's first fenced grant, with every node up, puts its fencing
    // counter on every node (a counter missing on a quorum cannot be told
    // from one lost with a node's data, so no token is handed out then).
    take_and_release(&fenced, PATIENCE, "all nodes grant").await;
    servers[2].kill().await.unwrap();
    let first = fenced
        .try_lock_for(PATIENCE, Some(LONG_LEASE))
        .await
        .unwrap()
        .expect("nodes 0 and 1 grant");
    let first_token = first.fencing_token().unwrap();
    servers[2].restart().await.unwrap();
    // The server clock of node 1 jumps: the key is gone there, early.
    let _: () = run(
        &servers[1].url(),
        redis::cmd("PEXPIRE").arg("account").arg(1),
    )
    .await
    .unwrap();
    wait_absent(&servers[1].url(), "account", PATIENCE, "expired early").await;

    let second_nodes: Vec<Node> = servers.iter().map(node).collect();
    let second = eventually(
        PATIENCE,
        |_: &()| "the second client never got nodes 1 and 2".into(),
        || async {
            match Client::new()
                .red_lock_on(&second_nodes, "account")
                .unwrap()
                .with_fencing()
                .try_lock_for(Duration::ZERO, Some(LONG_LEASE))
                .await
            {
                Ok(Some(guard)) => Ok(guard),
                _ => Err(()),
            }
        },
    )
    .await;
    let second_token = second.fencing_token().unwrap();
    assert!(
        first.valid_until().unwrap() > std::time::Instant::now(),
        "the first holder still believes it holds: two holders"
    );
    assert!(second_token > first_token, "{second_token} > {first_token}");
    assert!(store.write(second_token, "second").await.unwrap());
    assert!(
        !store.write(first_token, "first, late").await.unwrap(),
        "the stale holder's write is rejected"
    );
    assert_eq!(store.read().await.unwrap().as_deref(), Some("second"));
    drop(first);
    drop(second);
}

// ---------------------------------------------------------------------------
// A client paused while it acquires

/// The client sends its acquire while the node sleeps (`DEBUG SLEEP`), and
/// is then stopped (SIGSTOP) until long after the grant's 2 s lease ran
/// out. Resumed, it reads a grant whose TTL is spent: it must not report the
/// lock acquired. (The child connects, says so, waits for the word on its
/// stdin, sends, and prints what it got.)
#[test]
fn a_client_paused_while_it_acquires_is_not_granted() {
    const TEST: &str = "a_client_paused_while_it_acquires_is_not_granted";
    let lease = Duration::from_secs(2);
    if let Some(url) = child_role(TEST) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let lock = Client::new().lock(&patient_node(&url), "paused").unwrap();
            // Connected: the acquire below goes straight onto the socket.
            assert!(!lock.is_locked().await.unwrap());
            println!("{REPORT}connected");
            let mut go = String::new();
            std::io::stdin().read_line(&mut go).unwrap();
            println!("{REPORT}sending");
            let got = lock.try_lock_for(Duration::ZERO, Some(lease)).await;
            let outcome = if matches!(got, Ok(Some(_))) {
                "acquired"
            } else {
                "not acquired"
            };
            println!("{REPORT}{outcome}");
        });
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(async {
        RedisProcess::start_with_args(|_| vec!["--enable-debug-command".into(), "yes".into()])
            .await
            .unwrap()
    });
    let mut process = child(TEST, &server.url())
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = reports(process.stdout.take().unwrap());
    assert_eq!(lines.next().as_deref(), Some("connected"));
    // The node sleeps 1 s: the acquire waits in its socket meanwhile.
    let url = server.url();
    let sleeper = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(1)
            .query::<()>(&mut conn)
            .unwrap();
    });
    std::thread::sleep(Duration::from_millis(100));
    use std::io::Write;
    writeln!(process.stdin.take().unwrap(), "go").unwrap();
    assert_eq!(lines.next().as_deref(), Some("sending"));
    std::thread::sleep(Duration::from_millis(100));
    let pid = process.id().to_string();
    let signal = |signal: &str| {
        assert!(
            Command::new("kill")
                .args([signal, &pid])
                .status()
                .unwrap()
                .success()
        )
    };
    signal("-STOP");
    sleeper.join().unwrap();
    // The node wakes and grants; the grant's lease runs out while the
    // client is stopped.
    runtime.block_on(async {
        eventually(
            PATIENCE,
            |_: &()| "the node never granted the stopped client".into(),
            || async {
                if exists(&server.url(), "paused").await {
                    Ok(())
                } else {
                    Err(())
                }
            },
        )
        .await;
        wait_absent(&server.url(), "paused", PATIENCE, "the lease ran out").await;
    });
    let expired = Instant::now();
    std::thread::sleep(lease / 2);
    signal("-CONT");
    let outcome = lines.next();
    assert!(process.wait().unwrap().success());
    assert_eq!(
        outcome.as_deref(),
        Some("not acquired"),
        "resumed {:?} after the key expired, the client reported the lock",
        expired.elapsed()
    );
}

// ---------------------------------------------------------------------------
// The client's wall clock jumps

/// Where Debian puts libfaketime (the `faketime` package).
fn libfaketime() -> String {
    ["x86_64-linux-gnu", "aarch64-linux-gnu"]
        .iter()
        .map(|arch| format!("/usr/lib/{arch}/faketime/libfaketimeMT.so.1"))
        .find(|path| std::path::Path::new(path).exists())
        .expect("libfaketime is needed: apt-get install faketime")
}

/// Validity is measured on the monotonic clock only. A child process holds
/// a RedLock (a fixed lease) and a watchdog lock while libfaketime moves its
/// wall clock an hour forward, then two hours back (the monotonic clock is
/// left alone): its guards keep their validity, `lost()` does not fire, the
/// watchdog keeps renewing, and both unlock as held.
#[test]
fn validity_is_measured_on_the_monotonic_clock_only() {
    const TEST: &str = "validity_is_measured_on_the_monotonic_clock_only";
    if let Some(role) = child_role(TEST) {
        let (offset_file, urls) = role.split_once('|').unwrap();
        let urls: Vec<&str> = urls.split(',').collect();
        let jump = |offset: &str| std::fs::write(offset_file, offset).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let nodes: Vec<Node> = urls.iter().map(|u| patient_node(u)).collect();
            let client = client_with_watchdog(Duration::from_secs(3));
            let red = client.red_lock_on(&nodes, "clock").unwrap();
            let leased = red.lock_with_lease(Duration::from_secs(8)).await.unwrap();
            let renewed = client
                .lock(&nodes[0], "clock-renewed")
                .unwrap()
                .lock()
                .await
                .unwrap();
            let valid_until = leased.valid_until().unwrap();
            let wall = std::time::SystemTime::now();
            jump("+3600");
            let moved = std::time::SystemTime::now().duration_since(wall).unwrap();
            assert!(
                moved >= Duration::from_secs(3599),
                "the wall clock did not move: {moved:?}"
            );
            assert_eq!(
                leased.valid_until(),
                Some(valid_until),
                "validity moved with the wall clock"
            );
            jump("-3600");
            tokio::select! {
                _ = leased.lost() => panic!("lost() fired after a wall-clock jump"),
                _ = renewed.lost() => panic!("lost() fired after a wall-clock jump"),
                _ = tokio::time::sleep(Duration::from_secs(4)) => {}
            }
            assert_eq!(leased.valid_until(), Some(valid_until));
            renewed.unlock().await.unwrap();
            leased.unlock().await.unwrap();
            println!("{REPORT}held through the jumps");
        });
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let servers = runtime.block_on(servers(3));
    let offset_file =
        std::env::temp_dir().join(format!("multilock-faketime-{}", std::process::id()));
    std::fs::write(&offset_file, "+0").unwrap();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let role = format!("{}|{}", offset_file.display(), urls.join(","));
    let mut process = child(TEST, &role)
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_TIMESTAMP_FILE", &offset_file)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .spawn()
        .unwrap();
    let lines: Vec<String> = reports(process.stdout.take().unwrap()).collect();
    let status = process.wait().unwrap();
    let _ = std::fs::remove_file(&offset_file);
    assert!(status.success(), "the child failed: {lines:?}");
    assert!(
        lines.iter().any(|l| l == "held through the jumps"),
        "{lines:?}"
    );
    runtime.block_on(async {
        for s in &servers {
            assert!(!exists(&s.url(), "clock").await);
        }
    });
}

// ---------------------------------------------------------------------------
// Extending within validity

/// A fixed-lease RedLock is extended before its validity ends: it holds on
/// past the first lease, validity recomputed, and nobody else gets in. Once
/// it has expired, an extension fails and revives nothing.
#[tokio::test]
async fn a_quorum_extension_within_validity_keeps_the_lock() {
    let servers = servers(5).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    let red = long_lease_client().red_lock_on(&nodes, "extended").unwrap();
    let lease = Duration::from_secs(2);
    let guard = red.lock_with_lease(lease).await.unwrap();
    let first_validity = guard.valid_until().unwrap();
    tokio::time::sleep(lease / 2).await;
    guard.extend(Duration::from_secs(6)).await.unwrap();
    assert!(guard.valid_until().unwrap() > first_validity + Duration::from_secs(3));
    // Past the first lease: still held, by us only.
    tokio::time::sleep(lease).await;
    let rival = Client::new().red_lock_on(&nodes, "extended").unwrap();
    assert!(
        rival
            .try_lock_for(Duration::ZERO, Some(lease))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        tokio::time::timeout(Duration::ZERO, guard.lost())
            .await
            .is_err()
    );
    guard.unlock().await.unwrap();

    // Expired: an extension fails and revives nothing.
    let short = red
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::timeout(PATIENCE, short.lost())
        .await
        .expect("the lease ran out");
    for s in &servers {
        wait_absent(&s.url(), "extended", PATIENCE, "expired").await;
    }
    assert!(short.extend(Duration::from_secs(10)).await.is_err());
    for s in &servers {
        assert!(
            !exists(&s.url(), "extended").await,
            "revived on {}",
            s.url()
        );
    }
}
