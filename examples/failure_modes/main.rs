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
//! Containers use the test kit's image (`MULTILOCK_REDIS_IMAGE`, default
//! `redis:7`; offline: `bash docker/build-local-image.sh` and
//! `MULTILOCK_REDIS_IMAGE=multilock-redis:local`). Without Docker the same
//! scenarios run on `redis-server` processes, except the network partition,
//! which needs containers.
//!
//! Every scenario is one protocol: client A takes the lock, a fault is
//! injected, client B tries while A still believes it holds the lock
//! (phase 1), then A lets go and B tries again (phase 2). Printed: a table
//! of scenario × lock type with "mutual exclusion kept? / lock available? /
//! B's time to acquire", and `target/failure_modes.svg`, a timeline of who
//! held the lock when.
//!
//! The servers come from the test kit (`AnyServer`, `ReplicatedPair`);
//! `topology.rs` says which servers each lock type runs on,
//! `scenarios.rs` plays the faults, `report.rs` draws the table and the
//! timeline.

mod report;
mod scenarios;
mod topology;

use std::time::Instant;

use multilock::testkit::Backend;

use crate::scenarios::{Scenario, run_cell};
use crate::topology::Kind;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = pick_backend().await;
    println!("backend: {backend:?}");
    let started = Instant::now();
    let mut results = Vec::new();
    for scenario in Scenario::ALL {
        let mut cells = Vec::new();
        for kind in Kind::ALL {
            let cell_started = Instant::now();
            let cell = run_cell(scenario, kind, backend).await;
            println!(
                "  {:<30} {:<26} {:<28} ({:.1} s)",
                scenario.title(),
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
    let path = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("failure_modes.svg");
    std::fs::create_dir_all(path.parent().expect("in target/"))?;
    std::fs::write(&path, report::svg(&results, backend))?;
    println!(
        "\ntimeline: {} (total {:.0} s)",
        path.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Containers when they run here (unless `--processes`), else processes.
async fn pick_backend() -> Backend {
    if std::env::args().any(|a| a == "--processes") {
        return Backend::Processes;
    }
    match Backend::Containers.check().await {
        Ok(()) => Backend::Containers,
        Err(err) => {
            println!("containers unavailable ({err}); using redis-server processes");
            Backend::Processes
        }
    }
}
