//! What a fenced name's nodes hold while it waits long for a grant: every
//! 250 ms, a name that no recorded hold has held for [`LOOK_AFTER`] is
//! inspected on every RedLock node (at most once a second), and the
//! journal keeps what each node held then, by whom and for how long. A
//! wait the run fails on then shows whether a key nobody recorded held the
//! name (a release or a rollback that did not reach a node) or the nodes
//! were free and the rounds failed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use multilock::inspect::NodeInspection;
use multilock::{Client, Node, RedLock};
use multilock_testkit::History;
use tokio::sync::watch;

/// The message of a look, which the report always shows.
pub const LOOKED: &str = "free this long; its nodes hold";

/// How long a name sits free before its nodes are looked at.
const LOOK_AFTER: Duration = Duration::from_millis(2_500);
/// How often a name still free is looked at again.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// Each node's share of a look: a paused node costs no more.
const NODE_TIMEOUT: Duration = Duration::from_millis(150);

/// Looks at `names` on the nodes at `urls` until `stop`, with a client of
/// its own (its requests do not touch the workers' view of the nodes).
/// `clients`: each worker client's id and label, to name holders.
pub async fn look(
    names: Vec<String>,
    urls: Vec<String>,
    clients: Vec<(String, String)>,
    history: Arc<History>,
    mut stop: watch::Receiver<bool>,
) -> multilock::Result<()> {
    let client = Client::new();
    let nodes = urls
        .iter()
        .map(|url| Node::builder(url).response_timeout(NODE_TIMEOUT).build())
        .collect::<multilock::Result<Vec<_>>>()?;
    let locks = names
        .iter()
        .map(|name| client.red_lock_on(&nodes, name.as_str()))
        .collect::<multilock::Result<Vec<RedLock>>>()?;
    let mut looked: HashMap<String, Instant> = HashMap::new();
    while !*stop.borrow() {
        let now = Instant::now();
        for (name, free_for) in free_names(&history, &names) {
            let due = looked.get(&name).is_none_or(|at| now - *at >= LOOK_EVERY);
            if free_for < LOOK_AFTER || !due {
                continue;
            }
            looked.insert(name.clone(), now);
            let lock = &locks[names.iter().position(|n| *n == name).unwrap_or(0)];
            let held = match lock.inspect().await {
                Ok(inspection) => inspection
                    .nodes
                    .iter()
                    .map(|node| describe(node, &clients))
                    .collect::<Vec<_>>()
                    .join(", "),
                Err(err) => format!("not inspected: {err}"),
            };
            tracing::info!(target: "history_checker", lock = %name, ?free_for, %held, "{LOOKED}");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = stop.wait_for(|stopped| *stopped) => {}
        }
    }
    Ok(())
}

/// The names no recorded hold holds now, and how long since one last did
/// (since the run began, for a name never held).
fn free_names(history: &History, names: &[String]) -> Vec<(String, Duration)> {
    let now = history.since_origin(Instant::now());
    names
        .iter()
        .filter_map(|name| {
            let free_since = history.free_since(name)?;
            Some((name.clone(), now.saturating_sub(free_since)))
        })
        .collect()
}

/// `port: free`, `port: c1/2a3f x1 for 1.20 s`, or `port: error`.
fn describe(node: &NodeInspection, clients: &[(String, String)]) -> String {
    let port = node.node.rsplit(':').next().unwrap_or(&node.node);
    match &node.state {
        Ok(state) if state.holders.is_empty() => format!("{port}: free"),
        Ok(state) => {
            let holders: Vec<String> = state
                .holders
                .iter()
                .map(|h| {
                    let client = clients
                        .iter()
                        .find(|(id, _)| *id == h.client_id)
                        .map_or(h.client_id.as_str(), |(_, label)| label.as_str());
                    format!("{client}/{} x{}", h.owner, h.holds)
                })
                .collect();
            let ttl = state.ttl.map_or("no TTL".to_owned(), |t| {
                format!("for {:.2} s", t.as_secs_f64())
            });
            format!("{port}: {} {ttl}", holders.join(" + "))
        }
        Err(err) => format!("{port}: {err}"),
    }
}
