//! What the crate tells you while it runs: `tracing` spans, the metrics of
//! the `metrics` feature, and a node's health.
//!
//! # Observability
//!
//! `tracing` spans on acquire, release and renew carry the
//! lock name, node and elapsed time; with the `metrics` feature the crate
//! records through the [`metrics`](https://docs.rs/metrics) facade (below;
//! `cargo run --example metrics --features metrics` serves them for
//! Prometheus).
//!
//! A guard held longer than its hold warning
//! ([`ClientBuilder::hold_warning`], `with_hold_warning`; none by default)
//! logs one `WARN` event, once per guard: the lock (`lock`), its owner
//! (`owner`), the nodes that still hold it (`nodes`) and how long it has
//! been held (`held_ms`); with `metrics` it also counts one
//! `multilock_hold_warnings_total`.
//!
//! # Metrics
//!
//!
//! With `metrics`, labels are the lock kind (`kind`: `lock`, `multi_lock`,
//! `red_lock`) and the node (`node`, `host:port`), never the lock name, whose
//! values are unbounded:
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `multilock_acquire_seconds` | histogram | kind (node) | how long an acquire that got the lock took |
//! | `multilock_wait_seconds` | histogram | kind (node) | of that, the time from first finding it held by someone else to the grant |
//! | `multilock_attempts_total` | counter | kind, node | acquire requests sent to a node |
//! | `multilock_contended_attempts_total` | counter | kind, node | of those, found held by someone else |
//! | `multilock_grants_total` | counter | kind, node | of those, granted |
//! | `multilock_releases_total` | counter | kind, node | releases sent |
//! | `multilock_renewals_total` | counter | node | renewal calls (one renews up to 500 holds) |
//! | `multilock_lost_holds_total` | counter | node | holds found gone |
//! | `multilock_node_health_changes_total` | counter | node, state | a node became `suspect`, or `healthy` again |
//! | `multilock_primary_switches_total` | counter | node | a Sentinel node's sentinels named a new primary (the first one counts); a Cluster node's slot changed hands |
//! | `multilock_hold_warnings_total` | counter | kind (node) | guards still held when their hold warning was due ([`ClientBuilder::hold_warning`], `with_hold_warning`), one per guard at most |
//! | `multilock_held` | gauge | kind, node | holds this process has now |
//! | `multilock_fencing_floor_total` | counter | reason | fenced multi-node grants whose token came from the wall-clock floor, not a proof: `reason` is `new` (a name this client had not fenced lately) or `lost` (its counters were lost on too many nodes); see [`fencing`](super::fencing) |
//!
//! (node): single-node locks only. Where deadpool offers a status to read
//! (`Pool::status()`), this crate pushes events to the recorder, and offers
//! the one state worth reading directly, [`Node::health`].
//!
//! [`Node::health`]: crate::Node::health
//! [`ClientBuilder::hold_warning`]: crate::ClientBuilder::hold_warning
