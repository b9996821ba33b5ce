//! This process's own CPU time: what the examples that measure a client
//! (`client_cpu`, `redlock_loop`, `cluster_loop`) read around a run. The
//! servers are other processes, so their work is not in it.

use std::io;

/// This process's user and system CPU seconds so far, all threads, as the
/// kernel counts them in `/proc/self/stat` (clock ticks of 1/100 s): read
/// before and after a run, the difference is the client's CPU. Linux only.
///
/// # Examples
///
/// ```
/// let (user, system) = multilock_testkit::process_cpu_seconds()?;
/// assert!(user >= 0.0 && system >= 0.0);
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// # Errors
///
/// The file cannot be read (not Linux) or is not in the expected shape.
pub fn process_cpu_seconds() -> io::Result<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let malformed = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/self/stat: {what}"),
        )
    };
    // The fields after the command name, which is in parentheses and may
    // hold spaces.
    let name_end = stat
        .rfind(')')
        .ok_or_else(|| malformed("no command name"))?;
    let fields: Vec<&str> = stat[name_end + 2..].split(' ').collect();
    // utime and stime: fields 14 and 15, 11 and 12 after the name.
    let seconds = |i: usize| -> io::Result<f64> {
        let ticks = fields.get(i).ok_or_else(|| malformed("too few fields"))?;
        let ticks: f64 = ticks
            .parse()
            .map_err(|_| malformed("a field that is no number"))?;
        Ok(ticks / 100.0)
    };
    Ok((seconds(11)?, seconds(12)?))
}
