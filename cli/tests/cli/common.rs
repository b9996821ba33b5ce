//! The toolbox of the CLI's tests: running the built binary, reading its
//! JSON, a watch process read line by line, raw commands, and polling.

use std::process::Stdio;
use std::time::Duration;

use multilock::redis;
use multilock_testkit::PollLimit;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// How long a run of the binary, a watch line or a polled condition may
/// take: generous, the machine may be loaded.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A lease no test waits out: a grant before it proves a wake-up.
pub const LONG_LEASE: Duration = Duration::from_secs(60);

/// What a run of the binary printed, and its exit code.
#[derive(Debug)]
pub struct Run {
    /// The exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Standard output parsed as one JSON value.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|err| panic!("not JSON ({err}): {self:?}"))
    }

    /// Both streams, for checks on everything printed.
    pub fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

fn command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_multilock"));
    command
        .args(args)
        .env_remove("MULTILOCK_DATA_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Starts `multilock args...` with its three streams piped, for a test
/// that talks to it.
pub fn spawn(args: &[&str]) -> Child {
    command(args).spawn().expect("the binary runs")
}

/// Runs `multilock args...` with `stdin` as its input, to its end.
pub async fn run_with_input(args: &[&str], stdin: &str) -> Run {
    let mut child = command(args).spawn().expect("the binary runs");
    let mut input = child.stdin.take().expect("stdin piped");
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let output = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("multilock {args:?} did not end within {PATIENCE:?}"))
        .unwrap();
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs `multilock args...` with nothing on stdin, to its end.
pub async fn run(args: &[&str]) -> Run {
    run_with_input(args, "").await
}

/// Runs `multilock args...`, asserting exit code `code`.
pub async fn run_expecting(args: &[&str], code: i32) -> Run {
    let run = run(args).await;
    assert_eq!(run.code, Some(code), "multilock {args:?}: {run:?}");
    run
}

/// The arguments naming one standalone node.
pub fn node_args(url: &str) -> Vec<String> {
    vec!["--node".to_owned(), url.to_owned()]
}

/// `words` then `extra`, as the `&str`s a run takes.
pub fn args<'a>(words: &[&'a str], extra: &'a [String]) -> Vec<&'a str> {
    words
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .collect()
}

/// A `multilock watch` running in the background, read line by line.
pub struct Watch {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// Every line read so far.
    pub seen: Vec<String>,
}

impl Watch {
    /// Starts `multilock watch args...`.
    pub fn start(args: &[&str]) -> Watch {
        let mut child = command(args).spawn().expect("the binary runs");
        let stdout = child.stdout.take().expect("stdout piped");
        Watch {
            child,
            lines: BufReader::new(stdout).lines(),
            seen: Vec::new(),
        }
    }

    /// Reads lines until one contains `needle`, and returns it.
    pub async fn line_with(&mut self, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.next_line())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "no line with {needle:?} within {PATIENCE:?}: {:?}",
                        self.seen
                    )
                })
                .unwrap()
                .unwrap_or_else(|| panic!("watch ended before {needle:?}: {:?}", self.seen));
            self.seen.push(line.clone());
            if line.contains(needle) {
                return line;
            }
        }
    }

    /// Waits for the process to exit by itself, and returns its code.
    pub async fn exit_code(mut self) -> Option<i32> {
        // Whatever is left on stdout, so that the process never blocks.
        while let Ok(Some(line)) = self.lines.next_line().await {
            self.seen.push(line);
        }
        tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("watch exits after its changes")
            .unwrap()
            .code()
    }
}

/// A connection to `url`.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|err| panic!("cannot connect to {url}: {err}"))
}

/// Polls `check` until it is true, for at most [`PATIENCE`].
pub async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let poll = PollLimit::new(PATIENCE);
    while !check().await {
        poll.tick(|| what.to_owned()).await.unwrap();
    }
}

/// Waits until `count` connections listen on `channel` at `url`.
pub async fn wait_for_listeners(url: &str, channel: &str, count: u64) {
    let conn = raw(url).await;
    until(&format!("{count} listener(s) on {channel}"), || {
        let mut conn = conn.clone();
        async move {
            let (_, listeners): (String, u64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(channel)
                .query_async(&mut conn)
                .await
                .unwrap();
            listeners == count
        }
    })
    .await;
}

/// A standalone node's address as the CLI prints it.
pub fn addr(url: &str) -> String {
    url.rsplit('@')
        .next()
        .unwrap()
        .trim_start_matches("redis://")
        .to_owned()
}
