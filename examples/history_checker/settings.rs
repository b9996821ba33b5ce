//! The command line: `--secs`, `--locks`, `--restarts`, `--seed`,
//! `--plant`, and which of them go together.

use crate::chaos::Restarts;
use crate::scenario::Locks;

/// The command line.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub secs: u64,
    pub locks: Locks,
    pub restarts: Restarts,
    pub seed: u64,
    pub plant: bool,
}

impl Settings {
    pub fn parse() -> Result<Settings, String> {
        let mut settings = Settings {
            secs: 30,
            locks: Locks::Classic,
            restarts: Restarts::Delayed,
            seed: rand::random(),
            plant: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = |what: &str| args.next().ok_or(format!("{arg} needs {what}"));
            match arg.as_str() {
                "--secs" => {
                    settings.secs = value("a number of seconds")?
                        .parse()
                        .map_err(|e| format!("--secs: {e}"))?;
                }
                "--locks" => {
                    settings.locks = match value("classic, family or fresh")?.as_str() {
                        "classic" => Locks::Classic,
                        "family" => Locks::Family,
                        "fresh" => Locks::Fresh,
                        other => return Err(format!("--locks {other}: classic, family or fresh")),
                    };
                }
                "--restarts" => {
                    let modes = "delayed, immediate, rolling or storm";
                    settings.restarts = match value(modes)?.as_str() {
                        "delayed" => Restarts::Delayed,
                        "immediate" => Restarts::Immediate,
                        "rolling" => Restarts::Rolling,
                        "storm" => Restarts::Storm,
                        other => return Err(format!("--restarts {other}: {modes}")),
                    };
                }
                "--seed" => {
                    settings.seed = value("a number")?
                        .parse()
                        .map_err(|e| format!("--seed: {e}"))?;
                }
                "--plant" => settings.plant = true,
                other => return Err(format!("unknown argument {other}")),
            }
        }
        if settings.secs == 0 {
            return Err("--secs must be at least 1".to_owned());
        }
        if settings.locks == Locks::Family && settings.restarts != Restarts::Delayed {
            return Err("--locks family runs with delayed restarts only".to_owned());
        }
        if settings.locks == Locks::Fresh && settings.restarts != Restarts::Delayed {
            return Err(
                "--locks fresh brings its own chaos (a RedLock node dead throughout, pauses): \
                 run it without --restarts"
                    .to_owned(),
            );
        }
        if settings.locks != Locks::Classic && settings.plant {
            return Err(
                "--plant plants into RedLocks of reentrant locks: run it with --locks classic"
                    .to_owned(),
            );
        }
        Ok(settings)
    }

    /// The restarts, as the run plays them.
    pub fn restarts_label(&self) -> String {
        if self.locks == Locks::Fresh {
            "none (a RedLock node dead throughout)".to_owned()
        } else {
            self.restarts.to_string()
        }
    }
}
