//! The book's memory: what it forgets, and what it keeps.

use super::*;

const FORGET: Duration = Duration::from_secs(4);

fn book() -> Arc<FenceBook> {
    Arc::new(FenceBook {
        forget_after: FORGET,
        ..FenceBook::default()
    })
}

/// Three nodes at ports nobody listens on: nothing here needs an answer.
fn nodes() -> Vec<Node> {
    (1..=3)
        .map(|port| Node::new(&format!("redis://127.0.0.1:{port}")).unwrap())
        .collect()
}

fn group(nodes: &[Node], name: &str) -> Group {
    Group::new(
        nodes
            .iter()
            .map(|node| Part::of(node.clone(), name))
            .collect(),
        2,
    )
}

/// Every node of `name`'s group shows `counter`.
fn seen_everywhere(book: &Arc<FenceBook>, nodes: &[Node], name: &str, counter: u64) {
    let group = group(nodes, name);
    for part in group.parts.iter() {
        assert!(book.observe(part, &group, Some(counter), Instant::now()));
    }
}

#[tokio::test(start_paused = true)]
async fn idle_names_are_forgotten_and_names_in_use_are_not() {
    let (book, nodes) = (book(), nodes());
    for i in 0..1000 {
        seen_everywhere(&book, &nodes, &format!("idle-{i}"), 7);
    }
    assert_eq!(book.remembered(), 3000);
    // A counter that went back awaits repair (which cannot reach the
    // nodes): it is kept however long that takes.
    seen_everywhere(&book, &nodes, "awaiting-repair", 9);
    let group = group(&nodes, "awaiting-repair");
    assert!(!book.observe(&group.parts[0], &group, Some(3), Instant::now()));
    tokio::time::advance(FORGET - Duration::from_secs(1)).await;
    seen_everywhere(&book, &nodes, "in-use", 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    book.forget_idle();
    assert!(!book.has_seen("idle-0"), "an idle name is forgotten");
    assert!(book.has_seen("in-use"), "a name used lately is not");
    assert!(!book.is_intact(&group.parts[0]), "a pending repair is not");
    // The awaiting-repair name's intact counters are idle: forgotten.
    assert_eq!(book.remembered(), 3 + 1);
    tokio::time::advance(FORGET).await;
    book.forget_idle();
    assert_eq!(book.remembered(), 1, "only the pending repair is left");
}

#[tokio::test(start_paused = true)]
async fn dropped_nodes_are_forgotten_with_their_names() {
    let (book, nodes) = (book(), nodes());
    seen_everywhere(&book, &nodes, "a", 1);
    let group = group(&nodes, "a");
    assert!(!book.observe(&group.parts[0], &group, None, Instant::now()));
    let weak: Vec<WeakNode> = nodes.iter().map(Node::downgrade).collect();
    drop((nodes, group));
    // The book holds no node: the repair task lets go of them too.
    eventually_none(&weak).await;
    tokio::time::advance(FORGET).await;
    book.forget_idle();
    assert_eq!(book.remembered(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_pending_repair_of_a_lock_with_a_dropped_node_is_let_go() {
    let (book, mut nodes) = (book(), nodes());
    seen_everywhere(&book, &nodes, "a", 1);
    let group = group(&nodes, "a");
    assert!(!book.observe(&group.parts[0], &group, None, Instant::now()));
    drop(group);
    let dropped = nodes.pop().unwrap().downgrade();
    // The repair task, failing to reach the nodes, holds none between
    // its tries.
    eventually_none(&[dropped]).await;
    assert!(book.unrepaired(&nodes[0]).is_empty());
    assert!(book.is_intact(&Part::of(nodes[0].clone(), "a")));
    assert_eq!(book.remembered(), 2, "node 0's pending repair is let go");
}

/// Polls (on paused time) until every node is gone.
async fn eventually_none(nodes: &[WeakNode]) {
    for _ in 0..100 {
        if nodes.iter().all(|node| node.upgrade().is_none()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("a node is still held");
}
