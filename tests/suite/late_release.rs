//! A release that could not reach its node is retried in the background
//! once the node is back, or given up and buried; the owner's next hold
//! there must outlive it, and any late copy of it.

use std::time::{Duration, Instant};

use crate::common::*;
use multilock::{Health, Node, Owner};
use multilock_testkit::{Delay, Direction, RedisProcess, TcpProxy, TestServer, poll_until};

/// A release whose node was down is sent again in the background once the
/// node is back (restarted empty: the release's latch is gone with it). The
/// owner's next acquire of that lock on that node waits for it: granted
/// first, the late release would find the owner's field on the new hold and
/// release that instead. The likely cause of the rolling-restart history
/// checker's one overlap: a RedLock part lost this way lets a rival win a
/// quorum while its owner holds (fencing refused the stale holder's writes).
#[tokio::test]
async fn a_release_retried_after_a_restart_never_releases_the_next_hold() {
    let mut server = server().await;
    let node = node(&server);
    // One owner for every round: the late release carries its field, and
    // its next hold is the one at risk (another owner's has its own field).
    let lock = client()
        .lock(&node, "lazarus")
        .unwrap()
        .with_owner(Owner::new("job").unwrap());
    for round in 0..3 {
        let held = lock.lock_with_lease(LONG_LEASE).await.unwrap();
        server.kill().await.unwrap();
        let err = held.unlock().await.unwrap_err();
        assert!(err.is_node_unavailable(), "{err:?}");
        server.restart().await.unwrap();
        let url = server.url();
        let again = lock_once_back(&lock, &format!("round {round}")).await;
        background_release_ran(&url, round).await;
        assert!(
            exists(&url, "lazarus").await,
            "round {round}: the earlier hold's release took the new hold"
        );
        again.unlock().await.unwrap();
    }
}

/// A release retried in the background while its node is down goes out as
/// soon as the node answers again, not after the rest of a pause grown
/// while it was down: until it lands, its owner's next request on the node
/// waits for it (a RedLock part there times out meanwhile, and the node is
/// suspected again). Each round keeps the node down long enough for every
/// pause to grow to its longest (2 s), a different time each round so the
/// pauses and the node's return fall differently.
#[tokio::test]
async fn a_release_retried_in_the_background_goes_out_once_the_node_answers() {
    /// Longer than the pauses take to grow to their longest (about 3 s).
    const DOWN_MS: [u64; 3] = [4_000, 4_700, 5_300];
    /// Far above a round trip, below how late the retry came when it slept
    /// its pause out (about 550 ms here: the pauses of the retry and of the
    /// probe grow on grids that keep that distance).
    const PROMPT: Duration = Duration::from_millis(450);
    let mut server = server().await;
    let node = node(&server);
    let lock = client().lock(&node, "lazarus:prompt").unwrap();
    let mut late = Vec::new();
    for (round, down) in DOWN_MS.into_iter().enumerate() {
        let held = lock.lock_with_lease(LONG_LEASE).await.unwrap();
        server.kill().await.unwrap();
        assert!(held.unlock().await.unwrap_err().is_node_unavailable());
        // Not a condition to poll for: the time the pauses need to grow.
        tokio::time::sleep(Duration::from_millis(down)).await;
        server.restart().await.unwrap();
        poll_until(
            PATIENCE,
            || format!("round {round}: the node never answered a probe"),
            || async { (node.health() == Health::Healthy).then_some(()) },
        )
        .await
        .unwrap();
        let answered = Instant::now();
        background_release_ran(&server.url(), round).await;
        late.push(answered.elapsed());
    }
    assert!(
        late.iter().all(|after| *after < PROMPT),
        "the retried releases reached the node {late:?} after it answered again"
    );
}

/// The same through a RedLock, whose unlock returns once a quorum released
/// and retries the dead node's part in the background: the next hold's
/// part on the restarted node is kept (else the RedLock would count a part
/// that no longer holds, and a rival could win that node and the others).
#[tokio::test]
async fn a_red_lock_part_retried_after_a_restart_never_releases_the_next_hold() {
    const NAME: &str = "lazarus:red";
    let mut servers = servers(3).await;
    let nodes: Vec<Node> = servers.iter().map(node).collect();
    // One owner for every round: its next hold's parts are the ones at risk.
    let lock = client()
        .red_lock_on(&nodes, NAME)
        .unwrap()
        .with_owner(Owner::new("job").unwrap());
    for round in 0..3 {
        let held = lock.lock_with_lease(LONG_LEASE).await.unwrap();
        servers[0].kill().await.unwrap();
        // A quorum releases; the dead node's part goes to the background.
        let _ = held.unlock().await;
        servers[0].restart().await.unwrap();
        let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
        let again = eventually(
            PATIENCE,
            |held_on: &Vec<String>| {
                format!("round {round}: no hold on all three nodes; last held on {held_on:?}")
            },
            || async {
                let guard = match lock.try_lock_for(Duration::ZERO, Some(LONG_LEASE)).await {
                    Ok(Some(guard)) => guard,
                    Ok(None) => panic!("round {round}: nobody else holds it"),
                    Err(err) => return Err(vec![err.to_string()]),
                };
                let mut held_on = Vec::new();
                for url in &urls {
                    if exists(url, NAME).await {
                        held_on.push(url.clone());
                    }
                }
                // The restarted node is skipped while it is suspect.
                if held_on.len() == urls.len() {
                    Ok(guard)
                } else {
                    guard.unlock().await.unwrap();
                    Err(held_on)
                }
            },
        )
        .await;
        background_release_ran(&urls[0], round).await;
        assert!(
            exists(&urls[0], NAME).await,
            "round {round}: the earlier hold's release took the new hold's part"
        );
        again.unlock().await.unwrap();
    }
}

/// A node restarted from its dump answers `LOADING` to every script until
/// it has loaded it: a passing refusal, nothing applied. A release sent
/// then (its first reply), and one retried in the background since it
/// found the node down (its retry's reply), go on until the node has
/// loaded: rivals are granted long before the holds' lease (a minute)
/// would free the locks.
#[tokio::test]
async fn releases_refused_while_the_node_loads_are_applied_once_it_has() {
    /// Keys in the dump besides the holds: 1 ms each to load, about 5 s.
    const FILLER: u32 = 5_000;
    const RIVAL_WAIT: Duration = Duration::from_secs(10);
    let mut server = RedisProcess::start_with_args(|_| {
        // Slowly, and answering clients meanwhile (every 1 KB read).
        let slow = ["--key-load-delay", "1000"];
        let answering = ["--loading-process-events-interval-bytes", "1024"];
        slow.into_iter()
            .chain(answering)
            .map(String::from)
            .collect()
    })
    .await
    .unwrap();
    let url = server.url();
    let node = node(&server);
    let names = ["sent-while-down", "sent-while-loading"];
    let client = long_lease_client();
    let mut guards = Vec::new();
    for name in names {
        let lock = client.lock(&node, name).unwrap();
        guards.push(lock.lock_with_lease(LONG_LEASE).await.unwrap());
    }
    let fill = "for i = 1, ARGV[1] do redis.call('set', 'filler:' .. i, i) end";
    let mut saving = redis::pipe();
    saving.cmd("EVAL").arg(fill).arg(0).arg(FILLER).ignore();
    saving.cmd("SAVE").ignore();
    // Not `run`'s 2 s: a busy disk can take longer to sync the dump.
    let mut conn = raw(&url).await;
    tokio::time::timeout(PATIENCE * 4, saving.query_async::<()>(&mut conn))
        .await
        .expect("saved in time")
        .unwrap();

    server.kill().await.unwrap();
    let (while_down, while_loading) = (guards.remove(0), guards.remove(0));
    let err = while_down.unlock().await.unwrap_err();
    assert!(err.is_node_unavailable(), "{err:?}");
    server.restart().await.unwrap();
    let err = while_loading.unlock().await.unwrap_err();
    assert!(
        format!("{err:?}").contains("BusyLoading"),
        "refused while loading: {err:?}"
    );
    let refused_at = Instant::now();
    poll_until(
        PATIENCE + Duration::from_secs(10),
        || "the node never finished loading".to_owned(),
        || async { run::<String>(&url, &redis::cmd("PING")).await.ok() },
    )
    .await
    .unwrap();
    // Background retries are at most 2 s apart: the one of the release
    // sent while the node was down met the loading too.
    assert!(
        refused_at.elapsed() > Duration::from_secs(3),
        "loaded {:?} after the refusal: too soon to show anything",
        refused_at.elapsed()
    );

    let rival = long_lease_client();
    let mut lost = Vec::new();
    for name in names {
        let lock = rival.lock(&node, name).unwrap();
        match lock.try_lock_for(RIVAL_WAIT, Some(LONG_LEASE)).await {
            Ok(Some(guard)) => guard.unlock().await.unwrap(),
            other => lost.push(format!("{name}: {other:?}")),
        }
    }
    assert!(
        lost.is_empty(),
        "rivals not granted within {RIVAL_WAIT:?}, the releases lost, the holds \
         left to their lease: {lost:?}"
    );
}

/// Waits until the background release has run on the restarted server at
/// `url`: its script read the hold count there (the acquire's fresh-hold
/// path reads none, and the server's counts started at zero).
async fn background_release_ran(url: &str, round: usize) {
    poll_until(
        PATIENCE,
        || format!("round {round}: the background release never reached the new server"),
        || async { (command_calls(url).await.get("hget").copied().unwrap_or(0) > 0).then_some(()) },
    )
    .await
    .unwrap();
}

/// A release whose copies were held up on their way longer than its retry
/// window (a partitioned link retransmits them once it heals) is given up
/// and then buried before its owner's next grant there: when the copies
/// land, after that grant, they find the latch and change nothing. Before
/// the burial the first copy found the owner's field on the new hold and
/// released it.
#[tokio::test]
async fn a_release_landing_after_its_window_never_releases_the_next_hold() {
    /// Longer than the 60 s window, with room for the next grant before it.
    const HELD_UP: Duration = Duration::from_secs(72);
    let server = server().await;
    let url = server.url();
    let proxy = TcpProxy::start(server.port()).await.unwrap();
    let node = node_at(&proxy.url(), Duration::from_millis(500));
    // One owner for both holds: the held-up release carries its field, and
    // its next hold is the one at risk (another owner's has its own field).
    let lock = client()
        .lock(&node, "buried")
        .unwrap()
        .with_owner(Owner::new("job").unwrap());
    // Over long before the window ends: the owner's next grant is fresh.
    let held = lock.lock_with_lease(Duration::from_secs(5)).await.unwrap();
    proxy.set_delay(Direction::ToServer, Delay::fixed(HELD_UP));
    let sent = Instant::now();
    let err = held.unlock().await.unwrap_err();
    assert!(err.is_node_unavailable(), "{err:?}");
    // The release and its retry are on their way; what is sent from now on
    // goes at once (a new connection: the held-up one is broken).
    proxy.set_delay(Direction::ToServer, Delay::NONE);
    let again = eventually(
        HELD_UP,
        |err| format!("no grant after the window: {err}"),
        || async {
            match lock
                .try_lock_for(Duration::ZERO, Some(Duration::from_secs(600)))
                .await
            {
                Ok(Some(guard)) => Ok(guard),
                Ok(None) => panic!("nobody else holds it"),
                Err(err) => Err(err),
            }
        },
    )
    .await;
    assert!(
        sent.elapsed() < HELD_UP,
        "granted after the copies landed: this test shows nothing"
    );
    let before = script_calls(&url).await;
    poll_until(
        HELD_UP + PATIENCE,
        || "the held-up release never landed".to_owned(),
        || async { (script_calls(&url).await > before).then_some(()) },
    )
    .await
    .unwrap();
    assert!(
        exists(&url, "buried").await,
        "the release given up took the next hold"
    );
    again.unlock().await.unwrap();
}
