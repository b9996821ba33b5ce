//! Running the examples, the tests and the chaos checks: what they need
//! on the machine, the variables that steer them, and what
//! `failure_modes` and `history_checker` show. (The commands themselves are
//! in the README's "Run it", which CI runs as written.)
//!
//! # Prerequisites
//!
//! Prerequisites (Debian or Ubuntu), besides Rust and a running Docker engine:
//!
//! ```sh
//! apt-get install -y redis-server procps openssl faketime
//! ```
//!
//! (`procps` gives the test kit `kill` for SIGSTOP/SIGCONT/SIGKILL, `openssl`
//! makes the TLS test's certificate, `faketime` runs the wall-clock jump
//! test.) These pass on a machine with those packages and a running Docker
//! engine, with no registry and no variable set. The tests start real
//! `redis-server` processes on free loopback ports and, for the failover
//! suite, Docker containers. The image is `redis:7`; when it cannot be pulled,
//! the test kit builds `multilock-redis:local` from the host's `redis-server`
//! (the recipe of `docker/build-local-image.sh`) the first time it needs it,
//! says so once, and uses it.
//!
//! # Variables
//!
//! Variables, all optional:
//!
//! | variable | what it does |
//! |---|---|
//! | `MULTILOCK_REDIS_SERVER` | the `redis-server` binary for processes and for the local image (default: the one on `PATH`) |
//! | `MULTILOCK_REDIS_IMAGE` | the container image to use, with no fallback (e.g. `multilock-redis:local`) |
//! | `MULTILOCK_LOCAL_IMAGE` | the tag of the image the kit builds (default `multilock-redis:local`) |
//! | `MULTILOCK_BACKEND` | `processes` (default) or `containers`: the backend of the kit's `AnyServer` |
//! | `MULTILOCK_KEEP_CONTAINERS` | `1` keeps containers and networks after a test, for debugging |
//! | `MULTILOCK_MODEL` | other bounds for the fencing model check, e.g. `"grants=2 crashes=2 rounds=2 repairs=2"` (keys: nodes, clients, grants, crashes, drops, rounds, repairs, fresh, beyond) |
//!
//! # `failure_modes`
//!
//! `failure_modes` kills, freezes, restarts and cuts off servers under each lock
//! type and prints who kept mutual exclusion, who stayed available and how fast,
//! one progress line per scenario (a few minutes). It uses containers when
//! Docker works (building the image as above), `redis-server` processes
//! otherwise (`-- --processes` forces them), and draws a timeline of who held
//! the lock when to `target/failure_modes.svg`. A second table, "Sentinel
//! failover", then kills a real Sentinel group's primary while its replicas lag
//! behind a grant (`redis-server` processes, whichever the backend, ~15 s): a
//! lock on one `Node::sentinel` is granted twice, as asynchronous replication
//! allows; a RedLock over three Sentinel groups, the fault on one, keeps mutual
//! exclusion and grants the next client as soon as the holder unlocks. A dated
//! run is in `BENCHMARKS.md` (in the repository).
//!
//! # Your servers
//!
//! `cargo run --example quickstart --
//! redis://host:6379 ...` uses your servers.
//!
//! # `history_checker`
//!
//! `cargo run --example
//! history_checker -- --secs 600` runs RedLock and MultiLock under chaos and
//! checks the recorded history (no two holders within validity, tokens in
//! grant order, no fenced write refused within validity, no key left over);
//! `-- --restarts rolling` restarts nodes empty every few seconds and also
//! checks that no fenced name waits more than 3 s for a grant; `-- --locks
//! family` runs RedLocks of read and write locks, a fair lock and a RedLock of
//! fair locks under the same chaos and checks that writes overlap nothing,
//! reads did overlap, the fair lock granted the head of its queue every time
//! (replayed from the node's `MONITOR` stream), and no queue entry outlived its
//! waiter's wait by more than 5 s. CI runs all three (for 30 to 60 s
//! each), and two more runs of fenced RedLocks' availability, `-- --restarts
//! storm` and `-- --locks fresh` (see [`fencing`](super::fencing#the-guarantee)).
