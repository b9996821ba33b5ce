//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`): an application installs any recorder (Prometheus, StatsD,
//! ...) and gets these. Without the feature every function here is empty
//! and compiles away.
//!
//! Labels are the lock kind (`kind`: `lock`, `multi_lock`, `red_lock`) and
//! the node's address (`node`, `host:port`), never the lock's name: names
//! are unbounded (a lock per order, per user), and a label per name would
//! grow the recorder without limit.
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
//! | `multilock_lost_holds_total` | counter | node | holds found gone (a renewal, or a later grant, proved them over) |
//! | `multilock_node_health_changes_total` | counter | node, state | a node became `suspect`, or `healthy` again |
//! | `multilock_primary_switches_total` | counter | node | a Sentinel node's sentinels named a new primary (the first one counts) |
//! | `multilock_hold_warnings_total` | counter | kind (node) | guards still held when their hold warning was due (`ClientBuilder::hold_warning`), one per guard at most |
//! | `multilock_held` | gauge | kind, node | holds this process has now |
//! | `multilock_fencing_floor_total` | counter | reason | fenced multi-node grants whose token came from the wall-clock floor, not a proof: `reason` is `new` (a name this client had not fenced lately) or `lost` (its counters were lost on too many nodes) |
//!
//! (node): single-node locks only; a multi-node acquire has no one node.
//!
//! deadpool reports its pool by a status you read
//! (`Pool::status()`); this crate pushes events to whatever recorder the
//! application runs, and offers the one state worth reading directly,
//! [`Node::health`](crate::Node::health).

use std::time::Duration;

/// The `kind` label of a lock: `lock` for a single-node [`Lock`], else its
/// quorum policy's [`LABEL`](crate::QuorumPolicy::LABEL).
///
/// [`Lock`]: crate::Lock
pub(crate) type Kind = &'static str;

/// The kind of a single-node lock.
pub(crate) const SINGLE: Kind = "lock";

/// The outcome of one acquire request sent to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptOutcome {
    Granted,
    Taken,
    /// Failed, timed out, or read too late.
    Failed,
}

#[cfg(feature = "metrics")]
mod recorded {
    use std::sync::Arc;

    use metrics::{Key, Label, Level, Metadata};

    use super::*;

    /// What the crate's metrics tell the recorder about where they come
    /// from, as the facade's macros do.
    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    /// One lock's metrics, labelled with its kind and node (a multi-node
    /// lock's, which records only its acquisitions, has no node): their
    /// keys are made once per node and kind ([`KeyCache`]), and every
    /// event hands the recorder a key it already has. Made per event, the
    /// labels' strings and the key's hash cost about 0.7 µs of an
    /// uncontended lock+unlock's client CPU (BENCHMARKS.md). The recorder
    /// is still asked at every event, so one installed after the lock was
    /// made gets them too.
    #[derive(Clone)]
    pub(crate) struct LockMetrics {
        kind: Kind,
        keys: Arc<LockKeys>,
    }

    struct LockKeys {
        attempts: Key,
        grants: Key,
        contended: Key,
        releases: Key,
        held: Key,
        acquire_seconds: Key,
        wait_seconds: Key,
    }

    impl LockMetrics {
        fn new(kind: Kind, node: Option<&str>) -> LockMetrics {
            let key = |name: &'static str| {
                let mut labels = vec![Label::new("kind", kind)];
                if let Some(node) = node {
                    labels.push(Label::new("node", node.to_owned()));
                }
                Key::from_parts(name, labels)
            };
            LockMetrics {
                kind,
                keys: Arc::new(LockKeys {
                    attempts: key("multilock_attempts_total"),
                    grants: key("multilock_grants_total"),
                    contended: key("multilock_contended_attempts_total"),
                    releases: key("multilock_releases_total"),
                    held: key("multilock_held"),
                    acquire_seconds: key("multilock_acquire_seconds"),
                    wait_seconds: key("multilock_wait_seconds"),
                }),
            }
        }

        /// The `kind` label.
        pub(crate) fn kind(&self) -> Kind {
            self.kind
        }

        /// An acquire request sent to the node, and its outcome.
        pub(crate) fn attempt(&self, outcome: AttemptOutcome) {
            let keys = &self.keys;
            count(&keys.attempts);
            match outcome {
                AttemptOutcome::Granted => count(&keys.grants),
                AttemptOutcome::Taken => count(&keys.contended),
                AttemptOutcome::Failed => {}
            }
        }

        /// An acquire that got the lock: how long it took, and of that how
        /// long it waited for someone else's hold.
        pub(crate) fn acquired(&self, took: Duration, waited: Option<Duration>) {
            let histogram = |key| metrics::with_recorder(|r| r.register_histogram(key, &METADATA));
            histogram(&self.keys.acquire_seconds).record(took.as_secs_f64());
            if let Some(waited) = waited {
                histogram(&self.keys.wait_seconds).record(waited.as_secs_f64());
            }
        }

        /// Holds of this process on the node: `change` more.
        pub(crate) fn held(&self, change: f64) {
            metrics::with_recorder(|r| r.register_gauge(&self.keys.held, &METADATA))
                .increment(change);
        }

        /// A release sent.
        pub(crate) fn released(&self) {
            count(&self.keys.releases);
        }
    }

    /// The metrics of the locks of one node (or of the multi-node locks),
    /// by kind: made once per node and kind, so a lock made for each
    /// operation finds its keys made already. Bounded by the kinds: one
    /// per quorum policy, and `lock`.
    #[derive(Default)]
    pub(crate) struct KeyCache(std::sync::Mutex<Vec<LockMetrics>>);

    impl KeyCache {
        /// The metrics of a lock of `kind` on `node` (`None`: a multi-node
        /// lock's), from this cache.
        pub(crate) fn lock_metrics(&self, kind: Kind, node: Option<&str>) -> LockMetrics {
            let mut known = self.0.lock().unwrap();
            if let Some(metrics) = known.iter().find(|m| m.kind == kind) {
                return metrics.clone();
            }
            let metrics = LockMetrics::new(kind, node);
            known.push(metrics.clone());
            metrics
        }
    }

    fn count(key: &Key) {
        metrics::with_recorder(|r| r.register_counter(key, &METADATA)).increment(1);
    }

    pub(crate) fn hold_warning(kind: Kind, node: Option<&str>) {
        let mut labels = vec![("kind", kind.to_owned())];
        if let Some(node) = node {
            labels.push(("node", node.to_owned()));
        }
        metrics::counter!("multilock_hold_warnings_total", &labels).increment(1);
    }

    pub(crate) fn renewal(node: &str) {
        metrics::counter!("multilock_renewals_total", "node" => node.to_owned()).increment(1);
    }

    pub(crate) fn lost_hold(node: &str) {
        metrics::counter!("multilock_lost_holds_total", "node" => node.to_owned()).increment(1);
    }

    pub(crate) fn health_changed(node: &str, suspect: bool) {
        let state = if suspect { "suspect" } else { "healthy" };
        metrics::counter!(
            "multilock_node_health_changes_total",
            "node" => node.to_owned(),
            "state" => state
        )
        .increment(1);
    }

    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    pub(crate) fn primary_switched(node: &str) {
        metrics::counter!("multilock_primary_switches_total", "node" => node.to_owned())
            .increment(1);
    }

    pub(crate) fn fencing_floor(new_name: bool) {
        let reason = if new_name { "new" } else { "lost" };
        metrics::counter!("multilock_fencing_floor_total", "reason" => reason).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
#[allow(clippy::missing_const_for_fn)]
mod recorded {
    use super::*;

    /// One lock's metrics: its kind, and nothing to record.
    #[derive(Clone)]
    pub(crate) struct LockMetrics {
        kind: Kind,
    }

    /// Nothing to keep.
    #[derive(Default)]
    pub(crate) struct KeyCache;

    impl KeyCache {
        pub(crate) fn lock_metrics(&self, kind: Kind, _: Option<&str>) -> LockMetrics {
            LockMetrics { kind }
        }
    }

    impl LockMetrics {
        pub(crate) fn kind(&self) -> Kind {
            self.kind
        }
        pub(crate) fn attempt(&self, _: AttemptOutcome) {}
        pub(crate) fn acquired(&self, _: Duration, _: Option<Duration>) {}
        pub(crate) fn held(&self, _: f64) {}
        pub(crate) fn released(&self) {}
    }

    pub(crate) fn hold_warning(_: Kind, _: Option<&str>) {}
    pub(crate) fn renewal(_: &str) {}
    pub(crate) fn lost_hold(_: &str) {}
    pub(crate) fn health_changed(_: &str, _: bool) {}

    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    pub(crate) fn primary_switched(_: &str) {}
    pub(crate) fn fencing_floor(_: bool) {}
}

pub(crate) use recorded::*;
