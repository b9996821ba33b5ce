//! The command line: subcommands, the node selection they share, and the
//! help text with examples and exit codes.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

const AFTER_HELP: &str = "\
Examples:
  multilock inspect orders:42 --node redis://127.0.0.1:6379
  multilock inspect orders:42 --node redis://h1:6379 --node redis://h2:6379 --node redis://h3:6379 --json
  multilock watch orders:42 --sentinel mymaster --node redis://s1:26379 --node redis://s2:26379
  multilock list --match 'orders:*' --cluster --node redis://c1:7000 --node redis://c2:7000
  multilock unlock orders:42 --force --node redis://:secret@127.0.0.1:6379

Nodes: one --node is a single server; two or more are a RedLock over them
(--all: a MultiLock, every node must hold); --sentinel NAME makes the --node
URLs a Sentinel group's sentinels, --cluster a Redis Cluster's seeds.
Passwords go in the URLs (redis://user:password@host:port) and are never printed.

Exit codes:
  0  success (inspect: at least one node answered, whatever the verdict;
     watch: N changes printed, or Ctrl-C)
  1  runtime failure: a node unreachable or failing, a server error
     (inspect: no node answered; unlock: a node not inspected or failing)
  2  usage: bad arguments (unlock: --force missing)
  3  unlock: nothing was held, nothing deleted
  4  unlock: not confirmed
  141 stdout was closed (the reader of a pipe left, as with `| head`)";

const INSPECT_HELP: &str = "\
Examples:
  multilock inspect orders:42 --node redis://127.0.0.1:6379
  multilock inspect jobs --kind fair --node redis://127.0.0.1:6379 --json | jq .verdict
  multilock inspect orders:42 --node redis://h1:6379 --node redis://h2:6379 --node redis://h3:6379

Every key of Redisson's lock family under NAME is read whatever --kind says
(holders, the read-write mode and read holds, the fair queue, the fencing
counter), so --kind only picks the handle; the default `lock` fits all.

--json prints one object:
  {\"name\": str, \"quorum\": int,
   \"verdict\": {\"state\": \"free\"|\"held\"|\"split\"|\"unknown\",
               \"claims\": [{\"field\": str, \"nodes\": [str]}], \"unanswered\": [str]},
   \"nodes\": [{\"node\": str, \"name\": str, \"ok\": bool, \"error\": str|null,
              \"ttl_ms\": int|null, \"mode\": \"read\"|\"write\"|null,
              \"holders\": [{\"field\": str, \"client_id\": str, \"owner\": str, \"holds\": int,
                           \"writer\": bool, \"read_holds_ttl_ms\": [int|null]}],
              \"queue\": [{\"field\": str, \"client_id\": str, \"owner\": str,
                         \"deadline_ms\": int|null, \"deadline_in_ms\": int|null}],
              \"fencing_counter\": int|null, \"server_time_ms\": int|null,
              \"truncated\": bool, \"unreadable\": [str]}]}
  (times in ms; deadline_ms is epoch ms in the waiter's client's clock,
   deadline_in_ms is relative to the node's clock, negative once passed)

Exit codes: 0 when at least one node answered (whatever the verdict: read it
from the output), 1 when none did, 2 usage.";

const WATCH_HELP: &str = "\
Examples:
  multilock watch orders:42 --node redis://127.0.0.1:6379
  multilock watch orders:42 --interval 250ms --changes 2 --node redis://127.0.0.1:6379
  multilock watch jobs --json --cluster --node redis://c1:7000

Each line is a change, with an RFC 3339 timestamp (UTC) and the node:
grant (a new holder), release (a holder gone), count (re-entry or a hold
count change), waiter (a new fair-queue waiter), left (a waiter gone),
renewal (the lock's TTL went up), down / up (a node stopped or started
answering). The first line is the state at start (not a change).
--json prints one object per line:
  {\"time\": str, \"node\": str, \"event\": str, \"field\": str|null, \"detail\": str}

Exit codes: 0 after --changes N changes or on Ctrl-C, 1 when the nodes
cannot be set up, 2 usage.";

const LIST_HELP: &str = "\
Examples:
  multilock list --node redis://127.0.0.1:6379
  multilock list --match 'orders:*' --json --node redis://127.0.0.1:6379
  multilock list --match 'orders:*' --cluster --node redis://c1:7000   # every primary

Scans with SCAN ... TYPE hash in bounded steps (never KEYS) and keeps the
hashes of Redisson's lock shape; kind is `lock` (reentrant or fair) or `rw`.
--json prints {\"pattern\": str, \"locks\": [{\"name\": str, \"node\": str, \"kind\": str}],
\"errors\": [{\"node\": str, \"error\": str}]}.

Exit codes: 0 (even when nothing matched), 1 when a node failed, 2 usage.";

const UNLOCK_HELP: &str = "\
Examples:
  multilock unlock orders:42 --force --node redis://127.0.0.1:6379
  multilock unlock orders:42 --force --yes --node redis://h1:6379 --node redis://h2:6379 --node redis://h3:6379
  multilock unlock catalog --force --kind rw --yes --sentinel mymaster --node redis://s1:26379

Deletes the lock whoever holds it, as Redisson's forceUnlock does, on each
node, and publishes the unlock message so that waiting clients (Redisson's
too) wake at once. The lock is inspected first; --kind auto (the default)
then picks, per node: a read-write lock's force unlock in the mode it is in,
else the fair lock's when waiters queue, else the reentrant lock's. --kind rw
uses the mode found; --kind lock / fair force that kind. Nodes that could not
be inspected are left alone. Without --yes, asks for y on stdin, then
inspects again: if the holders changed meanwhile, nothing is deleted.

Exit codes: 0 deleted (on at least one node), 1 a node failed (or was not
inspected, or the holders changed before the confirmation, or --kind does not
match what is held), 2 usage (also without --force), 3 nothing was held,
4 not confirmed.";

/// `multilock`: inspect, watch, list and force-unlock distributed locks on
/// Redis, ours and Redisson's.
#[derive(Debug, Parser)]
#[command(name = "multilock", version, about, after_help = AFTER_HELP)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Who holds a lock, on which nodes, with which TTL, and who waits.
    #[command(after_help = INSPECT_HELP)]
    Inspect(InspectArgs),
    /// Print each change of a lock as it happens.
    #[command(after_help = WATCH_HELP)]
    Watch(WatchArgs),
    /// The locks whose names match a pattern.
    #[command(after_help = LIST_HELP)]
    List(ListArgs),
    /// Delete a lock whoever holds it, and wake its waiters.
    #[command(after_help = UNLOCK_HELP)]
    Unlock(UnlockArgs),
}

/// The nodes a command talks to.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// A node's URL (`redis://[user:password@]host:port[/db]`, `rediss://`
    /// with the `tls` feature); repeat it for a RedLock, or for a Sentinel
    /// group's sentinels or a Cluster's seeds.
    #[arg(long = "node", value_name = "URL", required = true)]
    pub nodes: Vec<String>,
    /// With two or more --node: a MultiLock (every node must hold) instead
    /// of a RedLock (a majority).
    #[arg(long)]
    pub all: bool,
    /// The --node URLs are the sentinels of the group that names this
    /// master.
    #[arg(long, value_name = "MASTER_NAME", conflicts_with = "cluster")]
    pub sentinel: Option<String>,
    /// The password of a Sentinel group's data nodes (the sentinels' own
    /// go in their URLs).
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "MULTILOCK_DATA_PASSWORD",
        hide_env_values = true,
        requires = "sentinel"
    )]
    pub data_password: Option<String>,
    /// The --node URLs are seeds of one Redis Cluster.
    #[arg(long)]
    pub cluster: bool,
    /// Connect and response timeout per node (e.g. 500ms, 2s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
}

/// The handle `inspect` reads through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InspectKind {
    /// The reentrant lock.
    Lock,
    /// The fair lock.
    Fair,
    /// The read-write lock.
    Rw,
}

/// The force unlock `unlock` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UnlockKind {
    /// Chosen per node from what is stored there.
    Auto,
    /// The reentrant lock's.
    Lock,
    /// The fair lock's.
    Fair,
    /// The read-write lock's, in the mode it is in.
    Rw,
}

/// `inspect`'s arguments.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The lock's name.
    pub name: String,
    /// The handle to inspect through (every key is read whatever it is).
    #[arg(long, value_enum, default_value_t = InspectKind::Lock)]
    pub kind: InspectKind,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub nodes: NodeArgs,
}

/// `watch`'s arguments.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The lock's name.
    pub name: String,
    /// How often to read the lock (e.g. 250ms, 1s, 1m).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1s")]
    pub interval: Duration,
    /// Exit after printing this many changes (1 or more).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub changes: Option<u64>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub nodes: NodeArgs,
}

/// `list`'s arguments.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// A SCAN MATCH glob.
    #[arg(long = "match", value_name = "PATTERN", default_value = "*")]
    pub pattern: String,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub nodes: NodeArgs,
}

/// `unlock`'s arguments.
#[derive(Debug, Args)]
pub struct UnlockArgs {
    /// The lock's name.
    pub name: String,
    /// Required: deleting a lock someone holds breaks their mutual
    /// exclusion.
    #[arg(long)]
    pub force: bool,
    /// The force unlock to use.
    #[arg(long, value_enum, default_value_t = UnlockKind::Auto)]
    pub kind: UnlockKind,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub yes: bool,
    #[command(flatten)]
    pub nodes: NodeArgs,
}

/// A duration as `250ms`, `2s`, `1.5s`, `1m` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (e.g. 500ms, 2s, 1m)"))?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" | "min" => number * 60.0,
        other => return Err(format!("unknown unit `{other}` (ms, s or m)")),
    };
    if !(seconds > 0.0 && seconds.is_finite() && seconds < 86_400.0 * 365.0) {
        return Err(format!("`{text}` must be above zero"));
    }
    // Checked after the conversion: a tiny number rounds to zero.
    let duration = Duration::from_secs_f64(seconds);
    if duration < Duration::from_millis(1) {
        return Err(format!("`{text}` is below a millisecond"));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("0.0000001ms").is_err());
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("fast").is_err());
    }
}
