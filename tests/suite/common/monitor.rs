//! MONITOR, parsed: every command a server runs from the moment the
//! monitor is set up, the commands that scripts run included, in the order
//! the server ran them and with its clock.

use futures::{Stream, StreamExt};

/// One command the server ran.
#[derive(Debug, Clone)]
pub struct MonitorLine {
    /// Server time, in seconds.
    pub at: f64,
    /// Run by a script (`[0 lua]`), not sent by a client.
    pub from_script: bool,
    /// The command, lowercase, then its arguments.
    pub args: Vec<String>,
}

impl MonitorLine {
    pub fn command(&self) -> &str {
        self.args.first().map_or("", String::as_str)
    }

    /// Whether an argument (after the command) is exactly `value`.
    pub fn has_arg(&self, value: &str) -> bool {
        self.args.iter().skip(1).any(|arg| arg == value)
    }

    /// `1700000000.123456 [0 127.0.0.1:5555] "evalsha" "ab12..." "1" "key"`,
    /// or `[0 lua]` for a command run by a script.
    fn parse(line: &str) -> Option<MonitorLine> {
        let (at, rest) = line.split_once(' ')?;
        let (origin, rest) = rest.strip_prefix('[')?.split_once(']')?;
        let mut args = Vec::new();
        let mut chars = rest.chars();
        while let Some(c) = chars.next() {
            if c != '"' {
                continue;
            }
            let mut arg = String::new();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => match chars.next()? {
                        'n' => arg.push('\n'),
                        'r' => arg.push('\r'),
                        't' => arg.push('\t'),
                        'a' => arg.push('\u{7}'),
                        'b' => arg.push('\u{8}'),
                        'x' => {
                            let hex: String = chars.by_ref().take(2).collect();
                            arg.push(char::from(u8::from_str_radix(&hex, 16).ok()?));
                        }
                        other => arg.push(other),
                    },
                    other => arg.push(other),
                }
            }
            args.push(arg);
        }
        if let Some(command) = args.first_mut() {
            *command = command.to_lowercase();
        }
        Some(MonitorLine {
            at: at.parse().ok()?,
            from_script: origin.ends_with(" lua"),
            args,
        })
    }
}

/// Every command `url` runs from now on (MONITOR is on when this returns).
pub async fn monitor(url: &str) -> impl Stream<Item = MonitorLine> + Unpin + Send + use<> {
    let monitor = redis::Client::open(url)
        .unwrap()
        .get_async_monitor()
        .await
        .unwrap_or_else(|err| panic!("cannot MONITOR {url}: {err}"));
    monitor
        .into_on_message::<String>()
        .map(|line| MonitorLine::parse(&line).unwrap_or_else(|| panic!("MONITOR line {line:?}")))
}

#[test]
fn monitor_lines_parse() {
    let line = MonitorLine::parse(
        r#"1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "ab12" "1" "a \"b\"\\c" "\x01""#,
    )
    .unwrap();
    assert_eq!(line.at, 1_700_000_000.123456);
    assert!(!line.from_script);
    assert_eq!(line.args, ["evalsha", "ab12", "1", "a \"b\"\\c", "\u{1}"]);
    assert!(line.has_arg("a \"b\"\\c") && !line.has_arg("evalsha"));
    let scripted = MonitorLine::parse(r#"1700000000.5 [0 lua] "hexists" "k" "f""#).unwrap();
    assert!(scripted.from_script);
    assert_eq!(scripted.command(), "hexists");
}
