//! A password in a node's URL is never printed: not by any subcommand,
//! not in an error (a wrong port, a wrong password).

use multilock::{Client, Node};
use multilock_testkit::RedisProcess;

use crate::common::{LONG_LEASE, Run, Watch, args, run, run_expecting};

const SECRET: &str = "hunter2-s3cret";

fn assert_hidden(run: &Run) {
    assert!(
        !run.all().contains(SECRET),
        "the password was printed: {run:?}"
    );
    assert!(
        !run.all().contains("hunter2"),
        "part of the password was printed: {run:?}"
    );
}

#[tokio::test]
async fn never_printed_in_output_or_errors() {
    let server =
        RedisProcess::start_with_args(|_| vec!["--requirepass".to_owned(), SECRET.to_owned()])
            .await
            .unwrap();
    let port = server.port();
    let url = format!("redis://:{SECRET}@127.0.0.1:{port}");
    let nodes = vec!["--node".to_owned(), url.clone()];
    let node = Node::new(&url).unwrap();
    let _guard = Client::new()
        .lock(&node, "secret:lock")
        .unwrap()
        .lock_with_lease(LONG_LEASE)
        .await
        .unwrap();

    let mut watch = Watch::start(&args(
        &[
            "watch",
            "secret:lock",
            "--interval",
            "100ms",
            "--changes",
            "1",
        ],
        &nodes,
    ));
    let start = watch.line_with(" state ").await;
    assert!(start.contains(&format!("127.0.0.1:{port}")), "{start}");
    for line in &watch.seen {
        assert!(!line.contains(SECRET), "{line}");
    }
    for command in [
        &["inspect", "secret:lock"][..],
        &["inspect", "secret:lock", "--json"],
        &["list", "--json"],
        &["list"],
    ] {
        assert_hidden(&run_expecting(&args(command, &nodes), 0).await);
    }
    assert_hidden(
        &run_expecting(
            &args(&["unlock", "secret:lock", "--force", "--yes"], &nodes),
            0,
        )
        .await,
    );
    watch.line_with(" release ").await;
    for line in &watch.seen {
        assert!(!line.contains(SECRET), "{line}");
    }

    // Errors: a port where nothing listens, a wrong password, a bad URL.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_port = closed.local_addr().unwrap().port();
    drop(closed);
    let wrong_port = vec![
        "--node".to_owned(),
        format!("redis://:{SECRET}@127.0.0.1:{dead_port}"),
        "--timeout".to_owned(),
        "1s".to_owned(),
    ];
    let wrong_password = vec![
        "--node".to_owned(),
        format!("redis://:hunter2-wrong@127.0.0.1:{port}"),
        "--timeout".to_owned(),
        "1s".to_owned(),
    ];
    let bad_url = vec![
        "--node".to_owned(),
        format!("redis://:{SECRET}@127.0.0.1:notaport"),
    ];
    for nodes in [&wrong_port, &wrong_password, &bad_url] {
        for command in [
            &["inspect", "secret:lock"][..],
            &["inspect", "secret:lock", "--json"],
            &["list"],
            &["unlock", "secret:lock", "--force", "--yes"],
        ] {
            let failed = run(&args(command, nodes)).await;
            assert_eq!(failed.code, Some(1), "{command:?} {nodes:?}: {failed:?}");
            assert_hidden(&failed);
        }
    }
}
