//! `multilock`: an operator's command line for distributed locks on Redis,
//! multilock's and Redisson's alike (see `multilock --help` and the
//! crate's README).
//!
//! One module per subcommand ([`inspect`], [`watch`], [`list`],
//! [`unlock`]), the command line in [`args`], nodes and lock handles in
//! [`target`], formats in [`output`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

/// `println!` to stdout, which ends the process quietly (exit 141, as a
/// process killed by SIGPIPE) once the reader is gone: `multilock list |
/// head` is no panic.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_out(format_args!($($arg)*))
    };
}

mod args;
mod inspect;
mod list;
mod output;
mod target;
mod unlock;
mod watch;

use args::{Cli, Command};

/// How a command ended, when it ran to the end.
#[derive(Debug)]
pub enum Outcome {
    /// It did what was asked: exit 0.
    Done,
    /// It ran, but a node failed (said why on stderr): exit 1.
    Failed(String),
    /// `unlock`: nothing was held, nothing deleted: exit 3.
    NothingHeld,
    /// `unlock`: not confirmed: exit 4.
    NotConfirmed,
}

/// Why a command stopped early.
#[derive(Debug)]
pub enum Failure {
    /// The library refused or failed (a bad URL, no node answered ...):
    /// exit 1.
    Lock(multilock::Error),
    /// Bad use the argument parser cannot see: exit 2.
    Usage(String),
    /// Anything else: exit 1.
    Other(String),
}

impl From<multilock::Error> for Failure {
    fn from(err: multilock::Error) -> Self {
        Failure::Lock(err)
    }
}

/// Writes one line to stdout; see [`out!`].
pub fn write_out(line: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(err) = stdout
        .write_fmt(line)
        .and_then(|()| stdout.write_all(b"\n"))
    {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        eprintln!("multilock: writing the output: {err}");
        std::process::exit(1);
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage(&err),
    };
    let urls = node_urls(&cli.command);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("multilock: cannot start the runtime: {err}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Inspect(args) => inspect::run(args).await,
            Command::Watch(args) => watch::run(args).await,
            Command::List(args) => list::run(args).await,
            Command::Unlock(args) => unlock::run(args).await,
        }
    });
    // Background work of the nodes (health pollers, subscriptions) ends
    // with the runtime; none of it may keep the process alive.
    runtime.shutdown_background();
    let (code, message) = match result {
        Ok(Outcome::Done) => (0, None),
        Ok(Outcome::Failed(why)) => (1, Some(why)),
        Ok(Outcome::NothingHeld) => (3, None),
        Ok(Outcome::NotConfirmed) => (4, None),
        Err(Failure::Lock(err)) => (1, Some(output::error_chain(&err))),
        Err(Failure::Usage(why)) => (2, Some(why)),
        Err(Failure::Other(why)) => (1, Some(why)),
    };
    if let Some(message) = message {
        eprintln!("multilock: {}", scrub(&message, &urls));
    }
    ExitCode::from(code)
}

/// Prints clap's message (help, or a usage error) with every password in
/// the arguments masked: clap echoes a stray argument as it was typed, a
/// URL passed without `--node` included. Exits as clap would.
fn usage(err: &clap::Error) -> ExitCode {
    let urls: Vec<String> = std::env::args()
        .filter(|arg| arg.contains("://") && arg.contains('@'))
        .collect();
    let text = scrub(&err.render().to_string(), &urls);
    if err.use_stderr() {
        eprint!("{text}");
    } else {
        let _ = write!(std::io::stdout(), "{text}");
    }
    ExitCode::from(err.exit_code().clamp(0, 255) as u8)
}

/// The URLs given with `--node`.
fn node_urls(command: &Command) -> Vec<String> {
    match command {
        Command::Inspect(args) => args.nodes.nodes.clone(),
        Command::Watch(args) => args.nodes.nodes.clone(),
        Command::List(args) => args.nodes.nodes.clone(),
        Command::Unlock(args) => args.nodes.nodes.clone(),
    }
}

/// `message` with every given URL redacted and any password in them
/// replaced: a last guard, since the library's errors redact already.
fn scrub(message: &str, urls: &[String]) -> String {
    let mut message = message.to_owned();
    for url in urls {
        message = message.replace(url.as_str(), &multilock::redact_url(url));
        if let Some(secret) = password_of(url) {
            message = message.replace(secret, "***");
        }
    }
    message
}

/// The `user:password` part of a URL, when it has one.
fn password_of(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let credentials = &rest[..rest.rfind('@')?];
    let password = credentials
        .split_once(':')
        .map_or(credentials, |(_, pw)| pw);
    (password.len() >= 3).then_some(password)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_lose_urls_and_passwords() {
        let urls = vec!["redis://app:hunter2@127.0.0.1:1".to_owned()];
        assert_eq!(
            scrub("at redis://app:hunter2@127.0.0.1:1: hunter2", &urls),
            "at redis://***@127.0.0.1:1: ***"
        );
        assert_eq!(password_of("redis://:s3cret@h:1"), Some("s3cret"));
        assert_eq!(password_of("redis://h:1"), None);
    }
}
