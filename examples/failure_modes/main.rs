//! Failure modes side by side: what a single master with an async replica
//! (plain, and with `WAIT`-based replica sync), a `MultiLock` and a
//! `RedLock` do when servers die, freeze, restart empty or are cut off, and
//! when a holder stalls past its lease.
//!
//! ```text
//! cargo run --example failure_modes                 # containers if Docker works, else processes
//! cargo run --example failure_modes -- --processes  # local redis-server processes only
//! ```
//!
//! Containers run the test kit's image: `redis:7`, pulled when missing, or,
//! when it cannot be pulled (no registry), `multilock-redis:local`, which
//! the kit builds from the host's `redis-server` on first use (a few
//! seconds; the run prints which image it uses). Without Docker the same
//! scenarios run on `redis-server` processes, except the network
//! partition, which needs containers.
//!
//! Every scenario is one protocol: client A takes the lock, a fault is
//! injected, client B tries while A still believes it holds the lock
//! (phase 1), then A lets go and B tries again (phase 2). Printed: a line
//! per cell as it finishes, then a table of scenario × lock type with
//! "mutual exclusion kept? / lock available? / B's time to acquire after A
//! let go", and `target/failure_modes.svg`, a timeline of who held the
//! lock when.
//!
//! Then a second, smaller table, "Sentinel failover", plays the first row
//! for real: Sentinel groups (a primary, 2 replicas, 3 sentinels) whose
//! replicas miss A's grant, a primary killed, a replica promoted by the
//! sentinels' vote. One column locks on one `Node::sentinel`, and shows
//! the double grant asynchronous replication allows; the other is a
//! RedLock over three Sentinel groups, the fault on one of them, and keeps
//! mutual exclusion. Sentinel groups are `redis-server` processes in the
//! test kit, so this table runs on processes whatever the backend.
//!
//! The servers come from the test kit (`AnyServer`, `ReplicatedPair`,
//! `SentinelGroup`); `topology.rs` says which servers each lock type runs
//! on, `scenarios.rs` plays the faults, `report.rs` draws the table and the
//! timeline, `sentinel.rs` plays and prints the Sentinel table.

mod report;
mod scenarios;
mod sentinel;
mod topology;

use std::time::Instant;

use multilock_testkit::Backend;
use multilock_testkit::containers::{ImageOrigin, redis_image};

use crate::scenarios::{Scenario, run_cell};
use crate::sentinel::Column;
use crate::topology::Kind;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let (backend, servers, servers_short) = pick_backend().await;
    println!("servers: {servers}");
    println!(
        "{} scenarios x {} lock types, each on fresh servers (a few minutes):",
        Scenario::ALL.len(),
        Kind::ALL.len()
    );
    let mut results = Vec::new();
    for (i, scenario) in Scenario::ALL.into_iter().enumerate() {
        println!(
            "[{}/{}] {} ({:.0} s so far)",
            i + 1,
            Scenario::ALL.len(),
            scenario.title(),
            started.elapsed().as_secs_f64()
        );
        let mut cells = Vec::new();
        for kind in Kind::ALL {
            let cell_started = Instant::now();
            let cell = run_cell(scenario, kind, backend).await;
            println!(
                "      {:<26} {:<30} ({:.1} s)",
                kind.title(),
                report::cell_text(&cell),
                cell_started.elapsed().as_secs_f64()
            );
            cells.push(cell);
        }
        results.push((scenario, cells));
    }
    println!();
    report::print_table(&results);
    println!("{FAMILY_NOTE}");
    let path = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("failure_modes.svg");
    std::fs::create_dir_all(path.parent().expect("in target/"))?;
    std::fs::write(&path, report::svg(&results, &servers_short))?;
    println!("\ntimeline: {}", path.display());

    println!(
        "\n{} (Sentinel groups of redis-server processes, {:.0} s so far):",
        sentinel::TITLE,
        started.elapsed().as_secs_f64()
    );
    let mut sentinel_results = Vec::new();
    for column in Column::ALL {
        let cell_started = Instant::now();
        let cell = sentinel::run(column).await;
        println!(
            "      {:<40} {} ({:.1} s)",
            column.title(),
            sentinel::cell_text(&cell),
            cell_started.elapsed().as_secs_f64()
        );
        sentinel_results.push((column, cell));
    }
    println!();
    sentinel::print_table(&sentinel_results);
    println!("\n(total {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}

/// Where the rest of Redisson's lock family behaves differently under these
/// faults (every column holds for them as for the reentrant lock: a fair
/// lock or a read-write lock is the same hash, counted the same way).
const FAMILY_NOTE: &str = "\
The lock family under the same faults (fair and read-write locks, alone or as parts):
- exclusion is as in each column: their holds are the same hash, counted the same way;
- fair lock: a waiter whose node froze or died cannot leave that node's queue at once;
  it retries in the background within its share of the queue, and otherwise its entry
  goes when its deadline passes (its own wait, or 5 minutes for lock()); a waiter that
  crashed keeps its turn that long, and the waiters behind it re-poll meanwhile;
- read-write lock: a read hold is trusted for its own lease only (another reader's release
  can shorten the hash to the longest read key left); a crashed reader's holds expire on
  their own and let writers in; a restart without persistence loses read holds as it
  loses any hold (the 'restart' rows).";

/// Containers when they run here (unless `--processes`), else processes;
/// what the servers are, in words: in full (for the terminal) and short
/// (for the picture).
async fn pick_backend() -> (Backend, String, String) {
    let processes = || {
        let words = "redis-server processes".to_owned();
        (Backend::Processes, words.clone(), words)
    };
    if std::env::args().any(|a| a == "--processes") {
        return processes();
    }
    println!("checking Docker (without registry access, the first run builds the Redis image)...");
    if let Err(err) = Backend::Containers.check().await {
        println!("containers unavailable ({err}); using redis-server processes");
        return processes();
    }
    match redis_image().await {
        Ok(image) => {
            let short = match image.origin() {
                ImageOrigin::Local {
                    source, version, ..
                } => format!(
                    "Docker containers, image {} (Redis {} from {})",
                    image.name(),
                    version.as_deref().unwrap_or("?"),
                    source.display()
                ),
                _ => format!("Docker containers, image {}", image.name()),
            };
            (
                Backend::Containers,
                format!("Docker containers, image {image}"),
                short,
            )
        }
        Err(err) => {
            let words = format!("Docker containers ({err})");
            (Backend::Containers, words.clone(), words)
        }
    }
}
